"""The stage table's rows: every stage kept, repeated calls of one callable folded into one row.

A per-layer algorithm calls a method hundreds of times (`SparseGPT.add_batch#1` ...
`#448`). Calls with the same fold key under the same folded parent are one row: the key is
the staged callable (`call.target`), else the stage name without its trailing `#n`; the
folded parent path folds the parents the same way, so the calls of `add_batch` inside every
call of `prune_layer` are one row under `prune_layer`'s row. A row says how many calls it
holds, their total time, the highest RSS and live-tensor peaks and which call had each. A
single call stays a plain row. Unstaged intervals (auditor.analysis.run.unstaged) become rows of
their own under the row of their parent.

    for row in stage_rows(record, unstaged=notable(record)):
        row.depth, row.label, row.count, row.duration, row.rss_peak, row.rss_peak_at, ...
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from auditor.analysis.run.stages import meter
from auditor.analysis.run.unstaged import describe
from auditor.record.schema import Call, RunRecord, Stage, Unstaged

_CALL_NUMBER = re.compile(r"#\d+$")


def _call(stage: Stage) -> Call:
    """The stage's staged-call fields (none set for a stage that was not a staged call)."""
    return stage.call if stage.call is not None else Call()


def fold_key(stage: Stage) -> str:
    """What makes calls one row: the staged callable, else the name without `#n`."""
    return _call(stage).target or _CALL_NUMBER.sub("", stage.name)


def call_name(stage: Stage) -> str:
    """Which call a stage was, for a reader: its label and number, else its name."""
    call = _call(stage)
    if call.label:
        return f"{call.label} (call {call.index})" if call.index else str(call.label)
    return stage.name


@dataclass
class StageRow:
    kind: str                    # "stage" (one call), "folded" (several), "unstaged"
    key: str                     # the folded path (unstaged: "(unstaged) ..." under it)
    label: str                   # the name shown (a folded row: the fold key)
    depth: int
    stages: list[Stage] = field(default_factory=list)  # the calls, in start order
    interval: Unstaged | None = None                   # kind "unstaged"
    children: list[StageRow] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.stages)

    @property
    def entries(self) -> Sequence[Stage | Unstaged]:
        return [self.interval] if self.interval is not None else self.stages

    @property
    def start_s(self) -> float:
        return min(e.start_s for e in self.entries)

    @property
    def duration(self) -> float | None:
        times = [e.end_s - e.start_s for e in self.entries if e.end_s is not None]
        return sum(times) if times else None

    @property
    def statuses(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for s in self.stages:
            counts[s.status] = counts.get(s.status, 0) + 1
        return counts

    def reading(self, key: str, field_: str) -> int | None:
        """`rss`/`live_tensors` start of the first entry, end of the last."""
        entries = self.entries if field_ == "start" else [e for e in self.entries if e.end_s is not None]
        if not entries:
            return None
        reading = meter(entries[0] if field_ == "start" else entries[-1], key)
        return getattr(reading, field_) if reading is not None else None

    def highest(self, key: str) -> tuple[int | None, Stage | Unstaged | None]:
        """The highest `key` peak (rss / live_tensors) among the entries, and the entry holding it."""
        best: tuple[int | None, Stage | Unstaged | None] = (None, None)
        for entry in self.entries:
            reading = meter(entry, key)
            value = reading.peak if reading is not None else None
            if value is not None and (best[0] is None or value > best[0]):
                best = (value, entry)
        return best

    def largest_rise(self) -> int | None:
        """The largest peak - start of any entry."""
        rises = [e.rss.peak - e.rss.start for e in self.entries
                 if e.rss.peak is not None and e.rss.start is not None]
        return max(rises) if rises else None


def stage_rows(record: RunRecord, unstaged: Sequence[Unstaged] = ()) -> list[StageRow]:
    """The rows in reading order (a parent before its children, siblings by first start)."""
    folded: dict[str, str] = {}     # stage path -> folded path
    rows: dict[str, StageRow] = {}
    top: list[StageRow] = []
    for stage in record.stages:  # start order: a parent comes before its children
        parent = folded.get(stage.parent) if stage.parent is not None else None
        key = (parent + "/" if parent is not None else "") + fold_key(stage)
        folded[stage.path] = key
        row = rows.get(key)
        if row is None:
            depth = rows[parent].depth + 1 if parent in rows else 0
            row = rows[key] = StageRow("stage", key, fold_key(stage), depth)
            (rows[parent].children if parent in rows else top).append(row)
        row.stages.append(stage)
    for row in rows.values():
        if row.count > 1:
            row.kind = "folded"
        else:
            row.label = row.stages[0].name
    for item in unstaged:
        parent = folded.get(item.parent) if item.parent is not None else None
        depth = rows[parent].depth + 1 if parent in rows else 0
        row = StageRow("unstaged", f"{parent or ''}/(unstaged) {item.start_s}",
                       f"(unstaged) {describe(item)}", depth, interval=item)
        (rows[parent].children if parent in rows else top).append(row)
    ordered: list[StageRow] = []
    _walk(top, ordered)
    return ordered


def _walk(rows: list[StageRow], out: list[StageRow]) -> None:
    """Depth first, siblings by first start; a stack, not recursion: a tree of any depth."""
    pending = sorted(rows, key=lambda r: r.start_s)[::-1]
    while pending:
        row = pending.pop()
        out.append(row)
        pending += sorted(row.children, key=lambda r: r.start_s)[::-1]


def holds(row: StageRow, record: RunRecord) -> bool:
    """Whether the row holds the run's peak: its stage (id, else path), or its interval."""
    peak = record.peak
    where = peak.where
    if row.kind == "unstaged":
        interval = row.interval
        place = (interval.parent, interval.after, interval.before) if interval is not None else (None, None, None)
        return (where is not None and where.kind == "unstaged"
                and place == (where.parent, where.after, where.before)
                and (interval.rss.peak if interval is not None else None) == peak.rss)
    if where is not None and where.kind == "unstaged":
        return False
    if peak.stage_id is not None:
        return any(s.id == peak.stage_id for s in row.stages)
    return any(s.path == peak.stage for s in row.stages)


def limit(rows: list[StageRow], most: int, record: RunRecord) -> tuple[list[StageRow], list[StageRow]]:
    """At most `most` rows (kept, left out): the row holding the run's peak with its parents,
    then the shallowest rows first (top level before what runs inside), the highest RSS peaks
    first within a depth, each with its parents; in reading order."""
    if len(rows) <= most:
        return rows, []
    parent_of: dict[int, StageRow | None] = {}
    stack: list[StageRow] = []
    for row in rows:
        del stack[row.depth:]
        parent_of[id(row)] = stack[-1] if stack else None
        stack.append(row)
    keep: set[int] = set()

    def take(row: StageRow) -> None:
        at: StageRow | None = row
        while at is not None and id(at) not in keep:
            keep.add(id(at))
            at = parent_of[id(at)]

    for row in rows:
        if holds(row, record):
            take(row)
    ranked = sorted(rows, key=lambda r: (r.depth, -(r.highest("rss")[0] or 0)))
    for row in ranked:
        if len(keep) + row.depth >= most:  # room for the row and its parents
            continue
        take(row)
    kept = [r for r in rows if id(r) in keep]
    return kept, [r for r in rows if id(r) not in keep]


def top_live_peaks(record: RunRecord, n: int) -> list[Stage]:
    """The `n` stages with the highest live-tensor peaks that carry `at_peak`, one per row of
    the stage table (the call with the highest peak of a folded row). A parent whose peak is
    its child's (the same moment) gives way to the child, which says more precisely where."""
    candidates: list[tuple[int, Stage]] = []  # (its live-tensor peak, the stage)
    for row in stage_rows(record):
        value, stage = row.highest("live_tensors")  # rows without intervals: a stage
        if (value is not None and isinstance(stage, Stage) and stage.live_tensors is not None
                and stage.live_tensors.at_peak is not None):
            candidates.append((value, stage))
    candidates.sort(key=lambda vs: (-vs[0], -vs[1].path.count("/")))
    chosen: list[tuple[int, Stage]] = []
    for value, stage in candidates:
        if any(c_value == value and c.path.startswith(stage.path + "/") for c_value, c in chosen):
            continue
        chosen.append((value, stage))
    return [stage for _, stage in chosen[:n]]
