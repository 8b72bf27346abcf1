"""Python heap through tracemalloc: end and peak per stage (opt-in: it slows allocation-heavy
Python code). It does not see torch tensor storage, only what Python's allocators hand out
(numpy arrays included)."""
from __future__ import annotations

import tracemalloc

from auditor.record.schema import Readings


class PythonHeapProbe:
    key = "py_heap"

    def __init__(self):
        # Keep a trace the user started (and its frame depth); stop only what we started.
        self._started_here = not tracemalloc.is_tracing()
        if self._started_here:
            tracemalloc.start()

    @staticmethod
    def read() -> tuple[int, int, int]:
        if not tracemalloc.is_tracing():  # it would read 0 from now on: fail, not misreport
            raise RuntimeError("tracemalloc was stopped while the audit ran "
                               "(tracemalloc.stop() in the audited program?)")
        current, peak = tracemalloc.get_traced_memory()
        return current, current, peak

    @staticmethod
    def reset() -> None:
        tracemalloc.reset_peak()

    @staticmethod
    def entry(start: int, end: int, peak: int) -> Readings:
        return Readings(start=start, end=end, peak=peak)

    def describe(self) -> dict:
        return {"state": "on", "method": "tracemalloc"}

    def close(self) -> None:
        if self._started_here and tracemalloc.is_tracing():
            tracemalloc.stop()
