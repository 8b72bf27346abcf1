"""Unstaged time: the intervals no stage covers at their depth, and where the run's peak was.

The record's `unstaged` list (newer records) holds each interval on a thread between stage
boundaries that no stage covered at its depth: before the first stage, between siblings, from
a parent's open to its first child, after its last child, after the last top-level stage. The
run's `peak.where` says whether the peak RSS fell in a stage's own time or in one of these.

    place = peak_place(record)       # PeakPlace: kind, phrase ("between `A` and `B`"), interval
    shown = notable(record)          # the intervals worth a row of the stage table

Older records have neither field: the peak is then the innermost stage holding it, or, at top
level, "outside every stage", the only case where that is all the record can say.
"""
from __future__ import annotations

from dataclasses import dataclass

from auditor.analysis.run.stages import census_order, ended
from auditor.analysis.run.timeline import Peak, Timeline
from auditor.record.schema import AtPeak, LiveTensors, RunRecord, Stage, Unstaged
from auditor.record.schema import PeakPlace as PeakWhere  # the record's `peak.where`

NOTABLE_RISE_SHARE = 0.10   # an interval whose peak rises this share of the run's peak above its start
NOTABLE_TIME_SHARE = 0.05   # an interval lasting this share of the run
NOTABLE_MIN_S = 0.010       # ... and at least this long
MAX_SHOWN = 20              # notable intervals shown as rows (the peak's is always among them)


@dataclass
class PeakPlace:
    kind: str                  # "stage" | "unstaged" | "unknown" (older record, top level)
    phrase: str                # markdown: "in stage `X`", "between `A` and `B`", ...
    stage: str | None          # kind "stage": the stage path
    interval: Unstaged | None  # kind "unstaged": the record's interval, when found


def intervals(record: RunRecord) -> list[Unstaged]:
    return list(record.unstaged or [])


def describe(where: Unstaged | PeakWhere, inside_parent: bool = False) -> str:
    """An unstaged interval (or `peak.where` of kind unstaged) in words, with code spans.
    `inside_parent`: the reader knows the parent, so it is not named."""
    parent, after, before = where.parent, where.after, where.before
    if parent is not None:
        inside = "" if inside_parent else f"inside `{parent}` "
        if after is None and before is None:
            return f"{inside}outside its children"
        if after is None:
            return f"{inside}before its first child `{before}`"
        if before is None:
            return f"{inside}after its last child `{after}`"
        return f"between `{after}` and `{before}`" + ("" if inside_parent else f" ({inside.strip()})")
    if after is None and before is None:
        return "with no stage open"
    if after is None:
        return f"before the first stage (`{before}`)"
    if before is None:
        return f"after the last stage (`{after}`)"
    return f"between `{after}` and `{before}`"


def peak_place(record: RunRecord) -> PeakPlace:
    """Where the run's RSS peak was, as precisely as the record says."""
    peak = record.peak
    where = peak.where
    if where is None:  # an older record: the unstaged intervals may still hold it
        item = _holding(record, None)
        if item is not None and peak.stage == item.parent:
            where = PeakWhere(kind="unstaged", parent=item.parent, after=item.after, before=item.before)
    if where is not None and where.kind == "unstaged":
        return PeakPlace("unstaged", describe(where), None, _holding(record, where))
    stage = where.stage if where is not None else peak.stage
    if stage:
        return PeakPlace("stage", f"in stage `{stage}`", stage, None)
    return PeakPlace("unknown", "outside every stage: this record does not locate it further", None, None)


def _holding(record: RunRecord, where: PeakWhere | None) -> Unstaged | None:
    """The interval holding the run's peak: matching `where` when given, the first whose peak
    equals the run's peak."""
    rss = record.peak.rss
    matching = [u for u in intervals(record)
                if where is None or (u.parent, u.after, u.before) == (where.parent, where.after, where.before)]
    exact = [u for u in matching if u.rss.peak == rss]
    found = exact or (matching if where is not None else [])
    return found[0] if found else None


def composition(record: RunRecord, interval: Unstaged) -> tuple[str, AtPeak | Stage] | None:
    """What was alive in an interval: ("at_peak", its at_peak) when measured there, else
    ("census", the stage whose end census came just before the interval), else None."""
    at_peak = interval.live_tensors.at_peak if interval.live_tensors else None
    if at_peak is not None:
        return "at_peak", at_peak
    earlier = [s for s in census_order(record) if ended(s) <= interval.start_s]
    return ("census", earlier[-1]) if earlier else None


def notable(record: RunRecord) -> list[Unstaged]:
    """The intervals a reader should see as rows: the one holding the run's peak, those whose
    peak rises well above their start (RSS or live tensors), and long ones; in time order."""
    items = intervals(record)
    if not items:
        return []
    peak = record.peak.rss or 0
    live_peak = max(((s.live_tensors.peak if s.live_tensors else None) or 0 for s in record.stages), default=0)
    run_s = record.duration_s or max((ended(u) for u in items), default=0.0)
    holding = peak_place(record).interval

    def score(item: Unstaged) -> float:
        rss, live = item.rss, item.live_tensors or LiveTensors()  # no meter: no readings
        rise = (rss.peak or 0) - max(rss.start or 0, rss.end or 0)
        live_rise = (live.peak or 0) - max(live.start or 0, live.end or 0)
        long = ended(item) - item.start_s
        return max(rise / peak if peak else 0, live_rise / live_peak if live_peak else 0,
                   long / run_s if run_s else 0)

    def worth(item: Unstaged) -> bool:
        rss, live = item.rss, item.live_tensors or LiveTensors()
        long = ended(item) - item.start_s
        return bool(peak and (rss.peak or 0) - (rss.start or 0) > NOTABLE_RISE_SHARE * peak
                or live_peak and (live.peak or 0) - (live.start or 0) > NOTABLE_RISE_SHARE * live_peak
                or run_s and long >= max(NOTABLE_TIME_SHARE * run_s, NOTABLE_MIN_S))

    chosen = sorted((u for u in items if worth(u)), key=score, reverse=True)[:MAX_SHOWN]
    if holding is not None and all(u is not holding for u in chosen):
        chosen.append(holding)
    return sorted(chosen, key=lambda u: (u.start_s, u.id))


def total(record: RunRecord) -> tuple[int, float]:
    """(intervals, seconds) of unstaged time in the record."""
    items = intervals(record)
    return len(items), sum(ended(u) - u.start_s for u in items)


def on_timeline(record: RunRecord, line: Timeline) -> list[Peak]:
    """Puts the unstaged intervals on a timeline (auditor.analysis.run.timeline knows only stages):
    their RSS and live-tensor readings join the lines, each interval's peak above both its ends
    is placed at its middle (returned), and a stage peak such an interval explains (its
    parent's, equal to it) is no longer guessed elsewhere in the stage."""
    found: list[Peak] = []
    explained: set[tuple[str, int]] = set()
    spans = {s.path: (s.start_s, s.end_s) for s in record.stages}
    live_guesses: list[tuple[float, float, int, float, float]] = []
    for item in intervals(record):
        rss, mid = item.rss, (item.start_s + ended(item)) / 2
        if rss.peak is not None and rss.peak > max(rss.start or 0, rss.end or 0):
            found.append(Peak(mid, rss.peak, describe(item)))
            line.rss.append((mid, rss.peak))
            if item.parent is not None:
                explained.add((item.parent, rss.peak))
        meter = item.live_tensors or LiveTensors()
        if meter.start is not None and meter.end is not None:
            line.live_tensors += [(item.start_s, meter.start), (ended(item), meter.end)]
            if meter.peak is not None and meter.peak > max(meter.start, meter.end):
                line.live_tensors.append((mid, meter.peak))
                start, end = spans.get(item.parent, (None, None)) if item.parent is not None else (None, None)
                if start is not None and end is not None:
                    live_guesses.append((start, end, meter.peak, item.start_s, ended(item)))
    guessed = [p for p in line.peaks if (p.stage, p.value) in explained]
    line.peaks = [p for p in line.peaks if (p.stage, p.value) not in explained]
    drop = {(p.t, p.value) for p in guessed}
    line.rss = sorted((point for point in line.rss if point not in drop), key=lambda point: point[0])
    line.live_tensors = sorted((point for point in line.live_tensors if not any(
        start <= point[0] <= end and point[1] == value and not a <= point[0] <= b
        for start, end, value, a, b in live_guesses)), key=lambda point: point[0])
    place = peak_place(record)
    holder = place.interval
    if place.kind == "unstaged" and holder is not None and holder.rss.peak is not None:
        line.run_peak = Peak((holder.start_s + ended(holder)) / 2, holder.rss.peak,
                             "unstaged: " + place.phrase.replace("`", ""))
    return found
