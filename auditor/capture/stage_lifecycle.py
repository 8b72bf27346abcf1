"""Opening and closing stages: the audit's part that turns each stage boundary into events.

At an open, the probes are read, the thread's interval so far ends (an `unstaged` item when no
stage covered it) and the stage joins the book (auditor.capture.stage_book); at a close, its
readings, census and live-tensor peak make its `stage_finished` event. Its bookkeeping never
breaks the program: a failure is a warning in the record (and on stderr), the stage may then
be missing, and the program goes on as it would alone.

What a program may do that does not nest as stages should, and what the record says then:

- stages nested deeper than MAX_DEPTH on a thread are no stages of their own: each is folded
  into the deepest stage kept (its time and memory are in that one), said once in a warning;
  a staged function that recurses is one stage already (auditor.capture.recursion);
- a stage closed while stages inside it are still open (an outer stage's `__exit__` called
  first) closes them there, each with a warning naming it "closed by its parent";
- a stage closed on another thread than the one that opened it is closed there, with the
  stages open inside it on its own thread, and a warning saying which threads.
"""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from auditor.capture import ranks
from auditor.capture.census_roots import CensusRoots
from auditor.capture.exit_status import describe
from auditor.capture.probe_set import ProbeSet
from auditor.capture.stage_book import STAGE_KEYS, UNSTAGED_KEYS, Clock, Interval, OpenStage, StageBook
from auditor.record.schema import Call, Readings, Stage, Unstaged, written_as

MAX_DEPTH = 100  # stages kept nested on one thread; deeper ones are folded into the deepest kept
CALL_KEYS = ("target", "index", "label")  # a staged call's fields; `recursed` follows where it recursed


class StageLifecycle:
    """The open and close of stages, for the audit (auditor.capture.audit.Audit) that has these parts."""
    _book: StageBook
    _probe_set: ProbeSet
    _census_roots: CensusRoots
    _clock: Clock
    _lock: threading.RLock
    rank: dict | None
    on_stage_end: Callable[[dict], object] | None
    _warn: Callable[[str], None]
    _fault: Callable[[str, Exception], None]
    _emit: Callable[..., None]
    _folding_said = False  # the warning that stages nested too deep are folded: once per audit

    # -- what the program calls (never raises into it) ------------------------------------

    def open_stage(self, name: str, opener: object, call: dict | None = None) -> None:
        """`call`: the staged call this stage is ({"target", "index", "label"}), or None."""
        try:
            self._open_stage(name, opener, call)
        except Exception as error:  # the audit's own failure never reaches the program
            self._fault(f"opening stage {name!r}", error)

    def close_stage(self, opener: object, exc: BaseException | None) -> None:
        try:
            self._close_stage(opener, exc)
        except Exception as error:
            self._fault("closing a stage", error)

    def recursed(self, opener: object, deepest: int) -> None:
        """The staged call `opener`, open on this thread, re-entered itself `deepest` calls deep."""
        try:
            for opened in reversed(self._book.thread_stack()):
                if opened.opener is opener:
                    opened.recursed = deepest
                    return
        except Exception as error:
            self._fault("counting a staged call's recursion", error)

    # -- open -------------------------------------------------------------------------------

    def _open_stage(self, name: str, opener: object, call: dict | None = None) -> None:
        began = time.perf_counter()
        with self._lock:
            probes, book = self._probe_set, self._book
            stack = book.thread_stack()
            if len(stack) >= MAX_DEPTH:
                book.thread_folded().append(opener)
                self._say_folded(stack[-1], name)
                return
            probes.poll_cuda()
            outer = stack[-1] if stack else book.outer_stage()
            parent = outer.entry["path"] if outer else None
            readings = probes.read(reset=True)
            starts = {key: values for key, (values, _) in readings.items()}
            peaks = {key: level for key, (_, level) in readings.items()}
            book.next_id += 1
            start_s = round(self._clock.now(), 6)
            path = name if parent is None else f"{parent}/{name}"
            thread = threading.current_thread().name
            entry = {"id": book.next_id, "name": name, "path": path, "parent": parent, "thread": thread,
                     "start_s": start_s, "rss": {"start": starts["rss"]}, "call": call}
            opened = OpenStage(entry, opener, starts, peaks, outer)
            opened.stack = stack
            if self._census_roots.take_census is not None:  # a census loaded torch: so may its roots
                from auditor.capture.census import discovered_roots
                opened.frame = discovered_roots.opener_frame(sys._getframe())
            book.open.append(opened)
            stack.append(opened)
            self._end_interval(opened.thread_id, start_s, starts, before=path)
            book.intervals[opened.thread_id] = Interval(opened, None, opened, thread, start_s, readings)
            probes.follow(opened.thread_id, path)
            self._emit({"event": "stage_started", "stage": entry})
            if probes.history is not None:
                probes.history.label(path)
            self._clock.overhead["boundaries_s"] += time.perf_counter() - began

    def _say_folded(self, deepest: OpenStage, name: str) -> None:
        if self._folding_said:
            return
        self._folding_said = True
        self._warn(f"stages nested more than {MAX_DEPTH} deep on a thread are not stages of their own: each is "
                   f"part of the deepest stage kept, its time and memory in that one (first {name!r}, inside "
                   f"stage {deepest.entry['name']!r}, id {deepest.entry['id']})")

    # -- close ------------------------------------------------------------------------------

    def _close_stage(self, opener: object, exc: BaseException | None) -> None:
        end_s = self._clock.now()
        overhead = self._clock.overhead
        began, census_before = time.perf_counter(), overhead["census_s"]
        entries = []
        with self._lock:
            book = self._book
            stack, folded = book.thread_stack(), book.thread_folded()
            if folded:  # stages past the depth kept: nothing of their own to close
                if folded[-1] is opener:
                    folded.pop()
                    return
                if opener in folded:
                    folded.remove(opener)
                    return
            innermost = stack and stack[-1].opener is opener
            closing = [stack.pop()] if innermost else self._out_of_order(opener, stack)
            for each in closing:
                self._probe_set.poll_cuda()
                entries.append(self._finish_stage(each, end_s, exc))
                history = self._probe_set.history
                if history is not None:
                    history.label(each.entry["parent"])
            census_s = overhead["census_s"] - census_before
            overhead["boundaries_s"] += time.perf_counter() - began - census_s
        for entry in entries:
            if self.on_stage_end is None:
                break
            try:
                self.on_stage_end(entry)
            except Exception as error:  # a broken progress display must not break the user's code
                self.on_stage_end = None
                self._warn(f"on_stage_end failed, switched off: {type(error).__name__}: {error}")

    def _out_of_order(self, opener: object, stack: list[OpenStage]) -> list[OpenStage]:
        """The stages to close, innermost first, when `opener` is not this thread's innermost open
        stage: it and the stages open inside it, each said in a warning. None when it is not open
        (opened before this audit began, or closed already by its parent)."""
        mine = [opened for opened in stack if opened.opener is opener]
        if mine:
            owner, here = stack, None
        else:
            others = [opened for opened in self._book.open if opened.opener is opener]
            if not others:
                return []
            owner, here = others[-1].stack, threading.current_thread().name
        at = max(i for i, opened in enumerate(owner) if opened.opener is opener)
        closing = owner[at:][::-1]
        del owner[at:]
        if here is None:
            self._book.thread_folded().clear()  # folded ones sat inside the deepest, closed now
        outer = closing[-1].entry
        if here is not None:
            where = (f"on thread {outer['thread']!r}, was closed on thread {here!r}" if here != outer["thread"] else
                     f"on thread {here!r}, was closed there outside the asyncio task that opened it")
            self._warn(f"stage {outer['path']!r}, opened {where}; the audit closed it there"
                       + (f", with the {len(closing) - 1} stage(s) open inside it" if len(closing) > 1 else ""))
        for inner in closing[:-1]:
            self._warn(f"stage {inner.entry['path']!r} was still open when its parent {outer['path']!r} "
                       "closed (closed out of order); the audit closed it there, closed by its parent")
        return closing

    def _finish_stage(self, closing: OpenStage, end_s: float, exc: BaseException | None) -> dict:
        probes = self._probe_set
        readings = probes.read(reset=True)  # the interval after the close has its own peak
        ends = {key: values for key, (values, _) in readings.items()}
        self._book.open.remove(closing)
        if self.rank is not None:  # the process group's own figures, once the program made one
            self.rank = ranks.confirmed(self.rank)
        started, end_s = closing.entry, round(end_s, 6)
        self._end_interval(closing.thread_id, end_s, ends, closing=closing)
        alive = probes.alive(closing.at_peak)
        rss, py_heap, cuda, live = probes.meter_fields(closing.starts, ends, closing.peaks)
        failed = _is_failure(exc)
        stage = written_as(Stage(
            id=started["id"], name=started["name"], path=started["path"], parent=started["parent"],
            status="failed" if failed else "ok", call=_call(started["call"], closing.recursed),
            start_s=started["start_s"], end_s=end_s, rss=Readings() if rss is None else rss, py_heap=py_heap, cuda=cuda,
            live_tensors=live, thread=started["thread"], error=describe(exc) if failed else None),
            STAGE_KEYS)
        census = None
        if self._census_roots.take_census is not None:
            stage.components, stage.tensors, census = self._census_roots.census(closing)
        closing.frame = None
        if stage.live_tensors is not None:
            stage.live_tensors.at_peak = probes.at_peak(closing.at_peak, alive, census)
        entry = stage.to_json()
        self._emit({"event": "stage_finished", "stage": entry}, durable=True)
        if started["parent"] is None:  # the children's memory, at top-level stage ends only (cheap)
            probes.read_children(started["path"], end_s)
        parent = closing.parent
        self._book.intervals[closing.thread_id] = Interval(parent, started["path"], None,
                                                           started["thread"], end_s, readings)
        probes.follow(closing.thread_id, parent.entry["path"] if parent else None)
        return entry

    def _close_left_open(self, end_s: float, exc: BaseException | None) -> None:
        """At the audit's end: every stage still open, innermost first, closed there with a warning."""
        book = self._book
        for left in reversed(list(book.open)):
            self._warn(f"stage {left.entry['path']!r} was still open when the audit ended; closed it there")
            if left in left.stack:
                left.stack.remove(left)
            self._finish_stage(left, end_s, exc)

    # -- unstaged intervals -----------------------------------------------------------------

    def _end_interval(self, thread_id: int, end_s: float, ends: dict,
                      closing: OpenStage | None = None, before: str | None = None) -> None:
        """End a thread's interval at a stage boundary (`closing`'s close, or the open of the
        stage `before`); emit it as `unstaged` unless it was the closing stage's own time."""
        ended = self._book.end_interval(thread_id, end_s, closing, before)
        if ended is None:
            return
        interval, unstaged_id = ended
        census = self._census_roots.take_census is not None  # owners: at the next census
        rss, py_heap, cuda, live = self._probe_set.unstaged_fields(unstaged_id, interval, ends, census)
        parent = interval.parent
        item = written_as(Unstaged(
            id=unstaged_id, parent=parent.entry["path"] if parent else None,
            parent_id=parent.entry["id"] if parent else None, after=interval.after, before=before,
            thread=interval.thread, start_s=interval.start_s, end_s=end_s, rss=Readings() if rss is None else rss,
            py_heap=py_heap, cuda=cuda, live_tensors=live), UNSTAGED_KEYS)
        self._emit({"event": "unstaged", "unstaged": item.to_json()})

    def _end_run_intervals(self, end_s: float, ends: dict) -> None:
        """The audit thread's time after its last top-level stage. Other threads' last
        intervals are dropped: when those threads stopped working is unknown."""
        try:
            with self._lock:
                book = self._book
                intervals, book.intervals = book.intervals, {}
                if book.audit_thread in intervals:
                    book.intervals[book.audit_thread] = intervals[book.audit_thread]
                    self._end_interval(book.audit_thread, round(end_s, 6), ends)
                if self._probe_set.awaiting_owners and self._census_roots.take_census is not None:
                    self._census_roots.census()  # the owners of what the last intervals held
        except Exception as error:
            self._fault("recording the time after the last stage", error)


def _call(call: dict | None, recursed: int) -> Call | None:
    """The record's `call`: the staged call's fields, and how deep it recursed where it did (a
    decorated stage that recursed has that alone)."""
    if call is None and recursed <= 1:
        return None
    made = written_as(Call(target=call["target"], index=call["index"], label=call["label"]) if call else Call(),
                      CALL_KEYS)
    if recursed > 1:
        made.recursed = recursed
    return made


def _is_failure(exc) -> bool:
    if exc is None:
        return False
    if isinstance(exc, SystemExit):
        return exc.code not in (None, 0)
    return not isinstance(exc, GeneratorExit)  # a generator closed before its end: its stage ended, not failed
