"""The record's stages read in the order that matters: which finished and when, each one's
meters, the order their censuses were taken, the stage holding the run's peak and the census
before a stage. Pure functions of the run record.
"""
from __future__ import annotations

from auditor.record.schema import Readings, RunRecord, Stage, Unstaged


def is_traced(record: RunRecord) -> bool:
    """A run on fake tensors (a projection by tracing): its RSS is the tracing process's."""
    return bool((record.options or {}).get("traced"))


def stage_depths(record: RunRecord) -> dict[str, int]:
    """Depth of each stage path: 0 for top-level stages."""
    depths: dict[str, int] = {}
    for entry in record.stages:  # start order: a parent comes before its children
        parent = entry.parent
        depths[entry.path] = 0 if parent is None else depths.get(parent, 0) + 1
    return depths


def finished(record: RunRecord) -> list[Stage]:
    return [s for s in record.stages if s.status != "open" and s.end_s is not None]


def ended(entry: Stage | Unstaged) -> float:
    """When a finished stage or an unstaged interval ended: the record always says (a stage
    never finished is not among `finished`)."""
    assert entry.end_s is not None, "a finished stage or an interval has its end_s"
    return entry.end_s


METERS = ("rss", "py_heap", "live_tensors")


def meter(entry: Stage | Unstaged, key: str) -> Readings | None:
    """A stage's or an unstaged interval's meter by its name in the record (`METERS`); None
    where it was off."""
    if key not in METERS:
        raise KeyError(f"no meter {key!r}; the record has {', '.join(METERS)}")
    return getattr(entry, key)


def census_order(record: RunRecord) -> list[Stage]:
    """The finished stages that carry a census, in the order their censuses were taken."""
    return sorted((s for s in finished(record) if s.components is not None),
                  key=lambda s: (ended(s), s.id or 0))


def peak_stage(record: RunRecord) -> Stage | None:
    """The stage entry holding the run's peak RSS (by id, else by path)."""
    stage_id, path = record.peak.stage_id, record.peak.stage
    for entry in record.stages:
        if stage_id is not None and entry.id == stage_id:
            return entry
    for entry in record.stages:
        if path is not None and entry.path == path:
            return entry
    return None


def census_before(record: RunRecord, stage: Stage) -> Stage | None:
    """The last census taken before `stage` began (the stage end just before it), if any."""
    earlier = [s for s in census_order(record) if ended(s) <= stage.start_s and s is not stage]
    return earlier[-1] if earlier else None


def peak_at_start(stage: Stage) -> bool:
    """Whether the stage's peak is nearer its start reading than its end reading: then the
    census at its end describes the memory after the peak, the one before it the peak."""
    rss = stage.rss
    if rss.peak is None or rss.end is None:
        return False
    assert rss.start is not None, "a stage's RSS has its start reading"
    return rss.peak - rss.start < rss.peak - rss.end


def final_stage(record: RunRecord) -> Stage | None:
    """The last stage to finish with a census: what is left when the algorithm returns."""
    ordered = census_order(record)
    return ordered[-1] if ordered else None
