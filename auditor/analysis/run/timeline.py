"""The run as a timeline: RSS readings in time order, each stage's peak placed inside it.

A stage's peak is known exactly but not *when* inside the stage it happened. It is placed
where nothing more specific explains it: a stage whose peak equals a child's peak is shown
by the child's marker; otherwise the marker sits at the middle of the longest stretch of
the stage that no child covers (the whole stage when it has no children). So every marker
lies inside its stage interval and the line never shows a peak inside a child that the
child's own readings contradict.

Series, all (seconds since the audit began, bytes):
    rss            process start, stage start and end readings, marks, peaks above both
                   boundary readings, process end
    live_tensors   the live-tensor meter's start, end and peak per stage, when present
    memray         memray's own RSS snapshots (record `memray.snapshots`, a field this record
                   version does not know: kept in `memray.extra_fields`), when present

Stages as spans: `spans` the top-level ones, `nested` the others with their depth (1: a child of
a top-level stage), so a plot can draw a row per depth. `compositions`: each innermost stage's
live tensors at its peak by category, for records without a census to stack.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from auditor.analysis.run.stages import ended, finished, meter
from auditor.record.schema import Readings, RunRecord, Stage, Unstaged


@dataclass
class Peak:
    t: float
    value: int
    stage: str


@dataclass
class Span:
    start: float
    end: float
    label: str
    status: str
    path: str = ""
    depth: int = 0           # 0: a top-level stage


@dataclass
class Composition:
    """What the live-tensor meter found alive at an innermost stage's peak, by category."""
    start: float
    end: float
    stage: str
    by_category: dict[str, int]


@dataclass
class Timeline:
    rss: list[tuple[float, int]] = field(default_factory=list)
    peaks: list[Peak] = field(default_factory=list)         # RSS peaks above both boundaries
    run_peak: Peak | None = None
    live_tensors: list[tuple[float, int]] = field(default_factory=list)
    memray: list[tuple[float, int]] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)         # top-level stages
    nested: list[Span] = field(default_factory=list)        # stages inside another, in start order
    compositions: list[Composition] = field(default_factory=list)  # innermost stages' at-peak tensors
    marks: list[tuple[float, str, int]] = field(default_factory=list)
    end_s: float = 0.0


def timeline(record: RunRecord) -> Timeline:
    stages = finished(record)
    depth = _depths(stages)
    spans = [Span(s.start_s, ended(s), s.name, s.status, s.path, depth[s.path]) for s in stages]
    result = Timeline(spans=[s for s in spans if s.depth == 0], nested=[s for s in spans if s.depth > 0])
    process = record.process
    end_s = record.duration_s or max((ended(s) for s in stages), default=0.0)
    result.end_s = end_s
    if process.rss_at_start is not None:
        result.rss.append((0.0, process.rss_at_start))
    if process.rss_at_end is not None:
        result.rss.append((end_s, process.rss_at_end))
    children: dict[str, list[Stage]] = {}
    for entry in stages:
        if entry.parent is not None:
            children.setdefault(entry.parent, []).append(entry)
    run_peak = record.peak.rss
    threaded = len({s.thread for s in stages}) > 1
    if threaded:
        result.run_peak = _threaded_run_peak(record, stages)
    for entry in stages:
        start, end, peak = _readings(entry.rss)  # a finished stage has all three
        result.rss += [(entry.start_s, start), (ended(entry), end)]
        placed = _place(entry, "rss", children.get(entry.path, []))
        if placed is not None and threaded and _concurrent(entry, stages):
            placed = None  # a process-wide peak while other threads ran: when inside it, unknown
        if placed is not None:
            inside = peak > max(start, end)
            if inside:  # a boundary reading already shows a peak equal to it
                result.rss.append((placed, peak))
                result.peaks.append(Peak(placed, peak, entry.path))
            if peak == run_peak and result.run_peak is None:
                at = placed if inside else ended(entry) if end == peak else entry.start_s
                result.run_peak = Peak(at, peak, entry.path)
        live = entry.live_tensors
        if live is not None and live.start is not None and live.end is not None:
            result.live_tensors += [(entry.start_s, live.start), (ended(entry), live.end)]
            placed = _place(entry, "live_tensors", children.get(entry.path, []))
            if placed is not None and live.peak is not None and live.peak > max(live.start, live.end):
                result.live_tensors.append((placed, live.peak))
    for mark in record.marks:
        if mark.rss is not None and mark.t_s is not None:
            result.rss.append((mark.t_s, mark.rss))
            result.marks.append((mark.t_s, mark.name, mark.rss))
    result.memray = _memray_snapshots(record)
    result.compositions = [c for c in (_composition(s) for s in stages if s.path not in children) if c]
    result.rss.sort(key=lambda p: p[0])
    result.live_tensors.sort(key=lambda p: p[0])
    return result


def _concurrent(entry: Stage, stages: list[Stage]) -> bool:
    """Whether a stage on another thread ran during `entry` (the meters are the process's)."""
    start, end = entry.start_s, ended(entry)
    return any(s.thread != entry.thread and s.start_s < end and ended(s) > start for s in stages)


def _threaded_run_peak(record: RunRecord, stages: list[Stage]) -> Peak | None:
    """The run's peak where `peak.where` puts it (the report's one place for it), inside the
    time every stretch that reached it shares with that place: on several threads a stage's
    peak is the process's, reached while any of them ran."""
    where, value = record.peak.where, record.peak.rss
    if where is None or value is None:
        return None
    items: list[Stage | Unstaged] = [*stages, *(record.unstaged or [])]
    holders = [i for i in items if i.end_s is not None and i.rss.peak == value]
    found: list[Stage | Unstaged]
    if where.kind == "stage":
        found = [s for s in stages if s.path == where.stage and s.rss.peak == value]
        label = where.stage or ""
    else:
        found = [u for u in record.unstaged or [] if u.rss.peak == value and
                 (u.parent, u.after, u.before) == (where.parent, where.after, where.before)]
        label = where.parent or ""
    if not found:
        return None
    place = min(found, key=ended)
    start, end = place.start_s, ended(place)
    for other in holders:  # the peak was reached while each of these ran: narrow to what they share
        if other.start_s <= end and ended(other) >= start and max(start, other.start_s) <= min(end, ended(other)):
            start, end = max(start, other.start_s), min(end, ended(other))
    return Peak((start + end) / 2, value, label)


def _depths(stages: list[Stage]) -> dict[str, int]:
    """Each stage's nesting depth by its parent chain (a stage name may itself hold a `/`)."""
    parents = {s.path: s.parent for s in stages}
    depths: dict[str, int] = {}
    for path in parents:
        chain, at = 0, parents[path]
        while at is not None and chain < len(parents):
            chain, at = chain + 1, parents.get(at)
        depths[path] = chain
    return depths


def _composition(entry: Stage) -> Composition | None:
    live = entry.live_tensors
    if live is None or live.at_peak is None or not live.at_peak.rows:
        return None
    by_category: dict[str, int] = {}
    for row in live.at_peak.rows:
        by_category[row.category or "other"] = by_category.get(row.category or "other", 0) + row.bytes
    if live.at_peak.bytes_left_out:
        by_category["smaller rows"] = by_category.get("smaller rows", 0) + live.at_peak.bytes_left_out
    return Composition(entry.start_s, ended(entry), entry.path, by_category)


def _readings(rss: Readings) -> tuple[int, int, int]:
    """(start, end, peak) of a finished stage's RSS: the record has all three."""
    assert rss.start is not None and rss.end is not None and rss.peak is not None, "a finished stage's RSS"
    return rss.start, rss.end, rss.peak


def _place(entry: Stage, key: str, kids: list[Stage]) -> float | None:
    """Where to draw the stage's `key` peak; None if a child's marker already shows it."""
    peak = _peak(entry, key)
    if peak is None:
        return None
    if any(_peak(kid, key) == peak for kid in kids):
        return None
    start, end = entry.start_s, ended(entry)
    gaps, cursor = [], start
    for kid in sorted(kids, key=lambda k: k.start_s):
        if kid.start_s > cursor:
            gaps.append((cursor, kid.start_s))
        cursor = max(cursor, ended(kid))
    if end > cursor:
        gaps.append((cursor, end))
    a, b = max(gaps, key=lambda g: g[1] - g[0]) if gaps else (start, end)
    return (a + b) / 2


def _peak(entry: Stage, key: str) -> int | None:
    reading = meter(entry, key)
    return reading.peak if reading is not None else None


def _memray_snapshots(record: RunRecord) -> list[tuple[float, int]]:
    """`memray.snapshots` as [{t_s, rss}] or [[t_s, rss, ...]]; anything else is ignored."""
    points = []
    for item in ((record.memray.extra_fields.get("snapshots") if record.memray else None) or []):
        if isinstance(item, dict) and item.get("t_s") is not None and item.get("rss") is not None:
            points.append((float(item["t_s"]), int(item["rss"])))
        elif isinstance(item, (list, tuple)) and len(item) >= 2:
            points.append((float(item[0]), int(item[1])))
    return sorted(points)
