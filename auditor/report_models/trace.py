"""The trace export's content: the run record as the trace-event file draws it, with what the
drawing needs to know first computed once (which thread is which tid, where the run ends,
which stage holds the peak). auditor.renderers.chrome_trace only formats it.

    trace = run_trace(record, source="runs/x")
"""
from __future__ import annotations

from dataclasses import dataclass

from auditor.record.schema import Mark, RunRecord, Stage


@dataclass
class RunTrace:
    record: RunRecord              # stages, marks and readings are drawn as the record has them
    source: str | None             # where the record was read from, named in the file
    pid: int
    threads: dict[str, int]        # thread name -> tid: MainThread 1, then the others as they first appear
    end_s: float                   # the run's duration, or for a killed run the last time its event log records
    peak_holder: Stage | None      # the finished stage holding the run's peak RSS; None: in no finished stage
    unfinished: bool               # the run did not finish, or a stage is still open

    def tid(self, item: Stage | Mark) -> int:
        """The tid of the thread a stage or mark ran on."""
        return self.threads[_thread_of(item)]


def run_trace(record: RunRecord, source: str | None = None) -> RunTrace:
    """What the trace export draws of `record` (a pure function of it)."""
    return RunTrace(record=record, source=source, pid=record.process.pid or 1, threads=_thread_ids(record),
                    end_s=_run_end(record), peak_holder=_peak_holder(record),
                    unfinished=(record.exit is not None and record.exit.status == "unfinished")
                    or any(s.end_s is None for s in record.stages))


def _thread_of(item: Stage | Mark) -> str:
    return item.thread or "MainThread"


def _thread_ids(record: RunRecord) -> dict[str, int]:
    items: list[Stage | Mark] = [*record.stages, *record.marks]
    names = dict.fromkeys(_thread_of(item) for item in items)
    ordered = sorted(names, key=lambda name: name != "MainThread")  # stable: keeps first appearance
    return {name: tid for tid, name in enumerate(ordered, 1)}


def _run_end(record: RunRecord) -> float:
    if record.duration_s is not None:
        return record.duration_s
    times = [t for s in record.stages for t in (s.start_s, s.end_s) if t is not None]
    times += [m.t_s for m in record.marks]
    return max(times, default=0.0)


def _peak_holder(record: RunRecord) -> Stage | None:
    peak = record.peak
    finished = [s for s in record.stages if s.end_s is not None]
    by_id = [s for s in finished if peak.stage_id is not None and s.id == peak.stage_id]
    by_path = [s for s in finished if s.path == peak.stage]
    return next(iter(by_id or by_path), None)
