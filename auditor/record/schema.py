"""The run record as types: what run.json holds, read into dataclasses with every field checked.

    record = RunRecord.from_json(json.loads(text), where="run.json")   # RunRecordError if bad
    record.stages[0].rss.peak, record.peak.where, record.annotations["workload"]
    record.to_json() == json.loads(text)                               # nothing lost or added

auditor.record.run_folder keeps how a record is written (the event log) and assembled; this module says
what a record *is*, field by field, with each field's meaning: the one definition of the schema. Reading
checks every field against its type and collects every problem, each named by its path
(`stages[3].rss.peak should be a whole number of bytes, found str "12"`), so a hand-edited or
foreign file fails at load with all of its faults listed, never later in a renderer.

Fields the audit does not own (a job's `workload`, `result`, `traced`...: `Audit.annotate`) and
the derived results loaded beside run.json (`calibration`, `projections`) are kept as JSON in
`annotations`; a field of a known object that this version does not know is kept too
(`extra_fields`), so `to_json()` gives back exactly the JSON that was read, in its key order.

Versioned: `schema` names the record format ("auditor.run/1"). A record of another version is
refused with a one-line error that names both versions; a future format bump adds its reader
for the older version here (`READERS`), so old run folders stay readable.
"""
from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar, Union

SCHEMA = "auditor.run/1"
MAX_PROBLEMS = 8  # listed in the error; the rest are counted

# Value kinds, as the error messages name them.
Bytes = Annotated[int, "a whole number of bytes"]
Count = Annotated[int, "a whole number"]
Seconds = Annotated[float, "a number of seconds"]
JSON = Any  # kept as read: a job's own structure
Part = TypeVar("Part", bound="RecordPart")

INVALID: Any = type("Invalid", (), {"__repr__": lambda self: "<invalid>"})()  # a value read as wrong
_KEYS = "_json_keys"      # the keys read, in their order (None: made in code, all fields)
_EXTRA = "_extra_fields"  # keys this version does not know, kept for to_json


class RunRecordError(ValueError):
    """A run record that cannot be read: missing, truncated, not JSON, unknown schema, a field
    of the wrong type."""


_PARTS: set[type] = set()  # RecordPart's subclasses: to_json tells them by a type test, no call


class RecordPart:
    """Base of every record object: keeps the keys read and the ones unknown to this version."""
    _json_keys = None  # _KEYS, no annotation (no field, nothing read): set on a part read or written_as

    @property
    def extra_fields(self) -> dict[str, Any]:
        return getattr(self, _EXTRA, None) or {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _PARTS.add(cls)

    def to_json(self) -> dict:
        return _part_json(self)

    def __eq__(self, other: object) -> bool:
        """Equal when they write the same JSON: annotations and unknown fields count too."""
        return type(self) is type(other) and self.to_json() == other.to_json()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dicts it stands for

    def problems(self, where: str) -> list[str]:
        """What is wrong beyond each field's own type (`where`: this part's path and a dot)."""
        return []


# -- the record's parts ----------------------------------------------------------------------

@dataclass(kw_only=True, eq=False)
class Readings(RecordPart):
    """A meter over an interval (RSS, Python heap): at its start, its end, its highest."""
    start: Bytes | None = None
    end: Bytes | None = None
    peak: Bytes | None = None


@dataclass(kw_only=True, eq=False)
class CudaReadings(RecordPart):
    allocated_start: Bytes | None = None
    allocated_end: Bytes | None = None
    reserved_end: Bytes | None = None
    peak_allocated: Bytes | None = None


@dataclass(kw_only=True, eq=False)
class AtPeakRow(RecordPart):
    """Storages alive at a live-tensor peak, grouped by owner, category, origin and operator."""
    owner: str | None
    category: str
    created_in: str | None = None
    op: str | None = None
    bytes: Bytes
    tensors: Count
    alive_at_end: bool | None = None


@dataclass(kw_only=True, eq=False)
class AtPeak(RecordPart):
    """What was alive at the live-tensor high-water moment of a stage (the interval inside it
    that held its peak) or of an unstaged interval, largest rows first (at most 25). A storage
    alive at the end is matched to the census taken then; one the census cannot see (freed before
    the end, or held only outside Python) keeps the last component a census named it under while
    it was alive, else it has no owner: "activations and temporaries" if freed, "masks" or "other"
    if alive, "unknown (no census)" with the census off. `created_in`: the stage path that made it
    (None: before the audit or outside every stage); `op`: the operator (None: alive before the
    audit)."""
    bytes: Bytes
    rows: list[AtPeakRow]
    rows_left_out: Count = 0
    bytes_left_out: Bytes = 0


@dataclass(kw_only=True, eq=False)
class LiveTensors(Readings):
    allocator_threshold: Bytes | None = None
    # the most bytes of CPU storages served from glibc's heap alive at once, from the audit's
    # start to this reading (auditor.capture.probes.live_tensors)
    heap_high_water: Bytes | None = None
    at_peak: AtPeak | None = None


@dataclass(kw_only=True, eq=False)
class Component(RecordPart):
    category: str
    bytes: Bytes
    tensors: Count | None = None
    # provenance (auditor.capture.census.provenance), where the live-tensor meter saw copies of the weights made:
    # its bytes that are copies, the weights' bytes they hold the values of, parameter storages copied
    copy_bytes: Bytes | None = None
    weights_copied: Bytes | None = None
    parameters_copied: Count | None = None


@dataclass(kw_only=True, eq=False)
class TensorTotals(RecordPart):
    live_bytes: Bytes | None = None
    cycle_check: dict[str, JSON] | None = None


@dataclass(kw_only=True, eq=False)
class Call(RecordPart):
    """The staged call a stage was (auditor.capture.staging.targets): its callable, its number, its label."""
    target: str | None = None
    index: Count | None = None
    label: str | None = None
    recursed: Count | None = None  # calls of it nested at the deepest, its own the 1st: re-entered inside this stage


@dataclass(kw_only=True, eq=False)
class Site(RecordPart):
    """An allocation site of memray's peak snapshot."""
    location: str
    function: str | None = None
    code: str | None = None
    bytes: Bytes
    allocations: Count
    python_stack: list[str] = field(default_factory=list)
    native_stack: list[str] = field(default_factory=list)


@dataclass(kw_only=True, eq=False)
class Interval(RecordPart):
    """What a stage and an unstaged interval share: their time and their meters. Times are
    seconds since the audit began, the census's own time left out; sizes are bytes. Meters are
    process-wide: with stages on several threads, a stage's peak is the process's highest reading
    while it lasted, whichever thread caused it."""
    thread: str | None = None
    start_s: Seconds
    end_s: Seconds | None = None
    rss: Readings
    py_heap: Readings | None = None
    cuda: CudaReadings | None = None
    live_tensors: LiveTensors | None = None


STAGE_STATUSES = ("ok", "failed", "open")


@dataclass(kw_only=True, eq=False)
class Stage(Interval):
    id: Count | None = None
    name: str
    path: str
    parent: str | None
    status: Literal["ok", "failed", "open"]  # open: never finished (a record rebuilt after a crash)
    call: Call | None = None
    components: dict[str, Component] | None = None
    tensors: TensorTotals | None = None
    error: str | None = None           # "Type: message" for a failed stage
    memray_sites: list[Site] | None = None  # the peak stage only

    @property
    def finished(self) -> bool:
        return self.status != "open"

    def problems(self, where: str) -> list[str]:
        """A finished stage has its end readings; an open one (never finished) has nulls there."""
        if not self.finished:
            return []
        found = [] if self.end_s is INVALID or _is(self.end_s, float) else [f"{where}end_s should be a number of "
                                                                  f"seconds, found {_found(self.end_s)}"]
        for key in ("end", "peak"):
            value = getattr(self.rss, key, INVALID)
            if value is INVALID:  # already named as wrong
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                found.append(f"{where}rss.{key} should be a whole number of bytes, found {_found(value)}")
        return found


@dataclass(kw_only=True, eq=False)
class Unstaged(Interval):
    """Time on a thread between stage boundaries that no stage covers at that depth: before the
    first stage, between siblings, a parent's open to its first child, between children, the last
    child to the parent's close, the last top-level stage to the audit's end (on other threads
    than the audit's, from their first stage to their last). `after`: the sibling stage that just
    closed; `before`: the stage that opens next."""
    id: Count
    parent: str | None
    parent_id: Count | None = None
    after: str | None = None
    before: str | None = None


@dataclass(kw_only=True, eq=False)
class Mark(RecordPart):
    """A point reading (`auditor.mark`), kept apart from stages so stage analysis never filters."""
    name: str
    stage: str | None = None
    t_s: Seconds
    thread: str | None = None
    rss: Bytes | None = None
    py_heap: Bytes | None = None
    cuda: JSON = None


@dataclass(kw_only=True, eq=False)
class PeakPlace(RecordPart):
    """Where the run's RSS peak was first reached: a stage's own time or an unstaged interval."""
    kind: Literal["stage", "unstaged"]
    stage: str | None = None
    parent: str | None = None
    after: str | None = None
    before: str | None = None


@dataclass(kw_only=True, eq=False)
class Peak(RecordPart):
    rss: Bytes | None
    stage: str | None = None
    stage_id: Count | None = None
    where: PeakPlace | None = None
    py_heap: Bytes | None = None
    cuda_allocated: Bytes | None = None


@dataclass(kw_only=True, eq=False)
class Memray(RecordPart):
    file: str | None = None
    flamegraph: str | None = None
    peak_memory: Bytes | None = None
    total_allocations: Count | None = None
    auditor_bytes: Bytes | None = None
    stage: str | None = None
    stage_id: Count | None = None
    stage_basis: str | None = None
    at_s: Seconds | None = None
    sites: list[Site] = field(default_factory=list)


@dataclass(kw_only=True, eq=False)
class Exit(RecordPart):
    """How the run ended. interrupted: Ctrl-C, or a signal such as SIGTERM under `auditor run`,
    named in `error`, `code` 128 + the signal."""
    status: Literal["ok", "failed", "interrupted", "unfinished"]
    code: int | None = None
    error: str | None = None


@dataclass(kw_only=True, eq=False)
class EventLogState(RecordPart):
    """Whether events.jsonl holds every event (a full disk stops it at its last whole line)."""
    state: Literal["complete", "incomplete"]
    lines: Count | None = None   # written
    reason: str | None = None    # incomplete only


@dataclass(kw_only=True, eq=False)
class Rank(RecordPart):
    """The rank of a distributed run this record is (auditor.capture.ranks)."""
    rank: Count
    world_size: Count
    local_rank: Count | None = None
    host: str | None = None
    backend: str | None = None
    run_id: str | None = None
    source: str | None = None
    read_at: str | None = None


@dataclass(kw_only=True, eq=False)
class Environment(RecordPart):
    python: str | None = None
    torch: str | None = None
    transformers: str | None = None
    threads: Count | None = None
    # glibc malloc's settings from the environment (auditor.facts.allocator_retention.malloc_settings):
    # {} is glibc's defaults; None: not glibc, or a record from before it was kept
    malloc: dict[str, str] | None = None


@dataclass(kw_only=True, eq=False)
class Machine(RecordPart):
    platform: str | None = None
    cpus: Count | None = None
    memory_total: Bytes | None = None


@dataclass(kw_only=True, eq=False)
class ChildReading(RecordPart):
    """The running children at a top-level stage end (auditor.capture.probes.child_processes)."""
    stage: str
    at_s: Seconds
    alive: Count
    forked: Count | None = None  # of them, forked without exec (copy on write)
    rss: Bytes | None = None
    uss: Bytes | None = None     # their own pages; None: not readable


@dataclass(kw_only=True, eq=False)
class Children(RecordPart):
    """The audited process's child processes, never audited (auditor.capture.probes.child_processes)."""
    largest_ended_peak_rss: Bytes | None = None  # the largest that ended in the run: its peak
    alive_at_end: Count | None = None
    alive_rss_at_end: Bytes | None = None
    alive_uss_at_end: Bytes | None = None  # of it, their own pages (USS); None: not readable
    alive_forked_at_end: Count | None = None  # of them, forked without exec
    at_stage_ends: list[ChildReading] | None = None  # while a child ran; None: none did at one


@dataclass(kw_only=True, eq=False)
class Process(RecordPart):
    pid: Count | None = None
    rss_at_start: Bytes | None = None
    rss_at_end: Bytes | None = None
    cwd: str | None = None  # the working folder: report paths are shown from it
    children: Children | None = None  # absent: no child held memory the record can see


@dataclass(kw_only=True, eq=False)
class ProbeState(RecordPart):
    state: str  # on, off, absent, failed or pending
    method: str | None = None
    reason: str | None = None
    copies: str | None = None  # the live-tensor meter followed copies of the weights (how)


@dataclass(kw_only=True, eq=False)
class RunRecord(RecordPart):
    """run.json: `assemble(events)` (auditor.record.run_folder), plus what a job annotated."""
    schema: str                       # "auditor.run/1"
    name: str
    command: str
    started_at: str
    finished_at: str | None = None
    duration_s: Seconds | None = None
    device: str                       # "cpu" or "cuda:0 (its name)"
    machine: Machine | None = None
    environment: Environment
    options: dict[str, JSON] | None = None   # the audit's options (memray, tracemalloc, ...)
    process: Process
    probes: dict[str, ProbeState] | None = None  # rss, python_heap, cuda, cuda_history, census, memray, ...
    stages: list[Stage]               # in the order they opened
    unstaged: list[Unstaged] | None = None  # in time order
    marks: list[Mark] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    peak: Peak
    memray: Memray | None = None
    exit: Exit | None = None
    # the folder's files: events, run, and memray, flamegraph, cuda_history, torch_profiler where made
    # (the profiler's trace under profiler/, where TensorBoard reads it)
    files: dict[str, str] | None = None
    event_log: EventLogState | None = None
    audit_overhead_s: dict[str, Seconds] | None = None  # boundaries_s, census_s, finish_s
    rank: Rank | None = None          # a rank of a distributed run: its record is RUN/rank-N/

    @property
    def annotations(self) -> dict[str, Any]:
        """What the job added (`Audit.annotate`: workload, result...) and the derived results
        loaded beside run.json (calibration, projections), as JSON; add to it to annotate."""
        if getattr(self, _EXTRA, None) is None:
            object.__setattr__(self, _EXTRA, {})
        return getattr(self, _EXTRA)

    @classmethod
    def from_json(cls, value: Any, where: str = "run record") -> RunRecord:
        """The typed record; RunRecordError (one line) naming every field that is wrong."""
        if not isinstance(value, dict):
            raise RunRecordError(f"{where}: expected a JSON object, found {type(value).__name__}")
        check_schema(value.get("schema"), where)
        problems: list[str] = []
        record = _read(cls, value, "", problems)
        if problems:
            raise RunRecordError(f"{where}: {_listed(problems)}")
        assert isinstance(record, RunRecord)
        return record


def written_as(part: Part, keys: tuple[str, ...]) -> Part:
    """`part`, made in code (each field type-checked), written as `keys` in this order, nulls included
    (capture's event log order); a field set since to a value other than its default follows."""
    object.__setattr__(part, _KEYS, keys)
    return part


def check_schema(schema: Any, where: str) -> None:
    if schema != SCHEMA:
        raise RunRecordError(f"{where}: unknown schema {schema!r} (this auditor reads {SCHEMA!r})")


# -- reading: JSON -> types, every problem named by its path ----------------------------------

def _read(kind: Any, value: Any, path: str, problems: list[str]) -> Any:
    """`value` as `kind` (a type hint), or INVALID after adding what is wrong to `problems`."""
    words = None
    if typing.get_origin(kind) is Annotated:
        kind, words = typing.get_args(kind)[0], typing.get_args(kind)[1]
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        options = typing.get_args(kind)
        if value is None and type(None) in options:
            return None
        (kind,) = [option for option in options if option is not type(None)]
        return _read(kind, value, path, problems)
    if kind is Any:
        return value
    if origin is Literal:
        if value not in typing.get_args(kind):
            problems.append(f"{path} should be one of {', '.join(typing.get_args(kind))}, found {_found(value)}")
            return INVALID
        return value
    if origin is list:
        if not isinstance(value, list):
            return _wrong(path, "a list", value, problems)
        (item,) = typing.get_args(kind)
        return [_read(item, v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            return _wrong(path, "a JSON object", value, problems)
        item = typing.get_args(kind)[1]
        return {k: _read(item, v, f"{path}.{k}", problems) for k, v in value.items()}
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _read_part(kind, value, path, problems)
    if not _is(value, kind):
        return _wrong(path, words or _WORDS[kind], value, problems)
    return value


def _read_part(kind: type, value: Any, path: str, problems: list[str]) -> Any:
    if not isinstance(value, dict):
        return _wrong(path, "a JSON object", value, problems)
    hints = _hints(kind)
    prefix = f"{path}." if path else ""
    missing = [f.name for f in dataclasses.fields(kind) if f.name not in value and _required(f)]
    if missing:
        problems.append(f"{path} lacks {', '.join(missing)}" if path else f"missing field(s) {', '.join(missing)}")
        return INVALID
    known = {k: _read(hints[k], v, f"{prefix}{k}", problems) for k, v in value.items() if k in hints}
    part = kind(**known)
    object.__setattr__(part, _KEYS, list(value))
    problems.extend(part.problems(prefix))
    extra = {k: v for k, v in value.items() if k not in hints}
    if extra:
        object.__setattr__(part, _EXTRA, extra)
    return part


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(kind: type) -> dict[str, Any]:
    if kind not in _HINTS:
        _HINTS[kind] = typing.get_type_hints(kind, include_extras=True)
    return _HINTS[kind]


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


_WORDS = {str: "text", int: "a whole number", float: "a number", bool: "true or false"}


def _is(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


def _wrong(path: str, words: str, value: Any, problems: list[str]) -> Any:
    problems.append(f"{path} should be {words}, found {_found(value)}")
    return INVALID


def _found(value: Any) -> str:
    if value is None:
        return "null"
    text = json.dumps(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _listed(problems: list[str]) -> str:
    shown = "; ".join(problems[:MAX_PROBLEMS])
    more = len(problems) - MAX_PROBLEMS
    return shown + (f"; and {more} more" if more > 0 else "")


# -- writing: types -> JSON, as read ----------------------------------------------------------

_PLAIN = frozenset({str, int, float, bool, type(None)})  # written as they are


def _to_json(value: Any) -> Any:
    if type(value) in _PARTS:
        return _part_json(value)
    if isinstance(value, list):
        return [v if type(v) in _PLAIN else _to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: v if type(v) in _PLAIN else _to_json(v) for k, v in value.items()}
    return value


def _part_json(part: RecordPart) -> dict:
    """`_items` as JSON; without extra fields (what capture writes at stage ends), fast: by a kept layout."""
    values = part.__dict__
    if _EXTRA in values:
        return {key: item if type(item) in _PLAIN else _to_json(item) for key, item in _items(part)}
    read = part._json_keys  # a list when read from a file, kept by no layout
    layout = (type(part), read)
    keys, unread = _LAYOUTS[layout] if type(read) is not list and layout in _LAYOUTS else _layout(part, read)
    for name, default in unread:  # set since
        if values[name] != default:
            keys = [*keys, name]
    written = {}
    for key in keys:  # no comprehension: a call in Python 3.11
        written[key] = item if type(item := values[key]) in _PLAIN else _to_json(item)
    return written


def _layout(part: RecordPart, read: Sequence[str] | None) -> tuple[Sequence[str], list[tuple[str, Any]]]:
    """The keys written first (`read`, else required fields first) and the rest, with their defaults."""
    fields = {f.name: f for f in dataclasses.fields(part)}  # type: ignore[arg-type]
    if unknown := [key for key in read or () if key not in fields]:  # given to written_as (read ones are extra)
        raise TypeError(f"{type(part).__name__} has no field(s) {', '.join(unknown)}")
    required = [name for name in fields if _required(fields[name])]
    layout = ((required + [n for n in fields if n not in required], []) if read is None else
              (read, [(name, _default(f)) for name, f in fields.items() if name not in read]))
    if type(read) is not list:
        _LAYOUTS[type(part), read] = layout
    return layout


_LAYOUTS: dict[tuple[type, Sequence[str] | None], tuple[Sequence[str], list[tuple[str, Any]]]] = {}


def _items(part: RecordPart) -> list[tuple[str, Any]]:
    """A part's keys and values: those read, in their order, then what was set since (a field
    given a value other than its default, an annotation added)."""
    fields = {f.name: f for f in dataclasses.fields(part)}  # type: ignore[arg-type]
    extra = part.extra_fields
    read = getattr(part, _KEYS, None)
    keys = list(read) if read is not None else [n for n in fields if n in extra or _required(fields[n])]
    for name, f in fields.items():
        if name not in keys and (read is None or getattr(part, name) != _default(f)):
            keys.append(name)
    keys += [k for k in extra if k not in keys]
    return [(k, extra[k] if k in extra else getattr(part, k)) for k in keys]


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
