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

from auditor.analysis.components import census_order
from auditor.analysis.timeline import Peak, Timeline

NOTABLE_RISE_SHARE = 0.10   # an interval whose peak rises this share of the run's peak above its start
NOTABLE_TIME_SHARE = 0.05   # an interval lasting this share of the run
NOTABLE_MIN_S = 0.010       # ... and at least this long
MAX_SHOWN = 20              # notable intervals shown as rows (the peak's is always among them)


@dataclass
class PeakPlace:
    kind: str                  # "stage" | "unstaged" | "unknown" (older record, top level)
    phrase: str                # markdown: "in stage `X`", "between `A` and `B`", ...
    stage: str | None          # kind "stage": the stage path
    interval: dict | None      # kind "unstaged": the record's interval, when found


def intervals(record: dict) -> list[dict]:
    return [u for u in record.get("unstaged") or [] if isinstance(u, dict) and u.get("rss")]


def describe(where: dict, inside_parent: bool = False) -> str:
    """An unstaged interval (or `peak.where` of kind unstaged) in words, with code spans.
    `inside_parent`: the reader knows the parent, so it is not named."""
    parent, after, before = where.get("parent"), where.get("after"), where.get("before")
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


def peak_place(record: dict) -> PeakPlace:
    """Where the run's RSS peak was, as precisely as the record says."""
    peak = record.get("peak") or {}
    where = peak.get("where") if isinstance(peak.get("where"), dict) else None
    if where is None:  # an older record: the unstaged intervals may still hold it
        item = _holding(record, None)
        if item is not None and peak.get("stage") == item.get("parent"):
            where = {"kind": "unstaged", **{k: item.get(k) for k in ("parent", "after", "before")}}
    if where is not None and where.get("kind") == "unstaged":
        return PeakPlace("unstaged", describe(where), None, _holding(record, where))
    stage = where.get("stage") if where is not None else peak.get("stage")
    if stage:
        return PeakPlace("stage", f"in stage `{stage}`", stage, None)
    return PeakPlace("unknown", "outside every stage: this record does not locate it further", None, None)


def _holding(record: dict, where: dict | None) -> dict | None:
    """The interval holding the run's peak: matching `where` when given, the first whose peak
    equals the run's peak."""
    rss = (record.get("peak") or {}).get("rss")
    matching = [u for u in intervals(record)
                if where is None or all(u.get(k) == where.get(k) for k in ("parent", "after", "before"))]
    exact = [u for u in matching if u["rss"].get("peak") == rss]
    found = exact or (matching if where is not None else [])
    return found[0] if found else None


def composition(record: dict, interval: dict) -> tuple[str, dict] | None:
    """What was alive in an interval: ("at_peak", its at_peak) when measured there, else
    ("census", the stage whose end census came just before the interval), else None."""
    at_peak = (interval.get("live_tensors") or {}).get("at_peak")
    if at_peak:
        return "at_peak", at_peak
    earlier = [s for s in census_order(record) if s["end_s"] <= interval["start_s"]]
    return ("census", earlier[-1]) if earlier else None


def notable(record: dict) -> list[dict]:
    """The intervals a reader should see as rows: the one holding the run's peak, those whose
    peak rises well above their start (RSS or live tensors), and long ones; in time order."""
    items = intervals(record)
    if not items:
        return []
    peak = (record.get("peak") or {}).get("rss") or 0
    live_peak = max(((s.get("live_tensors") or {}).get("peak") or 0 for s in record["stages"]), default=0)
    run_s = record.get("duration_s") or max((u["end_s"] for u in items), default=0.0)
    holding = peak_place(record).interval

    def score(item: dict) -> float:
        rss, live = item["rss"], item.get("live_tensors") or {}
        rise = (rss.get("peak") or 0) - max(rss.get("start") or 0, rss.get("end") or 0)
        live_rise = (live.get("peak") or 0) - max(live.get("start") or 0, live.get("end") or 0)
        long = item["end_s"] - item["start_s"]
        return max(rise / peak if peak else 0, live_rise / live_peak if live_peak else 0,
                   long / run_s if run_s else 0)

    def worth(item: dict) -> bool:
        rss, live = item["rss"], item.get("live_tensors") or {}
        long = item["end_s"] - item["start_s"]
        return bool(peak and (rss.get("peak") or 0) - (rss.get("start") or 0) > NOTABLE_RISE_SHARE * peak
                or live_peak and (live.get("peak") or 0) - (live.get("start") or 0) > NOTABLE_RISE_SHARE * live_peak
                or run_s and long >= max(NOTABLE_TIME_SHARE * run_s, NOTABLE_MIN_S))

    chosen = sorted((u for u in items if worth(u)), key=score, reverse=True)[:MAX_SHOWN]
    if holding is not None and all(u is not holding for u in chosen):
        chosen.append(holding)
    return sorted(chosen, key=lambda u: (u["start_s"], u.get("id", 0)))


def total(record: dict) -> tuple[int, float]:
    """(intervals, seconds) of unstaged time in the record."""
    items = intervals(record)
    return len(items), sum(u["end_s"] - u["start_s"] for u in items)


def on_timeline(record: dict, line: Timeline) -> list[Peak]:
    """Puts the unstaged intervals on a timeline (auditor.analysis.timeline knows only stages):
    their RSS and live-tensor readings join the lines, each interval's peak above both its ends
    is placed at its middle (returned), and a stage peak such an interval explains (its
    parent's, equal to it) is no longer guessed elsewhere in the stage."""
    found: list[Peak] = []
    explained: set[tuple[str, int]] = set()
    spans = {s["path"]: (s["start_s"], s.get("end_s")) for s in record["stages"]}
    live_guesses: list[tuple[float, float, int, float, float]] = []
    for item in intervals(record):
        rss, mid = item["rss"], (item["start_s"] + item["end_s"]) / 2
        if rss.get("peak") is not None and rss["peak"] > max(rss.get("start") or 0, rss.get("end") or 0):
            found.append(Peak(mid, rss["peak"], describe(item)))
            line.rss.append((mid, rss["peak"]))
            if item.get("parent") is not None:
                explained.add((item["parent"], rss["peak"]))
        meter = item.get("live_tensors") or {}
        if meter.get("start") is not None and meter.get("end") is not None:
            line.live_tensors += [(item["start_s"], meter["start"]), (item["end_s"], meter["end"])]
            if meter.get("peak") is not None and meter["peak"] > max(meter["start"], meter["end"]):
                line.live_tensors.append((mid, meter["peak"]))
                start, end = spans.get(item.get("parent"), (None, None))
                if start is not None and end is not None:
                    live_guesses.append((start, end, meter["peak"], item["start_s"], item["end_s"]))
    guessed = [p for p in line.peaks if (p.stage, p.value) in explained]
    line.peaks = [p for p in line.peaks if (p.stage, p.value) not in explained]
    drop = {(p.t, p.value) for p in guessed}
    line.rss = sorted((point for point in line.rss if point not in drop), key=lambda point: point[0])
    line.live_tensors = sorted((point for point in line.live_tensors if not any(
        start <= point[0] <= end and point[1] == value and not a <= point[0] <= b
        for start, end, value, a, b in live_guesses)), key=lambda point: point[0])
    place = peak_place(record)
    if place.kind == "unstaged" and place.interval is not None:
        item = place.interval
        line.run_peak = Peak((item["start_s"] + item["end_s"]) / 2, item["rss"]["peak"],
                             "unstaged: " + place.phrase.replace("`", ""))
    return found
