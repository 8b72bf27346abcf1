"""A second Audit entered while one is active: joined to the running one, never an error.

    with auditor.Audit(out="runs/prune") as audit:   # in a script run by `auditor run`, a test
        prune(model)                                   # under the pytest plugin run by it, or
    audit.record                                       # inside another Audit of the program's own

Nested audits are *joined*, not separate. The probes measure the whole process (RSS and its
high-water mark, the live-tensor meter, tracemalloc, memray, the census), so one set runs: the
running (outer) audit's. The nested audit is a stage of the outer run, named after it (its
`name`), with the stages its block opens below it; and it keeps a record of its own, in its own
folder, of what happened inside its block: those stages with their paths as they would be alone
(below its stage), times from its own start, the unstaged intervals and marks inside it, its run
peak that of its stage, the outer run's warnings meanwhile. `audit.record`, `auditor.load(folder)`
and `auditor rebuild` read it as any record; its annotation `nested_in` names the outer audit,
its folder and the stage. Its event log is written as it goes (at each stage end inside it), so
a crash keeps what finished.

Options. What the outer audit measures, the nested one has. The live-tensor meter and
tracemalloc, where the outer runs without them, are lent to the outer for the nested block:
started as it enters, stopped as it leaves, so the stages inside it have those figures (in both
records) and the outer's other stages have none (its probe state says so); the live-tensor meter
only where the program has imported torch and has no dispatch mode of its own open (as the
outer's own would start), else the nested probe state says why it is off. The rest cannot start
for part of a run (memray's one tracker per process, the census, CUDA history, the profiler,
fake tensors, size recording): the nested audit says which in one warning each (an
AuditorWarning, and a line of its record), and its probe states say "off" and why. A recorder
the outer runs for the whole process (memray, the profiler, CUDA history) is in the outer's
folder, not the nested one's. Stage targets are applied: their calls are stages of the outer
run, under the nested audit's stage (numbered in the outer run's count: `step#3` where calls
of `step` came before it). `on_stage_end` is called for the stages inside it.

Stages other threads open inside the block open at the outer run's top level; the nested
record has them too, at its top level, as alone (those opened inside its block). This module
cannot import Audit (audit.py imports it): the audits are duck-typed.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from auditor.capture import machine
from auditor.record import run_folder as run_record

# Options that no audit can start for part of a run: (its probe state's key, how the outer gets it).
NOT_LENT = {"memray": ("memray", "--memray"), "census": ("census", "--census"),
            "cuda_history": ("cuda_history", "--cuda-history"),
            "torch_profiler": ("torch_profiler", "--torch-profiler"),
            "traced": ("traced", "--target"), "record_sizes": (None, "--target")}
WHOLE_PROCESS = ("memray", "torch_profiler", "cuda_history")  # recorders whose files are the outer's
# Meters a nested audit may lend the outer for its block: option -> (meter key, probe state key).
LENT = {"live_tensors": ("live_tensors", "live_tensors"), "tracemalloc": ("py_heap", "python_heap")}


def join(audit: Any, outer: Any, claim: Callable[[Path, str], Path], exit_status: Callable) -> Any:
    """Enter `audit` as a part of the running `outer`: Audit._start's path when one is active.
    `claim` names and creates a folder the audit named itself, `exit_status` its record's exit."""
    audit._entered = True
    audit._pid = os.getpid()
    audit._clock.start()
    audit._staging.apply()  # first: the one step that can still refuse, before any file (as alone)
    joined = Joined(audit, outer, exit_status)
    try:
        if audit._chosen_folder:
            audit.folder = claim(audit.folder, audit.name)
        audit._dir = Path(os.path.abspath(audit.folder))
        audit._log.open(audit._dir)
        joined.start()
    except BaseException as error:
        joined.abandon(error)
        audit._log.close()
        audit._staging.restore()
        raise
    for message in joined.pending:
        audit._warn(message)
    return audit


class Joins:
    """What the audits joined to one running audit share: its on_stage_end, which this follows
    (installed in its place while any is joined), and the meters they lent it."""

    def __init__(self, outer: Any):
        self.outer = weakref.ref(outer)
        self.original = outer.on_stage_end
        self.joined: list[Joined] = []
        self.lent: dict[str, list] = {}  # meter key -> [meter, audits using it]

    def __call__(self, entry: dict) -> None:
        if self.original is not None:
            try:
                self.original(entry)
            except Exception as error:  # as the outer does with its own: off, with a warning
                self.original = None
                outer = self.outer()
                if outer is not None:
                    outer._warn(f"on_stage_end failed, switched off: {type(error).__name__}: {error}")
        for joined in list(self.joined):
            joined.stage_ended(entry)


_joins: weakref.WeakKeyDictionary[Any, Joins] = weakref.WeakKeyDictionary()


class Joined:
    """One nested audit while it runs: its stage in the outer run, and its record from the
    outer's events (`moved`: re-rooted below its stage, timed from its start)."""

    def __init__(self, audit: Any, outer: Any, exit_status: Callable):
        self.audit, self.outer, self.exit_status = audit, outer, exit_status
        self.opener = object()  # its stage's opener in the outer's book
        self.entry: dict | None = None  # its stage in the outer run, as it started
        self.seen = 0  # the outer's events read so far
        self.lent: list[str] = []  # meter keys this audit lent the outer
        self.pending: list[str] = []  # its warnings, given once it has started
        self.unstaged: set[int] = set()  # ids of the outer's unstaged intervals inside it
        self.called: set[str] = set()  # stage targets called inside it
        self.unlent: dict[str, str] = {}  # probe state key -> why a meter it asked for was not lent
        self.t0 = 0.0
        self.others: set[tuple[str, str]] = set()  # (thread, path) of other threads' top-level stages inside it
        self._flushing = threading.Lock()

    # -- entering and leaving ------------------------------------------------------------

    def start(self) -> None:
        audit, outer = self.audit, self.outer
        with outer._lock:
            joins = _joins.get(outer)
            if joins is None:
                joins = _joins[outer] = Joins(outer)
                outer.on_stage_end = joins
            joins.joined.append(self)
            self.pending += self._lend(joins)
            before = len(outer.open_stages())
            self.seen = len(outer._log.events)
            outer.open_stage(audit.name, self.opener)
            opened = outer.open_stages()
            if len(opened) == before + 1:
                self.entry = opened[-1]
                self.t0 = self.entry["start_s"]
                self.seen = _after(outer._log.events, self.seen, "stage_started", self.entry["id"])
            else:  # the outer's own fault (its warning says which): nothing to follow
                self.pending.append(f"the running audit {outer.name!r} could not open this audit's stage; "
                                    "this record has no stages")
        self.pending += self._not_honoured()
        audit._log.emit(self._started_event(), durable=True)
        audit._log.emit({"event": "annotation", "key": "nested_in", "value": {
            "audit": outer.name, "folder": str(outer.folder),
            "stage": self.entry["path"] if self.entry else None}}, durable=True)
        # Its own calls go to the audit that measures (stage() and mark() reach the outer anyway).
        for name in ("mark", "track", "track_receiver", "numbered", "own_work", "live_tensor_bytes",
                     "open_stages", "open_stage", "close_stage"):
            setattr(audit, name, getattr(outer, name))
        audit._finish = self.finish  # Audit.__exit__ calls it, then closes the log

    def finish(self, exc: BaseException | None) -> None:
        audit, outer = self.audit, self.outer
        began = time.perf_counter()
        try:
            if self.entry is not None:
                outer.close_stage(self.opener, exc)  # the lent meters read first; never raises
        finally:  # whatever failed, the outer gets its meters back and the program its callables
            self.leave()
            audit._staging.restore()
        self.flush()
        for target in audit._staging.targets:
            if target.name not in self.called:
                audit._warn(audit._staging.never_called(target))
        audit._log.emit(self._finished_event(exc, time.perf_counter() - began), durable=True)
        audit._write_record()

    def abandon(self, error: BaseException) -> None:
        """Undo a start that failed half-way: its stage in the outer closed, the meters returned."""
        try:
            if self.entry is not None:
                self.outer.close_stage(self.opener, error)
        finally:
            self.leave()

    def leave(self) -> None:
        """No longer followed; the meters it lent go back (stopped once no audit uses them)."""
        outer = self.outer
        with outer._lock:
            joins = _joins.get(outer)
            if joins is None or self not in joins.joined:
                return
            joins.joined.remove(self)
            probes = outer._probe_set
            for key in self.lent:
                held = joins.lent[key]
                held[1] -= 1
                if held[1] == 0:
                    del joins.lent[key]
                    meter = held[0]
                    if meter in probes.meters:
                        probes.meters.remove(meter)
                        probes.close_meter(meter)
                    if probes.live is meter:
                        probes.live = None
            if not joins.joined:
                if outer.on_stage_end is joins:
                    outer.on_stage_end = joins.original
                del _joins[outer]

    def _lend(self, joins: Joins) -> list[str]:
        """Start the meters this audit asks for that the outer lacks (the caller holds its lock)."""
        audit, probes = self.audit, self.outer._probe_set
        problems = []
        for option, (key, state) in LENT.items():
            if not audit.options[option]:
                continue
            held = joins.lent.get(key)
            if held is None and (self.outer.options[option] or any(meter.key == key for meter in probes.meters)):
                continue  # the outer's own (its live-tensor meter may wait for torch: it starts it then)
            if held is None:
                why = _cannot_lend(key)
                if why is not None:
                    self.unlent[state] = why
                    continue
                try:
                    meter = _new_meter(key)
                except Exception as error:  # torch missing or broken: measured as the outer measures
                    problems.append(f"{option}=True: could not start for this nested audit "
                                    f"({type(error).__name__}: {error}); its stages have no such figures")
                    continue
                held = joins.lent[key] = [meter, 0]
                probes.meters.append(meter)
                if key == "live_tensors":
                    probes.live = meter
                probes.states[state] = {**meter.describe(), "reason": "started for nested audits only: the "
                                        "stages inside them have its figures, the others none"}
            held[1] += 1
            self.lent.append(key)
        return problems

    def _not_honoured(self) -> list[str]:
        outer = self.outer
        where = f"the running audit {outer.name!r} ({outer.folder})"
        return [f"{option}=True is not honoured: this audit is nested in {where}, whose probes measure the "
                f"whole process and run without it; it shares their readings (give {flag} to the outer "
                f"audit, e.g. `auditor run {flag}`)"
                for option, (_, flag) in NOT_LENT.items() if self.audit.options[option] and not outer.options[option]]

    # -- following the outer's events -----------------------------------------------------

    def stage_ended(self, entry: dict) -> None:
        """A stage of the outer run ended (its on_stage_end): this audit's log takes what is new."""
        try:
            self.flush()
            path = self._relative(entry.get("path"))
            callback = self.audit.on_stage_end
            if path is None or callback is None:
                return
            try:
                callback(self._moved_stage(entry, path))
            except Exception as error:
                self.audit.on_stage_end = None
                self.audit._warn(f"on_stage_end failed, switched off: {type(error).__name__}: {error}")
        except Exception as error:  # the nested record's fault never reaches the program
            self.audit._log.fault("following the running audit's events", error)

    def flush(self) -> None:
        """The outer's events since the last flush, in their order (stage ends come on any thread)."""
        with self._flushing:
            with self.outer._lock:
                events = self.outer._log.events
                end = len(events)
                new, self.seen = events[self.seen:end], end
            for event in new:
                moved = self._moved(event)
                if moved is not None:
                    self.audit._log.emit(moved, durable=moved["event"] == "stage_finished")

    def _moved(self, event: dict) -> dict | None:
        """An outer event as this audit's, or None when it happened outside its stage."""
        kind = event.get("event")
        if kind in ("stage_started", "stage_finished"):
            stage = event["stage"]
            path = self._relative(stage["path"])
            if path is None:
                return self._other_thread(kind, stage)
            if kind == "stage_finished" and stage.get("call"):
                self.called.add(stage["call"]["target"])
            return {"event": kind, "stage": self._moved_stage(stage, path)}
        if kind == "unstaged":
            item = event["unstaged"]
            parent = item["parent"]
            if self.entry is None or parent is None or not self._inside(parent):
                return None
            self.unstaged.add(item["id"])
            at_top = parent == self.entry["path"]
            return {"event": kind, "unstaged": {
                **item, "parent": self._relative(parent), "parent_id": None if at_top else item["parent_id"],
                "after": self._relative(item["after"]), "before": self._relative(item["before"]),
                "start_s": self._time(item["start_s"]), "end_s": self._time(item["end_s"])}}
        if kind == "unstaged_at_peak":
            return dict(event) if event["id"] in self.unstaged else None
        if kind == "mark":
            mark = event["mark"]
            if mark["stage"] is None or not self._inside(mark["stage"]):
                return None
            return {"event": kind, "mark": {**mark, "stage": self._relative(mark["stage"]),
                                            "t_s": self._time(mark["t_s"])}}
        if kind == "warning":
            return dict(event)
        return None  # the outer's own: its annotations, files and end

    def _other_thread(self, kind: str, stage: dict) -> dict | None:
        """A stage another thread opened at the outer's top level while this audit ran, or one
        inside it: in this record as alone (its own top-level stage), timed from its start."""
        thread, path = str(stage.get("thread")), stage["path"]
        if self.entry is None or thread == str(self.entry.get("thread")):
            return None
        if kind == "stage_started" and stage["parent"] is None:
            self.others.add((thread, path))
        inside = next(((t, top) for t, top in self.others
                       if t == thread and (path == top or path.startswith(top + "/"))), None)
        if inside is None:
            return None
        if kind == "stage_finished" and path == inside[1]:
            self.others.discard(inside)
        moved = {**stage, "start_s": self._time(stage["start_s"])}
        if moved.get("end_s") is not None:
            moved["end_s"] = self._time(stage["end_s"])
        return {"event": kind, "stage": moved}

    def _moved_stage(self, stage: dict, path: str) -> dict:
        moved = {**stage, "path": path, "parent": self._relative(stage["parent"]),
                 "start_s": self._time(stage["start_s"])}
        if moved.get("end_s") is not None:
            moved["end_s"] = self._time(stage["end_s"])
        return moved

    def _inside(self, path: str) -> bool:
        """The path of this audit's stage or of one below it."""
        if self.entry is None:
            return False
        top = self.entry["path"]
        return path == top or path.startswith(top + "/")

    def _relative(self, path: str | None) -> str | None:
        """A path below this audit's stage as it is in its own record (None for its stage itself,
        or outside it)."""
        if path is None or self.entry is None or not path.startswith(self.entry["path"] + "/"):
            return None
        return path[len(self.entry["path"]) + 1:]

    def _time(self, t: float) -> float:
        return round(t - self.t0, 6)

    # -- its record's first and last events ---------------------------------------------------

    def _started_event(self) -> dict:
        audit, outer = self.audit, self.outer
        header = outer._log.events[0]  # the outer's run_started
        rss = self.entry["rss"]["start"] if self.entry else None
        return {
            "event": "run_started", "schema": header["schema"], "name": audit.name, "command": audit.command,
            "started_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "device": outer._probe_set.device, "machine": header.get("machine"),
            "environment": machine.environment(), "options": audit.options,
            "process": {"pid": os.getpid(), "rss_at_start": rss, "cwd": os.getcwd()}, "probes": self._probes(),
            **({"rank": audit.rank} if audit.rank else {}),
        }

    def _probes(self) -> dict:
        """The outer's probe states, as shared; those this audit asked for and lacks say why."""
        outer = self.outer
        probes = {key: dict(state) for key, state in outer._probe_set.states.items()}
        for key in WHOLE_PROCESS:
            if probes.get(key, {}).get("state") == "on":
                probes[key] = {"state": "off", "reason": f"recorded for the whole process by the running audit "
                               f"{outer.name!r}: in its folder, {outer.folder}"}
        for key, why in self.unlent.items():
            probes[key] = {"state": "off", "reason": why}
        for option, (probe, flag) in NOT_LENT.items():
            if probe is not None and self.audit.options[option] and not outer.options[option]:
                probes[probe] = {"state": "off", "reason": f"this audit is nested in the running audit {outer.name!r}, "
                               f"which runs without it (probes measure the whole process; give it {flag})"}
        return probes

    def _finished_event(self, exc: BaseException | None, finish_s: float) -> dict:
        audit, outer = self.audit, self.outer
        events = audit._log.events
        own = _finished_stage(outer._log.events, self.entry["id"]) if self.entry else None
        finished = [e["stage"] for e in events if e["event"] == "stage_finished"]
        rss, py_heap, cuda = ((own or {}).get(key) or {} for key in ("rss", "py_heap", "cuda"))
        rss_peak = rss.get("peak", max((s["rss"]["peak"] for s in finished), default=None))
        holder = run_record.peak_stage(finished, rss_peak)
        where = run_record.locate_peak(finished, run_record.unstaged_items(events), rss_peak)
        duration = own["end_s"] - own["start_s"] if own else audit._clock.now()
        return {
            "event": "run_finished", "finished_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "duration_s": round(duration, 6), "device": outer._probe_set.device, "environment": machine.environment(),
            "process": {**events[0]["process"], "rss_at_end": rss.get("end")}, "probes": self._probes(),
            "peak": {"rss": rss_peak, "stage": holder["path"] if holder else None,
                     "stage_id": holder["id"] if holder else None, "where": where,
                     "py_heap": py_heap.get("peak"), "cuda_allocated": cuda.get("peak_allocated")},
            "memray": None, "exit": self.exit_status(exc).to_json(),
            "files": {"events": run_record.EVENTS_FILE, "run": run_record.RUN_FILE},
            "event_log": audit._log.state(written=1), "audit_overhead_s": {"finish_s": round(finish_s, 6)},
        }


def _cannot_lend(key: str) -> str | None:
    """Why the live-tensor meter cannot start now, as the outer's own would not (None: it can)."""
    if key != "live_tensors":
        return None
    lacking = "and the running audit has no live-tensor meter"
    if "torch" not in sys.modules:  # never torch's import for a program without it
        return f"the program had not imported torch when this nested audit began, {lacking}"
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    if _get_current_dispatch_mode_stack():  # a dispatch mode leaves in order: ours would outlive the program's
        return f"a dispatch mode of the program's was open when this nested audit began, {lacking}"
    return None


def _new_meter(key: str) -> Any:
    if key == "live_tensors":
        from auditor.capture.probes.live_tensors import LiveTensorProbe
        return LiveTensorProbe()
    from auditor.capture.probes.python_heap import PythonHeapProbe
    return PythonHeapProbe()


def _after(events: list[dict], start: int, kind: str, stage_id: int) -> int:
    """The index just past the outer's `kind` event of stage `stage_id` (from `start` on)."""
    for index in range(start, len(events)):
        event = events[index]
        if event.get("event") == kind and event["stage"]["id"] == stage_id:
            return index + 1
    return start


def _finished_stage(events: list[dict], stage_id: int) -> dict | None:
    for event in reversed(events):
        if event.get("event") == "stage_finished" and event["stage"]["id"] == stage_id:
            return event["stage"]
    return None
