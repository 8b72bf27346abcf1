"""The run record: an append-only event log written as the run goes, and run.json.

A run folder holds `events.jsonl` (one JSON object a line, flushed as each stage opens and
fsynced as each stage closes) and, once the run has finished, `run.json`. run.json is
*defined* as `assemble(events)`: the live audit and `rebuild()` after a crash use the same
function, so a killed run gives the same record minus what never happened.

Events, in order:
    run_started     the header: schema, name, command, started_at, device, machine,
                    environment, process, probes
    stage_started   {"stage": the entry's fields known at its start}
    stage_finished  {"stage": the full entry}
    unstaged        {"unstaged": an interval no stage covered at its depth}, at its end
    unstaged_at_peak {"id", "at_peak"}: an unstaged interval's at_peak again, with the owners
                    of the census taken at the next stage end (the first one has none)
    mark            {"mark": a point reading}
    warning         {"message": ...}
    run_finished    finished_at, duration_s, device, environment, process, probes, peak,
                    memray, exit, files, event_log, audit_overhead_s
    artifacts       {"files": ..., "probes": ...}: optional files (flamegraph, profiler trace)
                    written after run.json, so a full disk costs them and not the record

Results derived from a finished run live in files of their own beside run.json
(`DERIVED_FILES`: `calibration.json`, the calibration runs' records; `projections.json`, the
projections to each target), never in it: run.json stays exactly `assemble(events)`, and each
derived file can be made again from it. `load` adds them to the record it returns.

A log that cannot be written (disk full) stops at its last whole line; the audit keeps its
events in memory, still writes run.json if it can, and says so in `event_log`.

What run.json holds, field by field and what each means: auditor.record.schema (the one
definition; design.md's fields keep their meaning there).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
from pathlib import Path

from auditor.facts import safe_files
from auditor.record import derived
from auditor.record.event_log import EVENTS_FILE, being_written, read_events  # noqa: F401 (re-exported)
from auditor.record.schema import SCHEMA, RunRecord, RunRecordError, check_schema  # noqa: F401 (re-exported)

RUN_FILE = "run.json"
# The probes' own files in a run folder (their probes write them; named here so the record's
# readers need no probe).
TRACE_FILE = "memray.bin"
FLAMEGRAPH_FILE = "memray-flamegraph.html"
HISTORY_FILE = "cuda_memory_snapshot.pickle"
DERIVED_FILES = {key: name for key, (name, _) in derived.FILES.items()}  # their types: auditor.record.derived
# Written by the audit itself (RunRecord's fields); `Audit.annotate` adds any other field
# (workload, result...), which the typed record keeps in `annotations`.
RESERVED = set(RunRecord.__dataclass_fields__)
RANK_PREFIX = "rank-"  # rank N of a distributed run writes into RUN/rank-N/ (auditor.capture.ranks)


# -- writing -----------------------------------------------------------------------------

def check_run_folder(folder: str | os.PathLike) -> Path:
    """Raise ValueError (one line) unless a run can be written to `folder`; creates nothing."""
    folder = Path(folder)
    long = next((part for part in folder.parts if len(os.fsencode(part)) > 255), None)
    if long is not None:  # any look at it would fail: File name too long
        raise ValueError(f"output folder {str(folder)[:60]!r}...: the name {long[:24]!r}... is "
                         f"{len(os.fsencode(long))} bytes, over the file system's 255; choose a shorter one")
    dangling = dangling_link(folder)
    if dangling:
        raise ValueError(f"output folder {dangling}")
    if folder.exists():
        if not folder.is_dir():
            raise ValueError(f"output folder {str(folder)!r} exists and is not a folder")
        for name in (EVENTS_FILE, RUN_FILE, TRACE_FILE, FLAMEGRAPH_FILE, HISTORY_FILE):
            if os.path.lexists(folder / name):  # a link planted there counts: never written through
                raise ValueError(f"output folder {str(folder)!r} already holds a run record "
                                 f"({name}); choose a new folder (--run-dir)")
        if rank_folders(folder):
            raise ValueError(f"output folder {str(folder)!r} already holds the records of a "
                             f"multi-rank run ({rank_folder_name(rank_folders(folder)[0])}/); "
                             "choose a new folder (--run-dir)")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ValueError(f"output folder {str(folder)!r} is not writable")
        return folder
    ancestor = folder.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"cannot create output folder {str(folder)!r}: "
                         f"{str(ancestor)!r} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"cannot create output folder {str(folder)!r}: "
                         f"{str(ancestor)!r} is not writable")
    return folder


def dangling_link(folder: str | os.PathLike) -> str | None:
    """"'runs/x' is a dangling symlink (to '...'); ..." when `folder` or a folder above it is a
    link to nothing (mkdir would fail, and be taken for another run's), else None."""
    folder = Path(folder)
    for link in (folder, *folder.parents):
        if link.is_symlink() and not link.exists():
            where = "" if link == folder else f": its folder {str(link)!r}"
            return (f"{str(folder)!r}{where} is a dangling symlink (to {os.readlink(link)!r}); remove it or "
                    f"choose another folder")
    return None


def rank_folder_name(rank: int) -> str:
    return f"{RANK_PREFIX}{rank}"


def rank_folders(folder: str | os.PathLike) -> list[int]:
    """The ranks whose record (an event log) is in `folder`'s rank-N subfolders, in order."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [int(path.name[len(RANK_PREFIX):]) for path in folder.iterdir()
             if path.name.startswith(RANK_PREFIX) and path.name[len(RANK_PREFIX):].isdigit()
             and (path / EVENTS_FILE).is_file()]
    return sorted(found)


class EventLog:
    """events.jsonl, append-only. `durable=True` fsyncs (stage ends, run start and end).

    Each line goes to the kernel in one unbuffered write, so it survives the process being
    killed. A write that fails (disk full, I/O error) never raises: the log cuts itself back
    to its last whole line, stops, and keeps the reason in `failure`; the audit goes on with
    its events in memory. Creating the file fails if the folder already has one (two runs
    never share a log)."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / EVENTS_FILE
        # created here (never a file or a link planted at its name), appended to unbuffered
        self._fd: int | None = safe_files.open_new(self.path, os.O_APPEND)
        with contextlib.suppress(OSError):  # readers see the run is still going (event_log.being_written)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._identity = file_identity(self._fd)
        self._size = 0
        self.lines = 0
        self.failure: str | None = None

    def write(self, event: dict, durable: bool = False) -> bool:
        """True once the line is in the log; False if the log has failed (now or before)."""
        line = (json.dumps(event, separators=(",", ":")) + "\n").encode("utf-8")
        if self.failure is not None or self._fd is None:
            return False
        try:
            if file_identity(self._fd) != self._identity:  # closed, its number now the program's
                raise OSError(errno.EBADF, "the program closed its file descriptor")
            try:
                self._append(self._fd, line)
            except OSError:
                raise
            except BaseException:  # Ctrl-C mid-write: the line is whole in the log, or not in it
                self._settle(self._fd, line)
                raise
            if durable:
                os.fsync(self._fd)  # on disk: survives the machine going down
        except OSError as error:
            self._fail(error)
            return False
        return True

    def _append(self, fd: int, line: bytes, start: int = 0) -> None:
        view = memoryview(line)[start:]
        while view:
            view = view[os.write(fd, view):]
        self._size, self.lines = self._size + len(line), self.lines + 1  # one statement: no signal between

    def _settle(self, fd: int, line: bytes) -> None:
        """After an exception (a Ctrl-C's KeyboardInterrupt) cut `_append` short: the file's
        size says how much of `line` got in. A part is completed, so every line stays whole
        and each line in the log is counted, as the record holds its event."""
        try:
            got = os.fstat(fd).st_size - self._size
            if 0 < got < len(line):
                self._append(fd, line, got)
            elif got >= len(line):
                self._size, self.lines = self._size + len(line), self.lines + 1
        except OSError as error:
            self._fail(error)

    def _fail(self, error: OSError) -> None:
        self.failure = f"{EVENTS_FILE} could not be written: {error.strerror or error}"
        if error.errno == errno.EBADF or self._fd is None:
            self._fd = None  # not ours any more: never written, truncated nor closed
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, self._size)  # no half line: readers see whole events only

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):  # nothing is lost: every line was written unbuffered
                fcntl.flock(fd, fcntl.LOCK_UN)  # also for a forked child that still holds the file
                os.close(fd)


def file_identity(fd: int) -> tuple[int, int]:
    """(device, inode) of an open file: a descriptor the program closed, whose number now
    names another file, no longer matches (OSError if it is closed)."""
    status = os.fstat(fd)
    return status.st_dev, status.st_ino


def write_json_atomically(path: Path, data: dict) -> None:
    """Write to a temporary file and rename it over `path` (auditor.facts.safe_files): readers
    never see half a file, a symlink planted at `path` is replaced, never written through, and a
    write that fails (disk full) leaves neither `path` changed nor the temporary file."""
    safe_files.write_json(path, data)


def record_files() -> tuple[str, ...]:
    """The names of a run folder's own files: an output given one of them would replace, or
    pass for, part of a run record."""
    return (RUN_FILE, EVENTS_FILE, TRACE_FILE, FLAMEGRAPH_FILE, HISTORY_FILE,
            *(name for name, _ in derived.FILES.values()))


def record_file_clash(out: str | os.PathLike) -> str | None:
    """Why writing `out` would replace part of a run record (one of `record_files()`, or a file
    the record in its folder names: a profiler trace, a job's own file), or None; the reason
    reads after the file's name ("OUT has the name of a run record's own file")."""
    out = Path(out)
    if out.name.casefold() in {name.casefold() for name in record_files()}:  # RUN.JSON is run.json on macOS
        return "has the name of a run record's own file"
    folder = out.parent
    named: dict = {}
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if (folder / RUN_FILE).is_file():
            named = json.loads(safe_files.read_file(folder / RUN_FILE).decode("utf-8")).get("files") or {}
        elif (folder / EVENTS_FILE).is_file():
            for event in read_events(folder):
                if event.get("event") in ("run_finished", "artifacts"):
                    named.update(event.get("files") or {})
    for name in named.values() if isinstance(named, dict) else ():
        if isinstance(name, str) and os.path.normpath(folder / name) == os.path.normpath(out):
            return f"is a file the run record in {str(folder)!r} holds"
    return None


# -- assembling --------------------------------------------------------------------------

def assemble(events: list[dict]) -> dict:
    """The run record from its events; stages never finished are listed with status "open"."""
    if not events or events[0].get("event") != "run_started":
        raise RunRecordError("the event log does not begin with a run_started event")
    header = {k: v for k, v in events[0].items() if k != "event"}
    check_schema(header.get("schema"), "event log")
    stages: dict[int, dict] = {}
    marks, warnings, finish, annotations, artifacts = [], [], None, {}, []
    for event in events[1:]:
        kind = event.get("event")
        if kind == "stage_started":
            stages[event["stage"]["id"]] = _open_entry(event["stage"])
        elif kind == "stage_finished":
            stages[event["stage"]["id"]] = event["stage"]
        elif kind == "mark":
            marks.append(event["mark"])
        elif kind == "warning":
            warnings.append(event["message"])
        elif kind == "annotation":
            annotations[event["key"]] = event["value"]
        elif kind == "run_finished":
            finish = event
        elif kind == "artifacts":
            artifacts.append(event)
    record = dict(header)
    record["stages"] = list(stages.values())
    record["unstaged"] = unstaged_items(events)
    record["marks"] = marks
    record["warnings"] = warnings
    record.update(annotations)
    if finish is None:
        return _unfinished(record)
    for key, value in finish.items():
        if key != "event":
            record[key] = value
    for event in artifacts:
        _add_artifacts(record, event)
    _attach_memray_sites(record)
    return record


def _add_artifacts(record: dict, event: dict) -> None:
    """Optional files written after the record (flamegraph, traces), and their probes' states."""
    files = event.get("files") or {}
    record.setdefault("files", {}).update(files)
    record.setdefault("probes", {}).update(event.get("probes") or {})
    if files.get("flamegraph") and record.get("memray"):
        record["memray"]["flamegraph"] = files["flamegraph"]


def _open_entry(started: dict) -> dict:
    entry = dict(started)
    entry.update(status="open", end_s=None)
    entry["rss"] = {"start": started["rss"]["start"], "end": None, "peak": None}
    return entry


def _unfinished(record: dict) -> dict:
    finished = [s for s in record["stages"] if s["status"] != "open"]
    rss = max((s["rss"]["peak"] for s in finished), default=None)
    where = locate_peak(finished, record["unstaged"], rss)
    holder = peak_stage(finished, rss, where)
    record["peak"] = {"rss": rss, "stage": holder["path"] if holder else None,
                      "stage_id": holder["id"] if holder else None, "where": where}
    record["exit"] = {"status": "unfinished", "code": None,
                      "error": "the event log ends before the run finished (the process was "
                               "killed, or the log could not be written)"}
    record.setdefault("memray", None)
    return record


def unstaged_items(events: list[dict]) -> list[dict]:
    """The record's `unstaged` list from the events: in time order, each with its latest at_peak."""
    items: dict[int, dict] = {}
    for event in events:
        kind = event.get("event")
        if kind == "unstaged":
            items[event["unstaged"]["id"]] = dict(event["unstaged"])
        elif kind == "unstaged_at_peak" and event["id"] in items:
            item = items[event["id"]]
            item["live_tensors"] = {**item["live_tensors"], "at_peak": event["at_peak"]}
    return sorted(items.values(), key=lambda item: (item["start_s"], item["id"]))


def locate_peak(stages: list[dict], unstaged: list[dict], rss_peak: int | None) -> dict | None:
    """`peak.where`: the first stretch of time to reach the run's RSS peak, a stage's own time
    or an unstaged interval; null for older records, which have no unstaged intervals.

    Of the finished stages and unstaged intervals whose peak equals it, the one that ended
    first, the deeper on a tie (a stage ends with or after everything inside it), so a stage
    found has no children before the peak. RSS rarely falls, so later stretches often equal
    the peak: `peak.stage` (`peak_stage`, the deepest and latest stage equal to it) can then
    name a later stage than `where`, which says where the peak was first reached."""
    holders: list[tuple[float, float, dict]] = [(s["end_s"], -_depth(s["path"]), s) for s in stages
               if s["status"] != "open" and s["rss"]["peak"] == rss_peak]
    holders += [(u["end_s"], -_depth(u["parent"]) - 0.5, u) for u in unstaged
                if u["rss"]["peak"] == rss_peak]
    if not unstaged or not holders:
        return None
    *_, first = min(holders, key=lambda holder: holder[:2])
    if "after" not in first:
        return {"kind": "stage", "stage": first["path"]}
    return {"kind": "unstaged", "parent": first["parent"], "after": first["after"],
            "before": first["before"]}


def _depth(path: str | None) -> int:
    return 0 if path is None else path.count("/") + 1


def peak_stage(stages: list[dict], rss_peak: int | None, where: dict | None = None) -> dict | None:
    """The stage `where` (`locate_peak`) names, where it names one: the report, the timeline and
    `peak.stage` then say one place (with stages on several threads, every stage running at the
    peak has it); else the deepest finished stage whose peak is the run's (the most specific holder)."""
    holders = [s for s in stages if s["status"] != "open" and s["rss"]["peak"] == rss_peak]
    if not holders:
        return None
    deepest = lambda s: (s["path"].count("/") + 1 if s["parent"] else 0, s["id"])  # noqa: E731
    if where is not None and where.get("kind") in ("stage", "unstaged"):
        # the stage `where` names; for unstaged time, the stage around it, else the stages just
        # before and after it on its thread (a peak at the boundary where one frees what the
        # other built). Never another thread's stage that merely ran then: with stages on
        # several threads they hold the process-wide peak too, and naming one says two places.
        path = where.get("stage") if where["kind"] == "stage" else where.get("parent")
        named = [s for s in holders if path is not None and s["path"] == path]
        if named:
            return min(named, key=lambda s: s["end_s"])
        if where["kind"] == "unstaged":
            beside = {where.get("after"), where.get("before")} - {None}
            return max((s for s in holders if s["path"] in beside), key=deepest, default=None)
    return max(holders, key=deepest)


def _attach_memray_sites(record: dict) -> None:
    memray = record.get("memray")
    if not memray or memray.get("stage_id") is None:
        return
    for entry in record["stages"]:
        if entry.get("id") == memray["stage_id"]:
            entry["memray_sites"] = memray.get("sites", [])


# -- reading -----------------------------------------------------------------------------

def load(path: str | os.PathLike, from_events: bool = False) -> RunRecord:
    """The typed run record from run.json or a run folder, with the derived results beside it;
    RunRecordError (one line) if unreadable.

    A folder (or its run.json) with an event log but no run.json is an error, unless
    `from_events`: then the record is assembled from the log, nothing written."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    if (path.is_dir() or path.name == RUN_FILE) and not (folder / RUN_FILE).exists() \
            and (folder / EVENTS_FILE).exists():
        if from_events:
            return with_derived(validate(assembled(folder), log_of(folder)), folder)
        raise RunRecordError(_no_run_json(folder))
    if path.is_dir():
        path = path / RUN_FILE
    try:
        text = safe_files.read_file(path).decode("utf-8")
    except FileNotFoundError:
        raise RunRecordError(f"no run record at {str(path)!r}") from None
    except (OSError, UnicodeDecodeError) as error:
        why = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise RunRecordError(f"cannot read run record {str(path)!r}: {why}{_rebuildable(path)}") from None
    if not text.strip():
        raise RunRecordError(f"run record {str(path)!r} is empty{_rebuildable(path)}")
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        what = "truncated" if error.pos >= len(text.rstrip()) else "not valid JSON"
        raise RunRecordError(f"run record {str(path)!r} is {what} ({error.msg} at line "
                             f"{error.lineno}){_rebuildable(path)}") from None
    return with_derived(validate(record, str(path)), path.parent)


def _rebuildable(path: Path) -> str:
    """How to have a damaged run.json again, when the event log it was made from is beside it."""
    if path.name != RUN_FILE or not (path.parent / EVENTS_FILE).is_file():
        return ""
    return f" (`auditor rebuild --force {shlex.quote(str(path.parent))}` writes it again from its {EVENTS_FILE})"


def write_derived(folder: str | os.PathLike, key: str, value) -> None:
    """A derived result (`DERIVED_FILES`' key) into its own file beside run.json, checked against
    its type first (auditor.record.derived): a result of the wrong shape is never written."""
    name, kind = derived.FILES[key]
    write_json_atomically(Path(folder) / name, derived.check(kind, value, f"{key} to write"))


def with_derived(record: RunRecord, folder: str | os.PathLike) -> RunRecord:
    """`record` with the derived results found beside it in its annotations (a field the record
    itself holds, as older records do, is kept); RunRecordError (one line) for one that cannot
    be read."""
    for key, (name, kind) in derived.FILES.items():
        path = Path(folder) / name
        if key in record.annotations:
            derived.check(kind, record.annotations[key], f"run record's {key}")
            continue
        if not path.exists():
            continue
        try:
            value = json.loads(safe_files.read_file(path).decode("utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            why = error.strerror if isinstance(error, OSError) and error.strerror else error
            raise RunRecordError(f"cannot read {str(path)!r}, derived from the run record: {why}") from None
        record.annotations[key] = derived.check(kind, value, str(path))
    return record


def _no_run_json(folder: Path) -> str:
    """Why a folder with an event log has no run.json: the run did not finish, or only the
    record could not be written."""
    try:
        events = read_events(folder)
    except RunRecordError as error:
        return f"{str(folder)!r} has an event log but no {RUN_FILE}, and the log cannot be read ({error})"
    if any(event.get("event") == "run_finished" for event in events):
        return (f"{str(folder)!r} has the event log of a finished run but no {RUN_FILE} (it could "
                f"not be written: disk full?); `auditor rebuild {folder}` writes it")
    return (f"{str(folder)!r} has an event log but no {RUN_FILE}: the run did not finish (killed "
            f"or interrupted?); `auditor report {folder}` renders it, `auditor rebuild {folder}` "
            f"writes {RUN_FILE}")


def log_of(folder: str | os.PathLike) -> str:
    """How errors name a run folder's event log."""
    return f"event log of {str(folder)!r}"


def assembled(folder: str | os.PathLike) -> dict:
    """The record of a run folder assembled from its event log (the JSON run.json would hold),
    its faults as one-line RunRecordErrors; nothing written. Not yet validated: `validate(record,
    log_of(folder))` checks it and gives it typed, once."""
    folder = Path(folder)
    events = read_events(folder)
    try:
        record = assemble(events)
        ending = record.get("exit")
        if isinstance(ending, dict) and ending.get("status") == "unfinished" and being_written(folder):
            ending["error"] = "the run is still going (an audit is writing its event log): this is its record so far"
    except RunRecordError as error:
        raise RunRecordError(f"{str(folder / EVENTS_FILE)!r}: {error}") from None
    except (KeyError, TypeError, AttributeError) as error:  # an event missing its fields
        raise RunRecordError(f"{log_of(folder)} is malformed "
                             f"({type(error).__name__}: {error})") from None
    return record


def validate(record, where: str = "run record") -> RunRecord:
    """The record typed (auditor.record.schema); RunRecordError (one line naming every field
    that is wrong) unless it has each field the audit writes, with the right type: renderers
    can then trust what they read."""
    return RunRecord.from_json(printable(record), where)


def printable(value):
    """`value` (a record's JSON) with every string made writable as UTF-8: a name taken from a
    file name that is not UTF-8 (`caf\xe9.py`, read by python as 'caf\udce9') is shown as
    `caf\udce9`, never passed on to fail in a report's file or plot. The record keeps it as it was."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {printable(key): printable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [printable(item) for item in value]
    return value


def rebuild(folder: str | os.PathLike, write: bool = True) -> dict:
    """run.json reconstructed from events.jsonl (written into the folder unless write=False;
    `auditor rebuild DIR` from the command line)."""
    record = assemble(read_events(folder))
    if write:
        write_json_atomically(Path(folder) / RUN_FILE, record)
    return record
