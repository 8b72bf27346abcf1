"""Reading a run folder's event log (events.jsonl, written by auditor.record.run_folder.EventLog).

One damaged line (a disk error, a hand edit, a copy cut short and appended to) costs that event,
never the whole log: it is skipped, and a warning event naming its line number takes its place,
so the record assembled from the log says so in its `warnings` (the report prints them) and the
commands that read a log repeat it on stderr (`damaged_lines`). A last line cut short is what a
process killed mid-write leaves: it is dropped without a warning. The first line is the run's
header (run_started): without it there is no record, and the log is refused.

The audit writing a log holds an exclusive flock on it until it closes it (or dies: the kernel
lets go), so `being_written` tells a folder whose run is still going from a killed one.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from auditor.facts import safe_files
from auditor.record.schema import RunRecordError

EVENTS_FILE = "events.jsonl"


def damaged_warning(number: int, why: str) -> str:
    return f"{EVENTS_FILE} line {number} is damaged ({why}) and was skipped: the record lacks that one event"


def read_events(folder: str | os.PathLike) -> list[dict]:
    """The events of a run folder, a damaged line replaced by a warning event saying so."""
    events, _ = read_event_log(folder)
    return events


def damaged_lines(folder: str | os.PathLike) -> list[str]:
    """The warnings for the damaged lines of a folder's event log (none if it cannot be read)."""
    try:
        return read_event_log(folder)[1]
    except RunRecordError:
        return []


def being_written(folder: str | os.PathLike) -> bool:
    """Whether a running audit still holds the folder's event log (auditor.record.run_folder.EventLog)."""
    try:
        fd = os.open(Path(folder) / EVENTS_FILE, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # a file system without flock: nothing can be told
        return False
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)  # its lock, if taken, goes with it
    return False


def read_event_log(folder: str | os.PathLike) -> tuple[list[dict], list[str]]:
    """(events, warnings about damaged lines); RunRecordError (one line) if there is no log to read."""
    path = Path(folder) / EVENTS_FILE
    try:
        lines = safe_files.read_file(path).removeprefix(b"\xef\xbb\xbf").splitlines()  # an editor's BOM
    except FileNotFoundError:
        raise RunRecordError(f"no event log at {str(path)!r}") from None
    except OSError as error:
        raise RunRecordError(f"cannot read event log {str(path)!r}: {error.strerror or error}") from None
    while lines and not lines[-1].strip():
        lines.pop()
    events: list[dict] = []
    warnings: list[str] = []
    for number, line in enumerate(lines, 1):
        event, why = _event(line)
        if event is not None:
            events.append(event)
        elif number == len(lines):
            break  # the process died mid-write
        elif number == 1:
            raise RunRecordError(f"event log {str(path)!r}: line 1 is {why}: the run's header is lost")
        else:
            warnings.append(damaged_warning(number, why))
            events.append({"event": "warning", "message": warnings[-1]})
    return events, warnings


def _event(line: bytes) -> tuple[dict | None, str]:
    try:
        event = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except json.JSONDecodeError:
        return None, "not JSON"
    if not isinstance(event, dict) or not isinstance(event.get("event"), str):
        return None, "not an event"
    return event, ""
