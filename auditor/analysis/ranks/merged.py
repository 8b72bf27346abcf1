"""One view of a multi-rank run: each rank's record (RUN/rank-N/, auditor.capture.ranks) merged.

    merged = merge_ranks("runs/ranks")   # a MergedRanks: what the merged report says
    merged.stages         stage rows, each with every rank's RSS and live-tensor peak
    merged.peak           the rank and stage of the highest RSS of any rank
    merged.imbalance      across ranks: max/min and spread of the run's peaks

auditor.renderers.ranks_markdown only formats it.

A rank that was killed has no run.json: its record is assembled from its event log, as
`auditor report` does for any unfinished run, and marked unfinished here; its peaks are what it
reached before it stopped (lower bounds), and each spread over the ranks says which of its
figures are such. A rank folder with no readable record at all (an empty event log: killed at
start) is listed with why, and the other ranks are merged without it.

Each rank's peaks are its whole run's, placed as its own report places them: the RSS peak by
`unstaged.peak_place`, the live-tensor peak by `components.live_tensor_high` (stages and the
time no stage covers alike).

Communication buffers, counted by kind where they are alive at a stage's live-tensor peak,
among the rows that peak keeps: the buffers a library allocates for its collectives, named by
the library call that made them (auditor.facts.communication_buffers: DDP's gradient buckets, FSDP2's
all-gather and reduce-scatter buffers, DTensor's redistributions, functional collectives), and
the storages a c10d operator creates itself that no such call names (`COLLECTIVE_OUTPUTS`: the
live-tensor meter names the operator that created each storage). Each storage counts once, under
one kind. An in-place collective (`dist.all_reduce(t)`) creates no storage, a buffer the program
allocated for a collective is the program's own tensor (named by the line that allocated it),
and a backend's own memory (gloo's, NCCL's) is no tensor: only RSS shows it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from auditor.analysis.run.live_tensor_peak import live_tensor_high, live_tensor_peak
from auditor.analysis.run.source_paths import code_root, shown_command
from auditor.analysis.run.unstaged import peak_place
from auditor.facts.allocation_sites import communication_buffer
from auditor.record import launches
from auditor.record.run_folder import EVENTS_FILE, RUN_FILE, RunRecordError, load, rank_folder_name, rank_folders
from auditor.record.schema import AtPeak, Children, RunRecord, Stage

COLLECTIVE_OPS = ("c10d::", "_c10d_functional::", "c10d_functional::")
# The AsyncCollectiveTensor a functional collective returns wraps the collective's output: its
# storage has a size but no memory of its own (no data pointer), yet the live-tensor meter
# counts it. Left out of the buffers, and its bytes named apart.
COLLECTIVE_WRAPPERS = ("_c10d_functional::_wrap_tensor_autograd", "c10d_functional::_wrap_tensor_autograd")
COLLECTIVE_OUTPUTS = "collective outputs"  # a c10d operator's own storages that no library call names


def is_multi_rank(folder: str | os.PathLike) -> bool:
    """A folder holding ranks' records and no single-process record of its own but their
    launcher's (a script whose torch.multiprocessing workers `auditor run` audited)."""
    folder = Path(folder)
    if not folder.is_dir() or not rank_folders(folder):
        return False
    return not (folder / EVENTS_FILE).exists() or launcher(folder) is not None


@dataclass(frozen=True)
class Spawn:
    """One torch.multiprocessing spawn of an audited script (its record's `spawned`)."""
    folder: str | None       # its ranks' folder, relative to the run folder; None: not audited
    nprocs: int | None
    start_method: str | None


def spawns(record: RunRecord) -> list[Spawn]:
    """The spawns the record's process started (auditor.capture.staging.spawned_ranks), in order."""
    return [Spawn(entry.get("folder") if entry.get("audited") else None, entry.get("nprocs"),
                  entry.get("start_method"))
            for entry in record.annotations.get("spawned") or [] if isinstance(entry, dict)]


def launcher(folder: str | os.PathLike) -> Launcher | None:
    """The record in the ranks' folder of the process that spawned them (auditor.capture.staging.spawned_ranks),
    or None: no record there, or one that spawned no ranks into this folder."""
    try:
        record = load(folder, from_events=True)
    except RunRecordError:
        return None
    here = next((spawn for spawn in spawns(record) if spawn.folder == "."), None)
    if here is None:
        return None
    return Launcher(record=str(Path(folder) / RUN_FILE), rss_peak=record.peak.rss,
                    rss_at_start=record.process.rss_at_start, start_method=here.start_method,
                    finished=record.exit is not None)


def load_ranks(folder: str | os.PathLike) -> dict[int, RunRecord]:
    """Each rank's record, by rank (RunRecordError naming the rank folder if one is unreadable,
    or if the records are not of one launch)."""
    records, unreadable = read_ranks(folder)
    if unreadable:
        rank, (error, _) = min(unreadable.items())
        raise RunRecordError(f"rank {rank}: {error}")
    return records


def not_one_launch(records: dict[int, RunRecord]) -> str | None:
    """Why the records in a folder's rank-N subfolders are not the ranks of one launch, or None:
    each must name its rank (the folder's N) and agree with the others on the world size and the
    launch (auditor.record.launches). Folders named rank-N alone say nothing: two unrelated runs
    copied there would otherwise pass for one run's ranks, their difference for an imbalance."""
    for rank, record in sorted(records.items()):
        if record.rank is None:
            return f"{rank_folder_name(rank)}/ holds the record of a run that was no rank of a distributed job"
        if record.rank.rank != rank:
            return f"{rank_folder_name(rank)}/ holds the record of rank {record.rank.rank}"
        world = record.rank.world_size
        if isinstance(world, int) and not 0 <= rank < world:  # a leftover of a larger launch, or a copy
            return f"{rank_folder_name(rank)}/ holds rank {rank} of a world of {world}, which has no such rank"
    (first, record), *others = sorted(records.items())
    for rank, other in others:
        why = launches.conflict(_identity(record), _identity(other))
        if why:
            return (f"{rank_folder_name(first)}/ and {rank_folder_name(rank)}/ hold ranks of different "
                    f"launches ({why})")
    return None


def _identity(record: RunRecord) -> dict:
    return record.rank.to_json() if record.rank is not None else {}


def read_ranks(folder: str | os.PathLike) -> tuple[dict[int, RunRecord], dict[int, tuple[str, str]]]:
    """Each readable rank's record, by rank, and the ranks whose folder holds none:
    rank -> (the loader's error, why in words without the machine's folders). RunRecordError
    (one line) when the readable records are not the ranks of one launch (`not_one_launch`)."""
    records, unreadable = {}, {}
    for rank in rank_folders(folder):
        where = Path(folder) / rank_folder_name(rank)
        try:
            records[rank] = load(where, from_events=True)
        except RunRecordError as error:
            unreadable[rank] = (str(error), _why_unreadable(where, str(error)))
    why = not_one_launch(records) if records else None
    if why:
        raise RunRecordError(f"{str(folder)!r} is no run of several ranks: {why}")
    return records, unreadable


def _why_unreadable(where: Path, error: str) -> str:
    events = where / EVENTS_FILE
    if not (where / RUN_FILE).exists() and events.is_file() \
            and events.stat().st_size < 4096 and not events.read_bytes().strip():
        return (f"its event log `{where.name}/{EVENTS_FILE}` is empty: the rank stopped (was killed?) "
                "before it wrote its first event")
    return error.replace(str(where), where.name)


# -- the model -----------------------------------------------------------------------------

@dataclass
class Spread:
    """One figure over the ranks that have it: the highest and the lowest, and which ranks."""
    max: int
    max_rank: int
    min: int
    min_rank: int
    ratio: float | None    # max / min; None when min is 0
    spread: int            # max - min
    ranks: int             # ranks with a value
    partial: list[int] = field(default_factory=list)  # ranks whose value is what an unfinished
    #                        rank reached before it stopped: a lower bound, not its final figure


@dataclass
class RankSummary:
    """One rank's run: who it was (None: its record lacks its identity) and its peaks."""
    rank: int
    world_size: int | None
    local_rank: int | None
    host: str | None
    backend: str | None
    source: str | None             # where its identity was read (auditor.capture.ranks)
    status: str                    # its exit status, "unknown" when the record has none
    finished: bool                 # False: killed, rendered from its event log
    rss_peak: int | None
    rss_peak_stage: str | None
    rss_peak_place: str            # where in the run, as the single-run report words it (auditor.analysis.run.unstaged)
    rss_peak_in_stage: str | None  # the stage whose own time holds it; None: time no stage covers, or unknown
    live_peak: int | None          # the run's highest live-tensor reading, stages and unstaged time alike
    live_peak_stage: str | None    # the stage holding it; None: time no stage covers (or no meter)
    live_peak_place: str | None    # where, as the single-run report words it (components.live_tensor_high)
    rss_at_start: int | None
    duration_s: float | None
    open_stages: list[str]
    error: str | None = None       # the record's exit error (a failed rank's exception)
    children: Children | None = None  # its child processes' memory, outside its figures


@dataclass
class StageReading:
    """One rank's readings of a stage; a path entered several times keeps its highest."""
    rss_peak: int | None
    live_peak: int | None
    status: str                    # "open" or "failed" if any call was, else "ok"
    calls: int
    communication: int | None      # collective_bytes at the live-tensor peak; None: meter off
    wrappers: int | None           # the collectives' wrappers' bytes there, apart
    buffers: dict[str, int] = field(default_factory=dict)  # `communication` by kind (communication_kinds)


@dataclass
class MergedStage:
    """A stage path with every rank's readings side by side."""
    path: str
    ranks: dict[int, StageReading]   # by rank; a rank that never ran it is absent
    rss: Spread | None
    live: Spread | None


@dataclass
class GlobalPeak:
    bytes: int
    rank: int                      # a tie: the lowest rank
    stage: str | None              # None: outside every stage
    place: str | None = None       # its place in that rank's run, in words, as the rank's own report
    #                                says it (RSS: unstaged.peak_place; live: components.live_tensor_high)


@dataclass
class Imbalance:
    """The run's peaks across ranks."""
    rss: Spread | None
    live: Spread | None


@dataclass
class CollectiveBytes:
    stage: str
    rank: int
    bytes: int
    kinds: dict[str, int] = field(default_factory=dict)  # the bytes by kind (communication_kinds)


@dataclass
class Communication:
    metered: bool                  # some rank had the live-tensor meter on
    stages: list[CollectiveBytes]  # storages a collective created, alive at a stage's live peak
    wrappers: list[CollectiveBytes]  # the AsyncCollectiveTensor wrappers' bytes, left out of `stages`
    largest_wrapper: CollectiveBytes | None


@dataclass(frozen=True)
class Launcher:
    """The script's own process, which spawned the ranks (torch.multiprocessing)."""
    record: str                  # its run.json, which `auditor report` renders on its own
    rss_peak: int | None
    rss_at_start: int | None
    start_method: str | None
    finished: bool


@dataclass
class MergedRanks:
    """The merged report of a multi-rank run, in the report's order."""
    folder: str
    name: str | None               # the first record's run name and command (rank 0's from a folder),
    command: str | None            # the command as a run report shows it: no folders of the machine
    world_size: list[int]          # the world sizes the ranks' records give
    ranks: list[RankSummary]       # by rank
    unfinished: list[int]          # ranks killed before writing their record
    missing_ranks: list[int]       # ranks of the world size with no rank folder
    identity_sources: list[str]    # where the ranks' identities were read
    backends: list[str]            # process group backends
    stages: list[MergedStage]      # in the order they first ran
    peak: GlobalPeak | None        # the highest RSS of any rank
    live_peak: GlobalPeak | None   # the most live tensors of any rank
    imbalance: Imbalance
    communication: Communication
    unreadable: dict[int, str] = field(default_factory=dict)  # rank -> why its folder holds no readable record
    launcher: Launcher | None = None  # the process that spawned the ranks, where `auditor run` audited it


# -- building it ---------------------------------------------------------------------------

def merge_ranks(folder: str | os.PathLike) -> MergedRanks:
    """The merged report of the ranks' records; RunRecordError only when no rank's is readable."""
    records, unreadable = read_ranks(folder)
    if not records and unreadable:
        rank, (error, _) = min(unreadable.items())
        raise RunRecordError(f"rank {rank}: {error}")
    merged = merge(records, folder, {rank: why for rank, (_, why) in unreadable.items()})
    return replace(merged, launcher=launcher(folder))


def merge(records: dict[int, RunRecord], folder: str | os.PathLike = "",
          unreadable: dict[int, str] | None = None) -> MergedRanks:
    unreadable = dict(sorted((unreadable or {}).items()))
    ranks = [_rank_summary(rank, record) for rank, record in sorted(records.items())]
    stages = _stage_rows(records)
    world = {r.world_size for r in ranks if r.world_size is not None}
    expected = max(world) if world else len(ranks) + len(unreadable)
    unfinished = [r.rank for r in ranks if not r.finished]
    first = next(iter(records.values()), None)
    return MergedRanks(
        folder=str(folder), name=first.name if first else None,
        command=shown_command(first.command, code_root(first)) if first and first.command else None,
        world_size=sorted(world), ranks=ranks, unfinished=unfinished,
        missing_ranks=[n for n in range(expected) if n not in records and n not in unreadable],
        identity_sources=sorted({r.source for r in ranks if r.source}),
        backends=sorted({r.backend for r in ranks if r.backend}),
        stages=stages, peak=_global_rss_peak(ranks),
        live_peak=_global_live_peak(ranks),
        imbalance=Imbalance(spread({r.rank: r.rss_peak for r in ranks}, unfinished),
                            spread({r.rank: r.live_peak for r in ranks}, unfinished)),
        communication=_communication(stages, records), unreadable=unreadable)


def _rank_summary(rank: int, record: RunRecord) -> RankSummary:
    identity = record.rank  # None: a record without its rank's identity
    status = record.exit.status if record.exit is not None else None
    place = peak_place(record)
    high = live_tensor_high(record)  # as the rank's own report finds it
    in_stage = live_tensor_peak(record)
    live_stage = in_stage[1] if high is not None and in_stage is not None \
        and high == (in_stage[0], f"in stage `{in_stage[1]}`") else None
    return RankSummary(
        rank=rank, world_size=identity.world_size if identity else None,
        local_rank=identity.local_rank if identity else None, host=identity.host if identity else None,
        backend=identity.backend if identity else None, source=identity.source if identity else None,
        status=status or "unknown", finished=status != "unfinished",
        rss_peak=record.peak.rss, rss_peak_stage=record.peak.stage, rss_peak_place=place.phrase,
        rss_peak_in_stage=place.stage if place.kind == "stage" else None,
        live_peak=high[0] if high is not None else None, live_peak_stage=live_stage,
        live_peak_place=high[1] if high is not None else None,
        rss_at_start=record.process.rss_at_start, duration_s=record.duration_s,
        open_stages=[s.path for s in record.stages if s.status == "open"],
        error=record.exit.error if record.exit is not None and status != "unfinished" else None,
        children=record.process.children)


def _stage_rows(records: dict[int, RunRecord]) -> list[MergedStage]:
    """Stage paths in the order they first ran (rank 0's, then others' own), every rank's
    readings side by side; a path a rank entered several times keeps its highest."""
    readings: dict[str, dict[int, StageReading]] = {}
    for rank, record in sorted(records.items()):
        for stage in record.stages:
            row = readings.setdefault(stage.path, {})
            row[rank] = _highest(row.get(rank), _reading(stage))
    def open_on(row: dict[int, StageReading]) -> list[int]:  # never finished there: a lower bound
        return [r for r, v in row.items() if v.status == "open"]
    return [MergedStage(path, row, spread({r: v.rss_peak for r, v in row.items()}, open_on(row)),
                        spread({r: v.live_peak for r, v in row.items()}, open_on(row)))
            for path, row in readings.items()]


def _reading(stage: Stage) -> StageReading:
    live = stage.live_tensors
    at_peak = live.at_peak if live is not None else None
    return StageReading(rss_peak=stage.rss.peak, live_peak=live.peak if live is not None else None,
                        status=stage.status, calls=1, communication=collective_bytes(at_peak),
                        wrappers=collective_bytes(at_peak, COLLECTIVE_WRAPPERS),
                        buffers=communication_kinds(at_peak) or {})


def _highest(kept: StageReading | None, new: StageReading) -> StageReading:
    if kept is None:
        return new
    statuses = (kept.status, new.status)
    status = "open" if "open" in statuses else "failed" if "failed" in statuses else "ok"
    return replace(kept, rss_peak=_max(kept.rss_peak, new.rss_peak), live_peak=_max(kept.live_peak, new.live_peak),
                   communication=_max(kept.communication, new.communication),
                   wrappers=_max(kept.wrappers, new.wrappers), status=status, calls=kept.calls + 1,
                   buffers={kind: max(kept.buffers.get(kind, 0), new.buffers.get(kind, 0))
                            for kind in {**kept.buffers, **new.buffers}})


def _max(a: int | None, b: int | None) -> int | None:
    values = [v for v in (a, b) if v is not None]
    return max(values) if values else None


def collective_bytes(at_peak: AtPeak | None, ops: tuple[str, ...] = COLLECTIVE_OPS) -> int | None:
    """Bytes of communication buffers alive at a live-tensor peak (communication_kinds, summed);
    with `ops=COLLECTIVE_WRAPPERS`, the functional collectives' wrappers' alone. None: meter off."""
    if at_peak is None:
        return None
    if ops is not COLLECTIVE_OPS:
        return sum(row.bytes for row in at_peak.rows if (row.op or "").startswith(ops))
    return sum((communication_kinds(at_peak) or {}).values())


def communication_kinds(at_peak: AtPeak | None) -> dict[str, int] | None:
    """Bytes alive at a live-tensor peak by kind of communication buffer, largest first: what the
    library call that made a storage names it (auditor.facts.communication_buffers), else
    COLLECTIVE_OUTPUTS for a c10d operator's own storage; the wrappers functional collectives
    return (no memory of their own) left out. None: meter off."""
    if at_peak is None:
        return None
    found: dict[str, int] = {}
    for row in at_peak.rows:
        op = row.op or ""
        if op.startswith(COLLECTIVE_WRAPPERS):
            continue
        kind = communication_buffer(row.owner) or (COLLECTIVE_OUTPUTS if op.startswith(COLLECTIVE_OPS) else None)
        if kind is not None:
            found[kind] = found.get(kind, 0) + row.bytes
    return dict(sorted(found.items(), key=lambda item: -item[1]))


def spread(values: dict[int, int | None], partial: list[int] | tuple[int, ...] = ()) -> Spread | None:
    """max, min, max/min and max - min over the ranks that have a value, and which ranks;
    `partial`: ranks whose value is a lower bound (unfinished), named among those that have one."""
    known = {rank: value for rank, value in values.items() if value is not None}
    if not known:
        return None
    high = max(known, key=lambda rank: (known[rank], -rank))
    low = min(known, key=lambda rank: (known[rank], rank))
    return Spread(max=known[high], max_rank=high, min=known[low], min_rank=low,
                  ratio=known[high] / known[low] if known[low] else None,
                  spread=known[high] - known[low], ranks=len(known),
                  partial=sorted(rank for rank in known if rank in partial))


def _global_peak(peaks: list[tuple[int | None, int, str | None]]) -> GlobalPeak | None:
    """The highest of (bytes, rank, stage) over the ranks that have one; a tie: the lowest rank."""
    known = [(size, rank, stage) for size, rank, stage in peaks if size is not None]
    if not known:
        return None
    size, rank, stage = max(known, key=lambda peak: (peak[0], -peak[1]))
    return GlobalPeak(size, rank, stage)


def _global_rss_peak(ranks: list[RankSummary]) -> GlobalPeak | None:
    peak = _global_peak([(r.rss_peak, r.rank, r.rss_peak_stage) for r in ranks])
    if peak is None:
        return None
    return replace(peak, place=next(r.rss_peak_place for r in ranks if r.rank == peak.rank))


def _global_live_peak(ranks: list[RankSummary]) -> GlobalPeak | None:
    peak = _global_peak([(r.live_peak, r.rank, r.live_peak_stage) for r in ranks])
    if peak is None:
        return None
    return replace(peak, place=next(r.live_peak_place for r in ranks if r.rank == peak.rank))


def _metered(record: RunRecord) -> bool:
    """The live-tensor meter was on: the record's probes say so (older records: a stage has readings)."""
    probe = (record.probes or {}).get("live_tensors")
    if probe is not None:
        return probe.state == "on"
    return any(s.live_tensors is not None for s in record.stages)


def _communication(stages: list[MergedStage], records: dict[int, RunRecord]) -> Communication:
    seen = [CollectiveBytes(row.path, rank, reading.communication, reading.buffers) for row in stages
            for rank, reading in sorted(row.ranks.items()) if reading.communication]
    metered = any(_metered(record) for record in records.values()) or any(
        reading.communication is not None for row in stages for reading in row.ranks.values())
    wrapped = [CollectiveBytes(row.path, rank, reading.wrappers) for row in stages
               for rank, reading in sorted(row.ranks.items()) if reading.wrappers]
    return Communication(metered, seen, wrapped, max(wrapped, key=lambda e: e.bytes) if wrapped else None)
