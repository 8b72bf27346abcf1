"""The run's highest live-tensor reading: in a stage, or in time no stage covers."""
from __future__ import annotations

from auditor.analysis.run.stages import finished
from auditor.analysis.run.unstaged import describe, intervals
from auditor.record.schema import RunRecord


def live_tensor_peak(record: RunRecord) -> tuple[int, str] | None:
    """The highest live-tensor meter reading of the run and the stage holding it, if metered."""
    best = None
    for entry in finished(record):
        peak = entry.live_tensors.peak if entry.live_tensors else None
        if peak is not None and (best is None or peak > best[0]):
            best = (peak, entry.path)
    return best


def live_tensor_high(record: RunRecord) -> tuple[int, str] | None:
    """The run's highest live-tensor reading, stages and unstaged intervals alike, and where it
    was in words (markdown): "in stage `X`" or "after the last stage (`X`)"."""
    best = live_tensor_peak(record)
    place = None if best is None else (best[0], f"in stage `{best[1]}`")
    for interval in intervals(record):
        peak = interval.live_tensors.peak if interval.live_tensors else None
        if peak is not None and (place is None or peak > place[0]):
            place = (peak, f"in time no stage covers, {describe(interval)}")
    return place
