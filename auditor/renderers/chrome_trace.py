"""A run record as a trace-event file (the Chrome trace format), which Perfetto
(ui.perfetto.dev) and chrome://tracing open: stages as nested spans on the thread that ran
them, RSS, live tensors, Python heap and CUDA allocated as counters, marks and peaks as
instant events.

Only what the record knows is drawn where it knows it. A counter has a point at each reading
the record keeps with its time: stage starts and ends, marks, the run's start and end. A
peak is a value without an instant (a high-water mark says how high, not when), so it is an
instant event at the end of its stage that says so, never a counter point at a made-up time.

Times are microseconds since the audit began (the record's seconds x 1e6); sizes are bytes.
Formats auditor.report_models.trace's `RunTrace` (`run_trace(record)`) only.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from auditor.record.schema import Mark, RunRecord, Stage
from auditor.report_models.trace import RunTrace

PEAK_TIME = "somewhere inside the stage; the record keeps the value, not the instant"
RUN_PEAK_TIME = ("somewhere inside stage {stage!r}, drawn at its end; the record keeps the "
                 "value, not the instant")
RUN_PEAK_OUTSIDE = "somewhere in the run, in no finished stage; drawn at the run's end"
OPEN_STAGE = ("never finished: the run ended inside it (killed?); drawn to the last time the "
              "record knows, {end_s} s")
UNFINISHED = ("the run did not finish (killed?): the record was rebuilt from its event log; "
              "stages still open are drawn to the last time it knows, {end_s} s")
MEMRAY_SITES = ("allocations alive at memray's own high-water mark, grouped by their first "
                "line of user code")
PROCESS_TID = 0  # counters and run-wide events belong to the process, not to a thread
Reading = tuple[float, str, "int | None"]  # (time, counter, bytes)


def render(trace: RunTrace) -> str:
    """The trace-event JSON (compact) of a run."""
    record, pid = trace.record, trace.pid
    drawn = metadata(trace)
    drawn += [stage_span(entry, trace) for entry in record.stages]
    drawn += counters(record, pid)
    drawn += [peak for entry in record.stages if (peak := stage_peak(entry, trace))]
    drawn += [mark_event(mark, trace) for mark in record.marks]
    drawn += run_peak(trace)
    return json.dumps({"traceEvents": drawn, "displayTimeUnit": "ms", "otherData": other_data(trace)},
                      separators=(",", ":"))


def us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def metadata(trace: RunTrace) -> list[dict]:
    pid = trace.pid
    events = [{"name": "process_name", "ph": "M", "pid": pid, "tid": PROCESS_TID,
               "args": {"name": f"auditor: {trace.record.name} ({trace.record.device})"}}]
    for name, tid in trace.threads.items():
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"sort_index": tid}})
    return events


# -- stages ------------------------------------------------------------------------------

def stage_span(entry: Stage, trace: RunTrace) -> dict:
    """A complete event ("X"); the trace viewers nest spans of one thread by their times."""
    args = {key: value for key, value in entry.to_json().items()  # every field, as the record has it
            if key not in ("name", "start_s", "end_s") and value is not None}
    end_s = entry.end_s
    if end_s is None:
        end_s = max(trace.end_s, entry.start_s)
        args["end"] = OPEN_STAGE.format(end_s=end_s)
    start = us(entry.start_s)
    return {"name": entry.name, "cat": "stage", "ph": "X", "ts": start,
            "dur": round(us(end_s) - start, 3), "pid": trace.pid, "tid": trace.tid(entry),
            "args": args}


def stage_peak(entry: Stage, trace: RunTrace) -> dict | None:
    """The stage's peaks at its end, on its thread, saying the instant is unknown."""
    live, heap, cuda = entry.live_tensors, entry.py_heap, entry.cuda
    peaks = {"peak_rss": entry.rss.peak, "peak_live_tensors": live.peak if live else None,
             "peak_py_heap": heap.peak if heap else None,
             "peak_cuda_allocated": cuda.peak_allocated if cuda else None}
    peaks = {key: value for key, value in peaks.items() if value is not None}
    if not peaks or entry.end_s is None:  # an open stage never had its peak read
        return None
    return {"name": "stage peak", "cat": "peak", "ph": "i", "s": "t", "ts": us(entry.end_s),
            "pid": trace.pid, "tid": trace.tid(entry),
            "args": {"stage": entry.path, **peaks, "time": PEAK_TIME}}


# -- counters ----------------------------------------------------------------------------

def counters(record: RunRecord, pid: int) -> list[dict]:
    """One "C" event per reading the record keeps with its time, in time order."""
    readings = list(run_readings(record))
    for entry in record.stages:
        readings += stage_readings(entry)
    for mark in record.marks:
        readings += mark_readings(mark)
    readings.sort(key=lambda reading: reading[0])  # stable: same-time readings keep record order
    return [{"name": counter, "cat": "memory", "ph": "C", "ts": us(t_s), "pid": pid,
             "tid": PROCESS_TID, "args": {"bytes": value}}
            for t_s, counter, value in readings if value is not None]


def run_readings(record: RunRecord) -> Iterator[Reading]:
    process = record.process
    yield 0.0, "RSS", process.rss_at_start
    if record.duration_s is not None:
        yield record.duration_s, "RSS", process.rss_at_end


def stage_readings(entry: Stage) -> Iterator[Reading]:
    rss, live, heap, cuda = entry.rss, entry.live_tensors, entry.py_heap, entry.cuda
    yield entry.start_s, "RSS", rss.start
    yield entry.start_s, "live tensors", live.start if live else None
    yield entry.start_s, "Python heap", heap.start if heap else None
    yield entry.start_s, "CUDA allocated", cuda.allocated_start if cuda else None
    if entry.end_s is not None:  # an open stage has its start only
        yield entry.end_s, "RSS", rss.end
        yield entry.end_s, "live tensors", live.end if live else None
        yield entry.end_s, "Python heap", heap.end if heap else None
        yield entry.end_s, "CUDA allocated", cuda.allocated_end if cuda else None


def mark_readings(mark: Mark) -> Iterator[Reading]:
    yield mark.t_s, "RSS", mark.rss
    yield mark.t_s, "Python heap", mark.py_heap
    yield mark.t_s, "CUDA allocated", (mark.cuda or {}).get("allocated")  # the probe's own JSON


# -- marks and the run's peak ------------------------------------------------------------

def mark_event(mark: Mark, trace: RunTrace) -> dict:
    args = {key: value for key, value in mark.to_json().items()
            if key not in ("name", "t_s", "thread") and value is not None}
    return {"name": mark.name, "cat": "mark", "ph": "i", "s": "t", "ts": us(mark.t_s),
            "pid": trace.pid, "tid": trace.tid(mark), "args": args}


def run_peak(trace: RunTrace) -> list[dict]:
    """"peak RSS", global, at the end of the stage holding it, with memray's top sites."""
    record = trace.record
    peak = record.peak
    if peak.rss is None:
        return []  # killed before any stage finished: no peak was read
    holder = trace.peak_holder
    args = {key: value for key, value in peak.to_json().items() if value is not None}
    if holder is None or holder.end_s is None:
        t_s, tid, args["time"] = trace.end_s, PROCESS_TID, RUN_PEAK_OUTSIDE
    else:
        t_s, tid = holder.end_s, trace.tid(holder)
        args["time"] = RUN_PEAK_TIME.format(stage=holder.path)
    memray = record.memray
    if memray is not None and memray.sites:
        args["memray"] = {
            "peak_memory": memray.peak_memory, "stage": memray.stage,
            "what": MEMRAY_SITES,
            "sites": [{"location": site.location, "function": site.function, "code": site.code,
                       "bytes": site.bytes, "allocations": site.allocations} for site in memray.sites]}
    return [{"name": "peak RSS", "cat": "peak", "ph": "i", "s": "g", "ts": us(t_s), "pid": trace.pid,
             "tid": tid, "args": args}]


def other_data(trace: RunTrace) -> dict:
    record = trace.record
    data: dict[str, Any] = {"name": record.name, "command": record.command, "device": record.device,
            "schema": record.schema, "started_at": record.started_at}
    data.update(exit=record.exit.to_json() if record.exit is not None else None,
                duration_s=record.duration_s, sizes="bytes", times="microseconds since the audit began")
    if trace.source is not None:
        data["record"] = trace.source
    if trace.unfinished:
        data["unfinished"] = UNFINISHED.format(end_s=trace.end_s)
    return data
