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
    mark            {"mark": a point reading}
    warning         {"message": ...}
    run_finished    finished_at, duration_s, device, environment, process, probes, peak,
                    memray, exit, files, audit_overhead_s

The record (design.md's fields keep their meaning; added ones marked +):

    schema "auditor.run/1", name, command, started_at, +finished_at, +duration_s,
    device ("cpu" or "cuda:0 (name)"), +machine{platform, cpus, memory_total},
    environment{python, torch, transformers, threads}, +options{memray, tracemalloc, ...},
    process{+pid, rss_at_start, +rss_at_end},
    +probes{rss, python_heap, cuda, cuda_history, census, memray, torch_profiler:
            {state: on|off|absent|failed|pending, method?, reason?}},
    stages[{+id, name, path, parent, status ok|failed (|open: rebuilt, never finished),
            start_s, end_s, rss{start, end, peak}, py_heap{+start, end, peak} | null,
            cuda{+allocated_start, allocated_end, reserved_end, peak_allocated} | null,
            components{NAME: {category, bytes, +tensors}} | null, +tensors{live_bytes} | null,
            +thread, +error ("Type: message") | null, +memray_sites (the peak stage only)}],
    +marks[{name, stage (enclosing path | null), t_s, thread, rss, py_heap, cuda}],
    peak{rss, stage, +stage_id, +py_heap, +cuda_allocated},
    +memray{file, flamegraph, peak_memory, total_allocations, stage, stage_id,
            sites[{location "file:line", function, code (the source line), bytes, allocations, python_stack,
                   native_stack}]} | null,
    +exit{status ok|failed|interrupted|unfinished, code, error},
    +files{events, run, memray?, flamegraph?, cuda_history?, torch_profiler? (the
           torch.profiler trace, "profiler/HOST_PID.TIME.pt.trace.json": TensorBoard reads
           the profiler/ folder)}, +warnings[str],
    +audit_overhead_s{boundaries_s, census_s, finish_s}

Times are seconds since the audit began with census time left out; sizes are bytes. Marks
are a list of their own rather than zero-length stages, so stage analysis never filters.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

SCHEMA = "auditor.run/1"
EVENTS_FILE = "events.jsonl"
RUN_FILE = "run.json"
REQUIRED = ("schema", "name", "command", "started_at", "device", "environment", "process",
            "stages", "peak")
STAGE_REQUIRED = ("name", "path", "parent", "status", "start_s", "end_s", "rss")
# Written by the audit itself; `Audit.annotate` adds any other field (workload, result...).
RESERVED = set(REQUIRED) | {"marks", "warnings", "finished_at", "duration_s", "machine",
                            "options", "probes", "memray", "exit", "files", "audit_overhead_s"}


class RunRecordError(ValueError):
    """A run record that cannot be read: missing, truncated, not JSON, unknown schema."""


# -- writing -----------------------------------------------------------------------------

def check_run_folder(folder: str | os.PathLike) -> Path:
    """Raise ValueError (one line) unless a run can be written to `folder`; creates nothing."""
    folder = Path(folder)
    if folder.exists():
        if not folder.is_dir():
            raise ValueError(f"output folder {str(folder)!r} exists and is not a folder")
        for name in (EVENTS_FILE, RUN_FILE):
            if (folder / name).exists():
                raise ValueError(f"output folder {str(folder)!r} already holds a run record "
                                 f"({name}); choose a new --out")
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


class EventLog:
    """events.jsonl, append-only. `durable=True` fsyncs (stage ends, run start and end)."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / EVENTS_FILE
        self._file = open(self.path, "x", encoding="utf-8")

    def write(self, event: dict, durable: bool = False) -> None:
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._file.flush()  # in the page cache: survives the process being killed
        if durable:
            os.fsync(self._file.fileno())  # on disk: survives the machine going down

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def write_json_atomically(path: Path, data: dict) -> None:
    """Write to a temporary file and rename it over `path`: readers never see half a file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# -- assembling --------------------------------------------------------------------------

def assemble(events: list[dict]) -> dict:
    """The run record from its events; stages never finished are listed with status "open"."""
    if not events or events[0].get("event") != "run_started":
        raise RunRecordError("the event log does not begin with a run_started event")
    header = {k: v for k, v in events[0].items() if k != "event"}
    _check_schema(header.get("schema"), "event log")
    stages: dict[int, dict] = {}
    marks, warnings, finish, annotations = [], [], None, {}
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
    record = dict(header)
    record["stages"] = list(stages.values())
    record["marks"] = marks
    record["warnings"] = warnings
    record.update(annotations)
    if finish is None:
        return _unfinished(record)
    for key, value in finish.items():
        if key != "event":
            record[key] = value
    _attach_memray_sites(record)
    return record


def _open_entry(started: dict) -> dict:
    entry = dict(started)
    entry.update(status="open", end_s=None)
    entry["rss"] = {"start": started["rss"]["start"], "end": None, "peak": None}
    return entry


def _unfinished(record: dict) -> dict:
    finished = [s for s in record["stages"] if s["status"] != "open"]
    rss = max((s["rss"]["peak"] for s in finished), default=None)
    holder = peak_stage(finished, rss)
    record["peak"] = {"rss": rss, "stage": holder["path"] if holder else None,
                      "stage_id": holder["id"] if holder else None}
    record["exit"] = {"status": "unfinished", "code": None,
                      "error": "the event log ends before the run finished (process killed?)"}
    record.setdefault("memray", None)
    return record


def peak_stage(stages: list[dict], rss_peak: int | None) -> dict | None:
    """The deepest finished stage whose peak is the run's peak (the most specific holder)."""
    holders = [s for s in stages if s["status"] != "open" and s["rss"]["peak"] == rss_peak]
    if not holders:
        return None
    return max(holders, key=lambda s: (s["path"].count("/") + 1 if s["parent"] else 0, s["id"]))


def _attach_memray_sites(record: dict) -> None:
    memray = record.get("memray")
    if not memray or memray.get("stage_id") is None:
        return
    for entry in record["stages"]:
        if entry.get("id") == memray["stage_id"]:
            entry["memray_sites"] = memray.get("sites", [])


# -- reading -----------------------------------------------------------------------------

def load(path: str | os.PathLike) -> dict:
    """A run record from run.json or a run folder; RunRecordError (one line) if unreadable."""
    path = Path(path)
    if path.is_dir():
        if not (path / RUN_FILE).exists() and (path / EVENTS_FILE).exists():
            raise RunRecordError(f"{str(path)!r} has an event log but no {RUN_FILE} (the run did "
                                 f"not finish?); rebuild it with auditor.record.rebuild")
        path = path / RUN_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunRecordError(f"no run record at {str(path)!r}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise RunRecordError(f"cannot read run record {str(path)!r}: {error}") from None
    if not text.strip():
        raise RunRecordError(f"run record {str(path)!r} is empty")
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        what = "truncated" if error.pos >= len(text.rstrip()) else "not valid JSON"
        raise RunRecordError(f"run record {str(path)!r} is {what} ({error.msg} at line "
                             f"{error.lineno})") from None
    validate(record, str(path))
    return record


def validate(record, where: str = "run record") -> None:
    if not isinstance(record, dict):
        raise RunRecordError(f"{where}: expected a JSON object, found {type(record).__name__}")
    _check_schema(record.get("schema"), where)
    missing = [key for key in REQUIRED if key not in record]
    if missing:
        raise RunRecordError(f"{where}: missing field(s) {', '.join(missing)}")
    if not isinstance(record["stages"], list):
        raise RunRecordError(f"{where}: 'stages' is not a list")
    for index, entry in enumerate(record["stages"]):
        absent = [key for key in STAGE_REQUIRED if not isinstance(entry, dict) or key not in entry]
        if absent:
            raise RunRecordError(f"{where}: stage {index} lacks {', '.join(absent)}")


def _check_schema(schema, where: str) -> None:
    if schema != SCHEMA:
        raise RunRecordError(f"{where}: unknown schema {schema!r} (this auditor reads {SCHEMA!r})")


def read_events(folder: str | os.PathLike) -> list[dict]:
    """The events of a run folder; a last line cut short by a kill is dropped."""
    path = Path(folder) / EVENTS_FILE
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise RunRecordError(f"no event log at {str(path)!r}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise RunRecordError(f"cannot read event log {str(path)!r}: {error}") from None
    events = []
    for number, line in enumerate(lines, 1):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break  # the process died mid-write
            raise RunRecordError(f"event log {str(path)!r}: line {number} is not JSON") from None
    return events


def rebuild(folder: str | os.PathLike, write: bool = True) -> dict:
    """run.json reconstructed from events.jsonl (written into the folder unless write=False)."""
    record = assemble(read_events(folder))
    if write:
        write_json_atomically(Path(folder) / RUN_FILE, record)
    return record
