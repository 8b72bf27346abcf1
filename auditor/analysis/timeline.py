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
    memray         memray's own RSS snapshots (record `memray.snapshots`), when present
"""
from __future__ import annotations

from dataclasses import dataclass, field

from auditor.analysis.components import finished


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


@dataclass
class Timeline:
    rss: list[tuple[float, int]] = field(default_factory=list)
    peaks: list[Peak] = field(default_factory=list)         # RSS peaks above both boundaries
    run_peak: Peak | None = None
    live_tensors: list[tuple[float, int]] = field(default_factory=list)
    memray: list[tuple[float, int]] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)         # top-level stages
    marks: list[tuple[float, str, int]] = field(default_factory=list)
    end_s: float = 0.0


def timeline(record: dict) -> Timeline:
    stages = finished(record)
    result = Timeline(spans=[Span(s["start_s"], s["end_s"], s["name"], s.get("status", "ok"))
                             for s in stages if s.get("parent") is None])
    process = record.get("process") or {}
    end_s = record.get("duration_s") or max((s["end_s"] for s in stages), default=0.0)
    result.end_s = end_s
    if process.get("rss_at_start") is not None:
        result.rss.append((0.0, process["rss_at_start"]))
    if process.get("rss_at_end") is not None:
        result.rss.append((end_s, process["rss_at_end"]))
    children: dict[str, list[dict]] = {}
    for entry in stages:
        if entry.get("parent") is not None:
            children.setdefault(entry["parent"], []).append(entry)
    run_peak = (record.get("peak") or {}).get("rss")
    for entry in stages:
        rss = entry["rss"]
        result.rss += [(entry["start_s"], rss["start"]), (entry["end_s"], rss["end"])]
        placed = _place(entry, "rss", children.get(entry["path"], []))
        if placed is not None:
            inside = rss["peak"] > max(rss["start"], rss["end"])
            if inside:  # a boundary reading already shows a peak equal to it
                result.rss.append((placed, rss["peak"]))
                result.peaks.append(Peak(placed, rss["peak"], entry["path"]))
            if rss["peak"] == run_peak and result.run_peak is None:
                at = placed if inside else entry["end_s"] if rss["end"] == rss["peak"] else entry["start_s"]
                result.run_peak = Peak(at, rss["peak"], entry["path"])
        meter = entry.get("live_tensors") or {}
        if meter.get("start") is not None and meter.get("end") is not None:
            result.live_tensors += [(entry["start_s"], meter["start"]), (entry["end_s"], meter["end"])]
            placed = _place(entry, "live_tensors", children.get(entry["path"], []))
            if placed is not None and meter["peak"] > max(meter["start"], meter["end"]):
                result.live_tensors.append((placed, meter["peak"]))
    for mark in record.get("marks") or []:
        if mark.get("rss") is not None and mark.get("t_s") is not None:
            result.rss.append((mark["t_s"], mark["rss"]))
            result.marks.append((mark["t_s"], mark["name"], mark["rss"]))
    result.memray = _memray_snapshots(record)
    result.rss.sort(key=lambda p: p[0])
    result.live_tensors.sort(key=lambda p: p[0])
    return result


def _place(entry: dict, key: str, kids: list[dict]) -> float | None:
    """Where to draw the stage's `key` peak; None if a child's marker already shows it."""
    reading = entry.get(key) or {}
    peak = reading.get("peak")
    if peak is None:
        return None
    if any((kid.get(key) or {}).get("peak") == peak for kid in kids):
        return None
    start, end = entry["start_s"], entry["end_s"]
    gaps, cursor = [], start
    for kid in sorted(kids, key=lambda k: k["start_s"]):
        if kid["start_s"] > cursor:
            gaps.append((cursor, kid["start_s"]))
        cursor = max(cursor, kid["end_s"])
    if end > cursor:
        gaps.append((cursor, end))
    a, b = max(gaps, key=lambda g: g[1] - g[0]) if gaps else (start, end)
    return (a + b) / 2


def _memray_snapshots(record: dict) -> list[tuple[float, int]]:
    """`memray.snapshots` as [{t_s, rss}] or [[t_s, rss, ...]]; anything else is ignored."""
    points = []
    for item in ((record.get("memray") or {}).get("snapshots") or []):
        if isinstance(item, dict) and item.get("t_s") is not None and item.get("rss") is not None:
            points.append((float(item["t_s"]), int(item["rss"])))
        elif isinstance(item, (list, tuple)) and len(item) >= 2:
            points.append((float(item[0]), int(item[1])))
    return sorted(points)
