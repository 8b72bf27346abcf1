"""The audit's book of stages and intervals: which stages are open (in all threads, and per
thread as a stack), each thread's interval in progress, and the clock they are timed on.

An interval is the time on one thread between two of its stage boundaries. One that ends at
the close of the stage that opened it was that stage's own time; every other one is time no
stage covered at its depth (before the first stage, between siblings, between a parent's
boundaries and its children's, after the last stage) and is recorded as `unstaged`, measured
like a stage, so a peak there is located (`peak.where`). The audit's own thread has one from
the start to the end; another thread's begin at its first stage and end at its last.

The book only keeps them: the probe set (auditor.capture.probe_set) folds its peaks into
them, the audit (auditor.capture.audit) opens and closes them.
"""
from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from auditor.capture.recursion import current_task

# What was alive at a live-tensor high (auditor.capture.probes.live_tensors.PeakSet), opaque here.
PeakSet = Any
# The meters' readings at a boundary, {key: (values, level)} (auditor.capture.probe_set.ProbeSet.read).
Readings = dict[str, tuple[Any, int]]

# What the audit writes of a stage, an unstaged interval and a mark: these keys, in the event log's
# order (nulls included), made as the record's types (auditor.record.schema.written_as), so a field
# the record does not define is a type error.
STAGE_KEYS = ("id", "name", "path", "parent", "status", "call", "start_s", "end_s", "rss", "py_heap", "cuda",
              "live_tensors", "components", "tensors", "thread", "error")
UNSTAGED_KEYS = ("id", "parent", "parent_id", "after", "before", "thread", "start_s", "end_s", "rss", "py_heap",
                 "cuda", "live_tensors")
MARK_KEYS = ("name", "stage", "t_s", "thread", "rss", "py_heap", "cuda")


class OpenStage:
    """A stage in progress. `peaks` and `at_peak` (what was alive at its live-tensor peak)
    take in every interval inside it, children included."""
    __slots__ = ("entry", "opener", "starts", "peaks", "thread_id", "parent", "at_peak", "frame", "stack", "recursed")

    def __init__(self, entry: dict, opener: object, starts: dict, peaks: dict, parent: OpenStage | None):
        self.entry, self.opener, self.starts, self.peaks = entry, opener, starts, peaks
        self.thread_id, self.parent = threading.get_ident(), parent
        self.at_peak: PeakSet | None = None
        self.frame: Any = None  # the program's frame that opened it, while open (census roots)
        self.stack: list[OpenStage] = []  # its thread's stack of open stages (closed from another thread)
        self.recursed = 1  # how deep its staged callable re-entered itself (auditor.capture.recursion)


class Interval:
    """The time on one thread since its last stage boundary. When it ends at the close of the
    stage that opened it, it was that stage's own time; otherwise no stage covered it at its
    depth, and it becomes an `unstaged` item of the record."""
    __slots__ = ("parent", "after", "opened", "thread", "owner", "start_s", "starts", "peaks",
                 "at_peak")

    def __init__(self, parent: OpenStage | None, after: str | None, opened: OpenStage | None,
                 thread: str, start_s: float, readings: Readings):
        self.parent, self.after, self.opened = parent, after, opened
        self.thread, self.start_s = thread, start_s
        self.at_peak: PeakSet | None = None
        self.owner = threading.current_thread()  # a thread id is reused once its thread ends
        self.starts = {key: values for key, (values, _) in readings.items()}
        self.peaks = {key: level for key, (_, level) in readings.items()}


class Clock:
    """The audit's seconds: from its start, the auditor's own work (censuses, call labels)
    kept out, and that work's time counted in the record's `audit_overhead_s`."""
    __slots__ = ("t0", "excluded_s", "excluded_spans", "overhead")

    def __init__(self) -> None:
        self.t0 = 0.0  # perf_counter at the start, set when the audit is entered
        self.excluded_s = 0.0
        self.excluded_spans: list[tuple[float, float]] = []  # (perf_counter start, seconds) of each
        self.overhead = {"boundaries_s": 0.0, "census_s": 0.0, "labels_s": 0.0, "finish_s": 0.0}

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def now(self) -> float:
        """Seconds since the audit began, the auditor's own work excluded."""
        return time.perf_counter() - self.t0 - self.excluded_s

    def seconds_at(self, perf: float) -> float:
        """The audit's seconds (like `now`: its own work excluded) at perf_counter `perf`."""
        kept_out = sum(min(spent, max(0.0, perf - began)) for began, spent in self.excluded_spans)
        return perf - self.t0 - kept_out

    def keep_out(self, began: float, kind: str) -> None:
        """The auditor's own work since perf_counter `began`: out of every stage's time (`now`
        skips it, `seconds_at` too) and into the overhead under `kind`."""
        spent = time.perf_counter() - began
        self.excluded_s += spent
        self.excluded_spans.append((began, spent))
        self.overhead[kind] = self.overhead.get(kind, 0.0) + spent


class StageBook:
    """The stages open and the intervals in progress, in every thread."""

    def __init__(self) -> None:
        self.open: list[OpenStage] = []
        self.intervals: dict[int, Interval] = {}  # thread id -> its interval in progress
        self.audit_thread = 0  # the thread that entered the audit (the live-tensor meter counts its operators)
        self.next_id = 0
        self.unstaged_id = 0
        self._local = threading.local()

    def _lane(self) -> dict:
        """This thread's state, or its running asyncio task's: tasks on one thread interleave at
        each await, so each keeps its own stack of stages, as a thread does. A task's is held
        weakly: the book never keeps a task alive nor adds to what it shows."""
        local = self._local
        task = current_task()
        if task is None:
            lane = getattr(local, "base", None)
            if lane is None:
                lane = local.base = {"stack": [], "folded": []}
            return lane
        tasks = getattr(local, "tasks", None)
        if tasks is None:
            tasks = local.tasks = weakref.WeakKeyDictionary()
        lane = tasks.get(task)
        if lane is None:
            lane = tasks[task] = {"stack": [], "folded": []}
        return lane

    def thread_stack(self) -> list[OpenStage]:
        """The stages open on this thread (in its running asyncio task, if any), outermost first."""
        return self._lane()["stack"]

    def outer_stage(self) -> OpenStage | None:
        """Inside an asyncio task whose own stack is empty: the innermost stage open on its thread
        outside any task (the `with stage(...)` around `asyncio.run`), its stages' parent."""
        if current_task() is None:
            return None
        base = getattr(self._local, "base", None)
        return base["stack"][-1] if base and base["stack"] else None

    def thread_folded(self) -> list[object]:
        """The openers of stages this thread opened deeper than the depth kept (auditor.capture.stage_lifecycle's
        MAX_DEPTH), innermost last: each is part of the deepest stage kept, not one of its own."""
        return self._lane()["folded"]

    def end_interval(self, thread_id: int, end_s: float, closing: OpenStage | None = None,
                     before: str | None = None) -> tuple[Interval, int] | None:
        """End a thread's interval at a stage boundary (`closing`'s close, or the open of the
        stage `before`). Returns it and the id of the `unstaged` item it becomes, or None when
        it was the closing stage's own time, or empty."""
        interval = self.intervals.pop(thread_id, None)
        if interval is None or (closing is not None and interval.opened is closing):
            return None  # the thread's first stage, or a stage without children: no gap
        if not end_s > interval.start_s or interval.owner is not threading.current_thread():
            return None  # empty; or left by an ended thread whose id a new one reuses
        self.unstaged_id += 1
        return interval, self.unstaged_id
