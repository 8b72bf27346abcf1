"""The audit: owns the probes and the run record for one run.

    with auditor.Audit(out="runs/x", name="prune", memray=True) as audit:
        prune(model)
    audit.record          # the run record (also runs/x/run.json)

`torch_profiler=True` also records a torch.profiler trace with memory, stages as ranges, in
runs/x/profiler/ for TensorBoard (auditor.capture.probes.torch_profiler).

At every stage boundary, open or close, each probe's high-water mark is folded into every
open stage and every thread's current interval (all threads: the meters are process-wide)
and into the run, then reset. A stage or interval open at a boundary has been open since the
previous reset, so each peak is exact, and a child's reset never erases its parent's peak.

An interval is the time on one thread between two of its stage boundaries. One that ends at
the close of the stage that opened it was that stage's own time; every other one is time no
stage covered at its depth (before the first stage, between siblings, between a parent's
boundaries and its children's, after the last stage) and is recorded as `unstaged`, measured
like a stage, so a peak there is located (`peak.where`). The audit's own thread has one from
the start to the end; another thread's begin at its first stage and end at its last.

With the live-tensor meter, each interval's high also brings what was alive at that moment
(auditor.capture.probes.live_tensors, no copy while the program runs): a stage keeps the set of the
interval that held its peak, grouped into `at_peak` rows at its end with the owners of the
census taken then; an unstaged interval's rows get their owners at the next census.

The audited program never breaks because of the audit: a probe that fails mid-run is switched
off (RSS falls back to sampling), an event log that cannot be written (disk full) leaves the
events in memory, a run.json that cannot be written is a warning, and a staged callable the
audit itself uses is a plain call inside the audit's own code (auditor.capture.stage.AUDITOR_CODE).
Each degradation is an AuditorWarning and a line in the record's warnings.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import platform
import secrets
import shlex
import signal
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Set as AbstractSet
from datetime import datetime, timezone
from pathlib import Path

from auditor.capture import ranks
from auditor.capture.probes import child_processes
from auditor.capture.probes import cuda as cuda_probe
from auditor.capture.probes.python_heap import PythonHeapProbe
from auditor.capture.probes.rss import RssProbe
from auditor.capture.stage import AUDITOR_CODE, _set_active, active_audit, in_auditor_code
from auditor.capture.staging.targets import Staging, _labels
from auditor.facts import allocator_retention
from auditor.record import run_folder as run_record


class AuditorWarning(UserWarning):
    """A probe that could not run, or a stage the audit had to close itself."""


class Interrupted(BaseException):
    """Raised in the audited program by a signal that ends it (SIGTERM under `auditor run`),
    as Ctrl-C raises KeyboardInterrupt: its stages close as failed and the record says
    interrupted, naming the signal."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


MAX_INSTANCE_ROOTS = 4096  # objects of staged classes made roots without a call of theirs
_PROBE_NAMES = {"py_heap": "python_heap"}  # a meter's key -> its entry in the record's probes


class _OpenStage:
    """A stage in progress. `peaks` and `at_peak` (what was alive at its live-tensor peak)
    take in every interval inside it, children included."""
    __slots__ = ("entry", "opener", "starts", "peaks", "thread_id", "parent", "at_peak", "frame")

    def __init__(self, entry: dict, opener, starts: dict, peaks: dict, parent: _OpenStage | None):
        self.entry, self.opener, self.starts, self.peaks = entry, opener, starts, peaks
        self.thread_id, self.parent, self.at_peak = threading.get_ident(), parent, None
        self.frame = None  # the program's frame that opened it, while open (census roots)


class _Interval:
    """The time on one thread since its last stage boundary. When it ends at the close of the
    stage that opened it, it was that stage's own time; otherwise no stage covered it at its
    depth, and it becomes an `unstaged` item of the record."""
    __slots__ = ("parent", "after", "opened", "thread", "owner", "start_s", "starts", "peaks",
                 "at_peak")

    def __init__(self, parent: _OpenStage | None, after: str | None, opened: _OpenStage | None,
                 thread: str, start_s: float, readings: dict):
        self.parent, self.after, self.opened = parent, after, opened
        self.thread, self.start_s, self.at_peak = thread, start_s, None
        self.owner = threading.current_thread()  # a thread id is reused once its thread ends
        self.starts = {key: values for key, (values, _) in readings.items()}
        self.peaks = {key: level for key, (_, level) in readings.items()}


class Audit:
    def __init__(self, out: str | os.PathLike | None = None, name: str | None = None, *,
                 memray: bool = False, tracemalloc: bool = False, census: bool = False,
                 cuda_history: bool = False, live_tensors: bool = False, traced: bool = False,
                 torch_profiler: bool = False, stage_targets=(), command: str | None = None,
                 on_stage_end=None, stage_label=None, record_sizes: bool = False,
                 observed_sizes: list | None = None, estimate_sizes: bool = True,
                 rank: dict | None = None):
        """Validates everything (ValueError, one line) and creates nothing until entered.

        `stage_label(target_name, args, kwargs) -> str | None` names what each call of a staged
        callable worked on (auditor.capture.staging.call_labels); None keeps the default label.

        Data-dependent sizes (auditor.capture.tracing.data_dependent): `record_sizes` (a real run) records each
        value-sized operator's output/input ratio per call site in the record's
        `data_dependent_sizes`; a traced run sizes those outputs by `observed_sizes` (that field
        of a real run's record), else by fractions the program declares, and `estimate_sizes=False`
        makes them all empty (the lower bound its estimated bytes are measured against).

        `rank`: this process's rank as its launcher knows it (auditor.capture.staging.spawned_ranks), where the
        environment and torch.distributed do not say it yet; a process group read later confirms it."""
        if stage_label is not None and not callable(stage_label):
            raise ValueError(f"stage_label should be a function (target_name, args, kwargs) -> "
                             f"str | None, not a {type(stage_label).__name__}")
        if observed_sizes is not None and not isinstance(observed_sizes, list):
            raise ValueError("observed_sizes should be a real run's data_dependent_sizes (a list), "
                             f"not a {type(observed_sizes).__name__}")
        self._observed_sizes, self._estimate_sizes = observed_sizes, estimate_sizes
        self.stage_label = stage_label
        self.name = name or "audit"
        self.rank = self._rank_start = rank or ranks.identity()  # torchrun/spawn: its own folder in the shared one
        if self.rank is not None:
            out = ranks.rank_run_folder(out, self.rank)
        self._chosen_folder = out is None  # ours to name: claimed on entry, renamed on a clash
        self.folder = Path(out) if out is not None else new_run_folder(self.name)
        run_record.check_run_folder(self.folder)
        self._staging = Staging(stage_targets)
        # traced: the body runs on fake tensors (auditor.capture.tracing.fake_tensors), so only tensors can be
        # measured; the live-tensor meter and a census of fake storages come with it.
        self.options = dict(memray=memray, tracemalloc=tracemalloc, census=census,
                            cuda_history=cuda_history, live_tensors=live_tensors or traced,
                            traced=traced, torch_profiler=torch_profiler,
                            record_sizes=record_sizes and not traced)
        self.command = command if command is not None else shlex.join([sys.executable, *sys.argv])
        self.on_stage_end = on_stage_end
        self.record: dict | None = None
        self._lock = threading.RLock()
        self._local = threading.local()
        self._open: list[_OpenStage] = []
        self._intervals: dict[int, _Interval] = {}  # thread id -> its interval in progress
        self._unstaged_id = 0
        self._awaiting_owners: list[tuple] = []  # unstaged at_peak sets until the next census
        self._events: list[dict] = []
        self._run_peaks: dict[str, int] = {}
        self._calls: dict[str, int] = {}
        self._roots: dict[str, tuple] = {}
        self._instances_named = 0  # roots the census found as objects of a staged class
        self._found_roots: set[str] = set()  # their names, until a call of theirs names them
        self._receivers: set[str] = set()  # roots the audit registered itself (after the tracked)
        self._highs = None  # censuses near live-tensor highs inside stages (auditor.capture.census.census_at_highs)
        self._next_id = 0
        self._excluded_s = 0.0
        self._excluded_spans: list[tuple[float, float]] = []  # (perf_counter start, seconds) of each
        self._overhead = {"boundaries_s": 0.0, "census_s": 0.0, "labels_s": 0.0, "finish_s": 0.0}
        self._entered = False
        self.record_written = False  # run.json on disk (a full disk can cost it, not the run)
        self.workers_audited = False  # workers it spawned audit the stage targets (auditor.capture.staging.spawned_ranks)
        # Set when the audit is entered (`_start`, `_start_probes`): the run's process, clock and
        # event log, and the probes that run (None: off).
        self._pid, self._t0, self._audit_thread = 0, 0.0, 0
        self._dir = self.folder
        self._log: run_record.EventLog | None = None
        self._log_warned = False
        self._pending_warnings: list[str] = []
        self._meters: list = []
        self._probes: dict[str, dict] = {}
        self._memray = self._torch_profiler = self._cuda = self._history = None
        self._tracing = self._value_free = self._sizes = self._live = None
        self._take_census = self._census_root = None

    @property
    def stage_targets(self) -> list:
        """The resolved stage targets (auditor.capture.staging.targets.Target), in the order given."""
        return self._staging.targets

    @property
    def run_json(self) -> Path:
        return self.folder / run_record.RUN_FILE

    # -- start and finish ----------------------------------------------------------------

    def __enter__(self) -> Audit:
        with AUDITOR_CODE:
            return self._start()

    def _start(self) -> Audit:
        if self._entered:
            raise RuntimeError("an Audit runs once; create a new one")
        if active_audit() is not None:
            raise RuntimeError("another audit is already active in this process")
        self._entered = True
        self._pid = os.getpid()
        self._t0 = time.perf_counter()
        started_at = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        self._staging.apply()  # first: the one step that can still refuse, before any file
        self._meters, self._memray, self._torch_profiler, self._log = [], None, None, None
        self._log_warned = False
        try:
            if self._chosen_folder:
                self.folder = _claim(self.folder, self.name)
            self._dir = Path(os.path.abspath(self.folder))  # where files go, whatever the
            self._log = run_record.EventLog(self._dir)      # program does with its cwd
            self._pending_warnings = []
            probes = self._start_probes()
            self._reset_meters()  # the probes' own start (the meter's scan of objects) is no peak
            readings = self._read_meters()
            rss_at_start = readings["rss"][0]
            self._run_peaks["rss"] = rss_at_start
            self._audit_thread = threading.get_ident()  # the live-tensor meter counts its operators
            self._intervals[self._audit_thread] = _Interval(
                None, None, None, threading.current_thread().name, round(self._clock(), 6), readings)
            self._emit({
                "event": "run_started", "schema": run_record.SCHEMA, "name": self.name,
                "command": self.command, "started_at": started_at, "device": self._device(),
                "machine": _machine(), "environment": _environment(), "options": self.options,
                "process": {"pid": os.getpid(), "rss_at_start": rss_at_start, "cwd": os.getcwd()}, "probes": probes,
                **({"rank": self.rank} if self.rank else {}),
            }, durable=True)
            self._children_before = child_processes.ended_peak_rss()  # after platform.platform()'s `uname -p`
            self._child_watch = child_processes.ChildWatch()
        except BaseException:
            self._abandon()
            raise
        for message in self._pending_warnings:
            self._warn(message)
        _set_active(self)
        return self

    def _abandon(self) -> None:
        """Undo a start that failed half-way: no tracker, trace or patch left behind."""
        if self._memray is not None:
            self._memray.stop()
        if self._torch_profiler is not None:
            self._torch_profiler.stop()
        self._close_highs()
        for meter in reversed(self._meters):
            meter.close()
        self._stop_tracing()
        if self._log is not None:
            self._log.close()
        self._staging.restore()

    def _start_probes(self) -> dict:
        if self.options["torch_profiler"]:  # built (torch imported) before the run's peak counts
            from auditor.capture.probes.torch_profiler import TorchProfilerTrace
            self._torch_profiler = TorchProfilerTrace(self._dir)
        rss = RssProbe()
        rss.reset()  # the run's peak counts from here, not from the process's past
        self._meters = [rss]
        self._probes = probes = {"rss": rss.describe()}
        if rss.reason:
            self._pending_warnings.append(rss.reason)
        self._cuda = None
        probes["cuda"] = {"state": "pending"}
        probes["python_heap"] = {"state": "off"}
        if self.options["tracemalloc"]:
            heap = PythonHeapProbe()
            self._meters.append(heap)
            probes["python_heap"] = heap.describe()
        self._poll_cuda()
        self._tracing = None
        probes["traced"] = {"state": "off"}
        if self.options["traced"]:  # before the meter: the meter must see fake tensors
            from auditor.capture.tracing.fake_tensors import traced
            self._tracing = traced(self._observed_sizes, self._estimate_sizes)
            self._value_free = self._tracing.__enter__()
            probes["traced"] = {"state": "on", "method": "FakeTensorMode, values read as 0, "
                                "data-dependent sizes estimated (auditor.capture.tracing.data_dependent)"}
        self._sizes = None  # the real run's data-dependent sizes, before the meter (modes nest)
        if self.options["record_sizes"]:
            from auditor.capture.tracing.data_dependent import SizeRecorder
            self._sizes = SizeRecorder()
            self._sizes.__enter__()
        probes["live_tensors"] = {"state": "off"}
        self._live = None  # the live-tensor meter, while it runs: its at_peak sets
        if self.options["live_tensors"]:
            from auditor.capture.probes.live_tensors import LiveTensorProbe
            self._live = live = LiveTensorProbe()
            self._meters.append(live)
            probes["live_tensors"] = live.describe()
        self._take_census = None
        probes["census"] = {"state": "off"}
        if self.options["census"]:
            probes["census"] = self._load_census()
        self._highs = None
        if self._take_census is not None and self._live is not None:
            try:
                from auditor.capture.census.census_at_highs import CensusAtHighs
                self._highs = CensusAtHighs(self.live_tensor_bytes, self._live_tensor_high,
                                            self._in_program_stage, self._census_at_high)
            except Exception as error:  # stage-end censuses still run
                self._pending_warnings.append(f"no census inside stages (torch's global hooks: "
                                              f"{type(error).__name__}: {error})")
        self._history = None
        probes["cuda_history"] = {"state": "off"}
        if self.options["cuda_history"]:
            self._history = cuda_probe.CudaHistory()
            probes["cuda_history"] = self._history.state
            if not self._history.on:
                reason = self._history.state["reason"]
                self._pending_warnings.append(f"CUDA memory history absent: {reason}")
        probes["torch_profiler"] = {"state": "off"}
        if self._torch_profiler is not None:  # late, for the same reason as memray
            self._torch_profiler.start()
            probes["torch_profiler"] = self._torch_profiler.state
            if not self._torch_profiler.on:
                reason = self._torch_profiler.state["reason"]
                self._pending_warnings.append(f"torch profiler absent: {reason}")
        self._memray = None
        probes["memray"] = {"state": "off"}
        if self.options["memray"]:  # last, so its trace holds as little of our setup as possible
            from auditor.capture.probes.memray_trace import MemrayTrace
            self._memray = MemrayTrace(self._dir)
            probes["memray"] = self._memray.state
            if not self._memray.on:
                self._pending_warnings.append(f"memray absent: {self._memray.state['reason']}")
        return probes

    def _load_census(self) -> dict:
        try:
            census = importlib.import_module("auditor.capture.census.take")
            self._take_census, self._census_root = census.take_census, census.Root
        except (ImportError, AttributeError) as error:
            reason = f"auditor.capture.census.take is unavailable ({error})"
            self._pending_warnings.append(f"census absent: {reason}")
            return {"state": "absent", "reason": reason}
        return {"state": "on"}

    def __exit__(self, exc_type, exc, tb) -> bool:
        if os.getpid() != self._pid:  # a forked child leaving the block: the parent's record
            return False              # and log are not its to write
        with AUDITOR_CODE:
            try:
                self._finish(exc)
            finally:
                self._log.close()
        return False

    def _finish(self, exc) -> None:
        began = time.perf_counter()
        end_s = self._clock()
        try:
            with self._lock:
                for left in reversed(list(self._open)):
                    self._warn(f"stage {left.entry['path']!r} was still open when the audit "
                               "ended; closed it there")
                    if left in self._thread_stack():
                        self._thread_stack().remove(left)
                    self._finish_stage(left, end_s, exc)
        finally:  # whatever failed above, the program gets its own callables back
            _set_active(None)
            self._staging.restore()
        for target in self._staging.targets:
            if target.name not in self._calls and not self.workers_audited:  # theirs: in their records
                self._warn(self._staging.never_called(target))
        self._close_highs()
        ends = self._final_readings()
        self._end_run_intervals(end_s, ends)
        for meter in reversed(self._meters):  # dispatch modes leave in the reverse order
            self._close_meter(meter)  # before reading the memray trace: tracemalloc would slow it
        self._stop_tracing()
        memray_on = self._memray is not None and self._memray.on
        if memray_on:  # before the profiler writes its trace: that is no allocation of the run
            self._memray.stop()
        self._stop_torch_profiler()
        memray = self._finish_memray() if memray_on else None
        self._overhead["finish_s"] = time.perf_counter() - began
        self._emit(self._finish_event(end_s, ends, memray, exc), durable=True)
        self._write_record()  # the record first: a full disk then costs only the optional files
        files, probes = self._write_artifacts(memray)
        if files or probes:
            self._emit({"event": "artifacts", "files": files, "probes": probes}, durable=True)
            self._write_record()

    def _stop_torch_profiler(self) -> None:
        if self._torch_profiler is None or not self._torch_profiler.on:
            return
        try:
            self._torch_profiler.stop()
        except Exception as error:  # a profiler that fails must not cost the record
            reason = f"{type(error).__name__}: {error}"
            self._probes["torch_profiler"] = {"state": "failed", "reason": reason}
            self._warn(f"torch profiler did not stop cleanly: {reason}")

    def _write_record(self) -> None:
        self.record = run_record.assemble(self._events)
        try:
            run_record.write_json_atomically(self._dir / run_record.RUN_FILE, self.record)
        except OSError as error:
            kept = ("an earlier run.json stays" if self.record_written else
                    f"`auditor rebuild {self.folder}` writes it from {run_record.EVENTS_FILE} once there is space"
                    if self._log.failure is None else
                    f"{run_record.EVENTS_FILE} holds the first {self._log.lines} events")
            self._warn(f"{run_record.RUN_FILE} could not be written ({error.strerror or error}); {kept}")
            return
        self.record_written = True

    def _write_artifacts(self, memray) -> tuple[dict, dict]:
        """The optional files, after the record: flamegraph, profiler trace, CUDA history.
        Returns the files written and, for each that was not, its probe's failed state."""
        writers = {}
        if memray is not None:
            writers["flamegraph"] = ("memray", self._memray.write_flamegraph)
        if self._torch_profiler is not None and self._probes["torch_profiler"].get("state") == "on":
            writers["torch_profiler"] = ("torch_profiler", self._torch_profiler.write)
        if self._history is not None and self._history.on:
            writers["cuda_history"] = ("cuda_history", self._write_cuda_history)
        files, probes = {}, {}
        for key, (probe, write) in writers.items():
            try:
                name = write()
                reason = None if name else f"no {key.replace('_', ' ')} file was written"
            except Exception as error:  # a full disk costs this file, never the record
                name, reason = None, f"{type(error).__name__}: {error}"
            if name:
                files[key] = name
            else:
                probes[probe] = {**self._probes.get(probe, {}), "state": "failed", "reason": reason}
                self._warn(f"{key.replace('_', ' ')} was not written: {reason}")
        return files, probes

    def _write_cuda_history(self) -> str:
        name = self._history.finish(self._dir)
        if name is None:
            raise RuntimeError(self._history.state.get("reason", "no snapshot was written"))
        return name

    def _final_readings(self) -> dict:
        with self._lock:
            self._poll_cuda()
            ends = {key: values for key, (values, _) in self._read_meters().items()}
        if self._cuda is None:
            self._probes["cuda"] = {"state": "absent", "reason": cuda_probe.absence_reason()}
        return ends

    def _finish_memray(self) -> dict | None:
        try:
            return self._memray.summarize()
        except Exception as error:  # a broken trace must not cost the rest of the record
            reason = f"{type(error).__name__}: {error}"
            self._probes["memray"] = {"state": "failed", "reason": reason}
            self._warn(f"memray trace could not be read: {error}")
            return None

    def _children(self) -> dict:
        """`process.children`, where the program's child processes held memory (never audited)."""
        try:
            children = child_processes.at_end(self._children_before, self._child_watch)
        except Exception as error:  # a probe that fails costs its figure, never the record
            self._warn(f"child processes could not be read: {type(error).__name__}: {error}")
            return {}
        return {"children": children} if children else {}

    def _read_children(self, stage: str, at_s: float) -> None:
        try:
            self._child_watch.at_stage_end(stage, at_s)
        except Exception as error:  # a probe that fails costs its figure, never the record
            self._warn(f"child processes could not be read at the end of {stage}: {type(error).__name__}: {error}")

    def _finish_event(self, end_s, ends, memray, exc) -> dict:
        finished = [e["stage"] for e in self._events if e["event"] == "stage_finished"]
        holder = run_record.peak_stage(finished, self._run_peaks["rss"])
        where = run_record.locate_peak(finished, run_record.unstaged_items(self._events),
                                       self._run_peaks["rss"])
        peak = {"rss": self._run_peaks["rss"], "stage": holder["path"] if holder else None,
                "stage_id": holder["id"] if holder else None, "where": where,
                "py_heap": self._run_peaks.get("py_heap"),
                "cuda_allocated": self._run_peaks.get("cuda")}
        if memray is not None:  # the stage open at memray's high-water time, from its snapshots
            memray.update(self._memray.place(finished, self._seconds_at, peak))
        rank = {}
        if self.rank is not None:  # torch.distributed, initialised by now, has the last word
            rank["rank"], mismatch = ranks.at_end(self._rank_start, self.rank)
            if mismatch:
                self._warn(mismatch)
        files = {"events": run_record.EVENTS_FILE, "run": run_record.RUN_FILE}
        if memray:
            files.update(memray=memray["file"])
        children = self._children()  # first: nothing of the auditor's own has started a process yet
        return {
            "event": "run_finished",
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "duration_s": round(end_s, 6), "device": self._device(), "environment": _environment(),
            "process": {**self._events[0]["process"], "rss_at_end": ends["rss"], **children},
            "probes": self._probes, "peak": peak, "memray": memray, "exit": _exit_status(exc),
            "files": files, "event_log": self._log_state(written=1),
            "audit_overhead_s": {k: round(v, 6) for k, v in self._overhead.items()}, **rank,
        }

    # -- stages --------------------------------------------------------------------------

    def open_stage(self, name: str, opener, call: dict | None = None) -> None:
        """`call`: the staged call this stage is ({"target", "index", "label"}), or None."""
        try:
            self._open_stage(name, opener, call)
        except Exception as error:  # the audit's own failure never reaches the program
            self._fault(f"opening stage {name!r}", error)

    def close_stage(self, opener, exc: BaseException | None) -> None:
        try:
            self._close_stage(opener, exc)
        except Exception as error:
            self._fault("closing a stage", error)

    def _fault(self, doing: str, error: Exception) -> None:
        self._warn(f"the audit failed {doing} ({type(error).__name__}: {error}); the program "
                   "goes on, the record may lack this stage")

    def _open_stage(self, name: str, opener, call: dict | None = None) -> None:
        began = time.perf_counter()
        with self._lock:
            self._poll_cuda()
            stack = self._thread_stack()
            parent = stack[-1].entry["path"] if stack else None
            readings = self._read_meters(reset=True)
            starts = {key: values for key, (values, _) in readings.items()}
            peaks = {key: level for key, (_, level) in readings.items()}
            self._next_id += 1
            entry = {"id": self._next_id, "name": name,
                     "path": name if parent is None else f"{parent}/{name}", "parent": parent,
                     "thread": threading.current_thread().name, "start_s": round(self._clock(), 6),
                     "rss": {"start": starts["rss"]}, "call": call}
            opened = _OpenStage(entry, opener, starts, peaks, stack[-1] if stack else None)
            if self._take_census is not None:  # a census loaded torch: so may its roots
                from auditor.capture.census import discovered_roots
                opened.frame = discovered_roots.opener_frame(sys._getframe())
            self._open.append(opened)
            stack.append(opened)
            self._end_interval(opened.thread_id, entry["start_s"], starts, before=entry["path"])
            self._intervals[opened.thread_id] = _Interval(opened, None, opened, entry["thread"],
                                                          entry["start_s"], readings)
            self._follow(opened.thread_id, entry["path"])
            self._emit({"event": "stage_started", "stage": entry})
            if self._history is not None:
                self._history.label(entry["path"])
            self._overhead["boundaries_s"] += time.perf_counter() - began

    def _close_stage(self, opener, exc: BaseException | None) -> None:
        end_s = self._clock()
        began, census_before = time.perf_counter(), self._overhead["census_s"]
        with self._lock:
            stack = self._thread_stack()
            if not stack or stack[-1].opener is not opener:
                return  # opened before this audit began
            closing = stack.pop()
            self._poll_cuda()
            entry = self._finish_stage(closing, end_s, exc)
            if self._history is not None:
                self._history.label(closing.entry["parent"])
            census_s = self._overhead["census_s"] - census_before
            self._overhead["boundaries_s"] += time.perf_counter() - began - census_s
        if self.on_stage_end is not None:
            try:
                self.on_stage_end(entry)
            except Exception as error:  # a broken progress display must not break the user's code
                self.on_stage_end = None
                self._warn(f"on_stage_end failed, switched off: {type(error).__name__}: {error}")

    def _finish_stage(self, closing: _OpenStage, end_s: float, exc) -> dict:
        readings = self._read_meters(reset=True)  # the interval after the close has its own peak
        ends = {key: values for key, (values, _) in readings.items()}
        self._open.remove(closing)
        if self.rank is not None:  # the process group's own figures, once the program made one
            self.rank = ranks.confirmed(self.rank)
        started, end_s = closing.entry, round(end_s, 6)
        self._end_interval(closing.thread_id, end_s, ends, closing=closing)
        alive = self._alive(closing.at_peak)
        fields = self._meter_fields(closing.starts, ends, closing.peaks)
        failed = _is_failure(exc)
        entry = {"id": started["id"], "name": started["name"], "path": started["path"],
                 "parent": started["parent"], "status": "failed" if failed else "ok",
                 "call": started.get("call"),
                 "start_s": started["start_s"], "end_s": end_s, **fields,
                 "components": None, "tensors": None, "thread": started["thread"],
                 "error": _describe(exc) if failed else None}
        census = None
        if self._take_census is not None:
            entry["components"], entry["tensors"], census = self._census(closing)
        closing.frame = None
        if entry["live_tensors"] is not None:
            entry["live_tensors"]["at_peak"] = self._at_peak(closing.at_peak, alive, census)
        self._emit({"event": "stage_finished", "stage": entry}, durable=True)
        if started["parent"] is None:  # the children's memory, at top-level stage ends only (cheap)
            self._read_children(started["path"], end_s)
        parent = closing.parent
        self._intervals[closing.thread_id] = _Interval(parent, started["path"], None,
                                                       started["thread"], end_s, readings)
        self._follow(closing.thread_id, parent.entry["path"] if parent else None)
        return entry

    # -- unstaged intervals ----------------------------------------------------------------

    def _end_interval(self, thread_id: int, end_s: float, ends: dict,
                      closing: _OpenStage | None = None, before: str | None = None) -> None:
        """End a thread's interval at a stage boundary (`closing`'s close, or the open of the
        stage `before`); emit it as `unstaged` unless it was the closing stage's own time."""
        interval = self._intervals.pop(thread_id, None)
        if interval is None or (closing is not None and interval.opened is closing):
            return  # the thread's first stage, or a stage without children: no gap
        if not end_s > interval.start_s or interval.owner is not threading.current_thread():
            return  # empty; or left by an ended thread whose id a new one reuses
        parent = interval.parent
        self._unstaged_id += 1
        item = {"id": self._unstaged_id, "parent": parent.entry["path"] if parent else None,
                "parent_id": parent.entry["id"] if parent else None,
                "after": interval.after, "before": before, "thread": interval.thread,
                "start_s": interval.start_s, "end_s": end_s,
                **self._meter_fields(interval.starts, ends, interval.peaks)}
        if item["live_tensors"] is not None:
            alive = self._alive(interval.at_peak)
            at_peak = item["live_tensors"]["at_peak"] = self._at_peak(interval.at_peak, alive, None)
            if at_peak is not None and self._take_census is not None:  # owners: at the next census
                self._awaiting_owners.append((item["id"], interval.at_peak, alive))
        self._emit({"event": "unstaged", "unstaged": item})

    def _end_run_intervals(self, end_s: float, ends: dict) -> None:
        """The audit thread's time after its last top-level stage. Other threads' last
        intervals are dropped: when those threads stopped working is unknown."""
        try:
            with self._lock:
                intervals, self._intervals = self._intervals, {}
                if self._audit_thread in intervals:
                    self._intervals[self._audit_thread] = intervals[self._audit_thread]
                    self._end_interval(self._audit_thread, round(end_s, 6), ends)
                if self._awaiting_owners and self._take_census is not None:
                    self._census()  # the owners of what the last intervals held
        except Exception as error:
            self._fault("recording the time after the last stage", error)

    def _meter_fields(self, starts: dict, ends: dict, peaks: dict) -> dict:
        """A stage's or an interval's reading of each meter: start, end and peak."""
        meters = {meter.key: meter for meter in self._meters}
        return {key: meters[key].entry(starts[key], ends[key], peaks[key])
                if key in meters and key in starts and key in ends else None
                for key in ("rss", "py_heap", "cuda", "live_tensors")}

    def _follow(self, thread_id: int, path: str | None) -> None:
        """Tell the live-tensor meter the innermost stage open on the thread it counts."""
        if self._live is not None and thread_id == self._audit_thread:
            self._live.set_stage(path)

    def _alive(self, peak_set) -> set:
        if peak_set is None or self._live is None:
            return set()
        try:
            return self._live.alive(peak_set)
        except Exception as error:
            self._meter_failed(self._live, error)
            return set()

    def _at_peak(self, peak_set, alive: set, census: dict | None) -> dict | None:
        """What was alive at a live-tensor peak, grouped; None if the meter is off."""
        if peak_set is None or self._live is None:
            return None
        try:
            return self._live.at_peak(peak_set, alive, census)
        except Exception as error:
            self._meter_failed(self._live, error)
            return None

    def _resolve_owners(self, census: dict | None) -> None:
        """The owners this census found: kept on the live-tensor meter's rows (a storage freed
        later is still named), and given to the unstaged intervals' at_peak that wait for them."""
        awaiting, self._awaiting_owners = self._awaiting_owners, []
        if census is None or self._live is None:
            return
        try:
            self._live.note_owners(census)
        except Exception as error:
            self._meter_failed(self._live, error)
            return
        for unstaged_id, peak_set, alive in awaiting:
            at_peak = self._at_peak(peak_set, alive, census)
            if at_peak is not None:
                self._emit({"event": "unstaged_at_peak", "id": unstaged_id, "at_peak": at_peak})

    def mark(self, name: str) -> None:
        try:
            self._mark(name)
        except Exception as error:
            self._fault(f"reading mark {name!r}", error)

    def _mark(self, name: str) -> None:
        with self._lock:
            self._poll_cuda()
            readings = {key: values for key, (values, _) in self._read_meters().items()}
            stack = self._thread_stack()
            stage_path = stack[-1].entry["path"] if stack else None
            self._emit({"event": "mark", "mark": {
                "name": name, "stage": stage_path, "t_s": round(self._clock(), 6),
                "thread": threading.current_thread().name, "rss": readings["rss"],
                "py_heap": readings.get("py_heap"), "cuda": readings.get("cuda")}})

    def annotate(self, key: str, value) -> None:
        """Add a field to the run record (e.g. the workload it ran), written to the log now."""
        if key in run_record.RESERVED:
            raise ValueError(f"{key!r} is a run-record field the audit writes itself")
        with AUDITOR_CODE:
            self._emit({"event": "annotation", "key": key, "value": value}, durable=True)

    def _stop_tracing(self) -> None:
        if getattr(self, "_sizes", None) is not None:
            self._sizes.__exit__(None, None, None)
            self._emit({"event": "annotation", "key": "data_dependent_sizes", "value": self._sizes.entries()})
            self._sizes = None
        if getattr(self, "_tracing", None) is None:
            return
        self._tracing.__exit__(None, None, None)
        self._tracing = None
        self._emit({"event": "annotation", "key": "traced",
                    "value": {"data_dependent_ops": dict(self._value_free.data_dependent),
                              "estimated_sizes": self._value_free.estimates.entries()}})

    def numbered(self, name: str) -> str:
        """`name` for the first call, then `name#2`, `name#3`... (staged targets)."""
        with self._lock:
            count = self._calls[name] = self._calls.get(name, 0) + 1
        return name if count == 1 else f"{name}#{count}"

    # -- probes --------------------------------------------------------------------------

    def _read_meters(self, reset: bool = False) -> dict[str, tuple]:
        """Each meter's (values, level), its high-water mark folded into the open stages and
        the run; `reset` starts a new peak interval. A meter that fails is switched off."""
        readings = {}
        for meter in list(self._meters):
            try:
                values, level, high = meter.read()
                at_peak = meter is self._live and meter.keeps_composition
                self._fold(meter.key, high, meter.peak_set if at_peak else None)
                if reset:
                    meter.reset()
            except Exception as error:
                if not self._meter_failed(meter, error):
                    continue
                values, level, high = meter.read()
                self._fold(meter.key, high)
            readings[meter.key] = (values, level)
        return readings

    def _reset_meters(self) -> None:
        for meter in list(self._meters):
            try:
                meter.reset()
            except Exception as error:
                if self._meter_failed(meter, error):
                    meter.reset()

    def _meter_failed(self, meter, error: Exception) -> bool:
        """Switch a failing meter off, with a warning; RSS, always measured, falls back to
        sampling instead. True when the meter can be read again."""
        what = f"{type(error).__name__}: {error}"
        if meter.key == "rss" and meter.method != "sampler":
            meter.fall_back(f"reading or resetting VmHWM failed mid-run ({what})")
            self._probes["rss"] = meter.describe()
            self._warn(f"RSS probe: {meter.reason}")
            return True
        self._meters.remove(meter)
        if meter is self._live:
            self._live = None
        self._close_meter(meter)
        self._probes[_PROBE_NAMES.get(meter.key, meter.key)] = {"state": "failed", "reason": what}
        self._warn(f"the {meter.key} probe failed and was switched off: {what}")
        return False

    def _close_meter(self, meter) -> None:
        try:
            meter.close()
        except Exception as error:
            self._warn(f"the {meter.key} probe did not close cleanly: {type(error).__name__}: {error}")

    def _fold(self, key: str, high: int, peak_set=None) -> None:
        """A meter's high-water mark into every open stage and interval (all threads: the
        meters are process-wide) and the run. `peak_set()`: what was alive at that high (the
        live-tensor meter), taken where it is a new peak, built at most once."""
        targets = [*self._open, *self._intervals.values()]
        if peak_set is not None:
            taken = None
            for target in targets:
                if key in target.peaks and (target.at_peak is None or high > target.peaks[key]):
                    taken = peak_set() if taken is None else taken
                    target.at_peak = taken
        for target in targets:
            if high > target.peaks.get(key, high):
                target.peaks[key] = high
        if high > self._run_peaks.get(key, -1):
            self._run_peaks[key] = high

    def _poll_cuda(self) -> None:
        """Switch the CUDA probe on once the audited code has initialized CUDA."""
        if self._cuda is not None or "torch" not in sys.modules:
            return
        cuda = cuda_probe.initialized_cuda()
        if cuda is None:
            return
        self._cuda = cuda_probe.CudaProbe(cuda)
        values, level, high = self._cuda.read()
        self._cuda.reset()
        for opened in [*self._open, *self._intervals.values()]:  # no GPU memory before CUDA
            opened.starts["cuda"], opened.peaks["cuda"] = dict(cuda_probe.CudaProbe.ZERO), high
        # Initialized during the run: all of its peak is the run's; before it: count from now.
        self._run_peaks["cuda"] = high if "rss" in self._run_peaks else level
        self._meters.append(self._cuda)
        self._probes["cuda"] = self._cuda.describe()

    def _device(self) -> str:
        return self._cuda.device if self._cuda is not None else "cpu"

    # -- census --------------------------------------------------------------------------

    def track(self, name: str, obj, categories: dict[str, str] | None = None) -> None:
        if self._take_census is None:
            return  # census off: holding a reference would only keep memory alive
        with self._lock:
            self._roots[name] = (_reference(obj), categories)

    def track_receiver(self, obj, label: str | None = None, found: bool = False) -> str | None:
        """Register a staged method's `self` under its class name and its call's label
        (`SparseGPT[model.layers.3.mlp.down_proj]`), else `SparseGPT`, `SparseGPT#2`; once per
        object. Returns the root's name. `found`: met by the census, not in a call; its first
        call's label (a user hook's) renames it if it differs."""
        if self._take_census is None:
            return None
        with self._lock:
            base = type(obj).__name__ if label is None else f"{type(obj).__name__}[{label}]"
            for name, (ref, _) in list(self._roots.items()):
                if ref() is obj:
                    if found or name not in self._found_roots:
                        return name
                    self._found_roots.discard(name)
                    if name == base or name.startswith(base + "#"):
                        return name
                    del self._roots[name]  # named by the default rule; the call names it now
                    break
            name, count = base, 1
            while name in self._roots and self._roots[name][0]() is not None:
                count += 1
                name = f"{base}#{count}"
            self._roots[name] = (_reference(obj), None)
            self._receivers.add(name)
            if found:
                self._found_roots.add(name)
            return name

    def _name_instance(self, obj) -> str | None:
        """A live object of a staged method's class that no call has met yet: a root named
        as its calls would name it (the census asks, auditor.capture.census.take.take_census)."""
        if self._instances_named >= MAX_INSTANCE_ROOTS:
            return None
        ready, label = _labels(self).instance_label(obj)
        if not ready:
            return None
        self._instances_named += 1
        return self.track_receiver(obj, label, found=True)

    @contextlib.contextmanager
    def own_work(self, kind: str, transient_memory: bool = False):
        """The auditor's own work inside the run (labelling a staged call): its time is kept
        out of the stages, like the census's, and counted in the overhead under `kind`. With
        `transient_memory` (a scan of every object), the peaks reached so far are folded in
        first and the meters reset after, so its memory counts in no peak."""
        if transient_memory:
            with self._lock:
                self._read_meters()
        began = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                if transient_memory:
                    self._reset_meters()
                self._keep_out(began, kind)

    def _census(self, closing: _OpenStage | None = None) -> tuple[dict | None, dict | None, dict | None]:
        """Tensor census at a stage end (`closing`'s) or inside stages; its time and transient
        memory are kept out of stages. Returns components, tensors, and {"owners",
        "components"} when the live-tensor meter needs owners and the census gives them (also
        resolving unstaged intervals' owners)."""
        began = time.perf_counter()
        try:
            roots = self._census_roots(closing)
        except Exception as error:  # roots found are a help: never the census's failure
            self._warn(f"census roots could not be found, only the tracked ones count: "
                       f"{type(error).__name__}: {error}")
            roots = self._tracked_roots(self._receivers)
        owners = self._live is not None  # the meter matches its storages to their owners
        # reference cycles: checked at top-level stage ends and the run's end (auditor.capture.census.reference_cycles)
        extra = {"find_cycles": True} if not self._thread_stack() else {}
        census = None
        classes = self._staging.receiver_classes()
        if classes:  # every object of a staged method's class, called yet or not, is a root
            extra.update(instances_of=classes, name_instance=self._name_instance)
        try:
            if owners:  # unowned storages are named by the line that allocated them
                extra["sites"] = self._live.sites()
                result = self._take_census(roots, count_fake=self.options["traced"], with_owners=True, **extra)
                census = {"owners": result["owners"], "components": result["components"]}
            else:
                result = self._take_census(roots, count_fake=self.options["traced"], **extra)
            components, tensors = result["components"], {"live_bytes": result["live_tensor_bytes"]}
            if "cycle_check" in result:  # what was checked, found, left unknown
                tensors["cycle_check"] = result["cycle_check"]
        except Exception as error:
            self._warn(f"census failed, switched off: {type(error).__name__}: {error}")
            self._take_census = None
            components, tensors = None, None
        self._resolve_owners(census)
        self._reset_meters()  # the census's own allocations belong to no stage
        self._keep_out(began, "census_s")
        return components, tensors, census

    def _tracked_roots(self, leave_out: AbstractSet[str] = frozenset()) -> dict:
        roots = {}
        for name, (ref, categories) in list(self._roots.items()):
            obj = ref()
            if obj is not None and name not in leave_out:
                roots[name] = self._census_root(obj=obj, categories=categories)
        return roots

    def _census_roots(self, closing: _OpenStage | None) -> dict:
        """The roots in their order of priority: those the program tracked, then the modules and
        optimizers found alive (auditor.capture.census.discovered_roots), then the receivers of staged methods
        and the program's objects held by the frames inside the open stages."""
        from auditor.capture.census import discovered_roots  # imports torch: only once a census runs
        stack = self._thread_stack()
        outermost = stack[0] if stack else closing
        last = outermost.frame if outermost is not None else None
        caller = sys._getframe(1)  # never this frame itself: a frame in its own locals is a cycle
        try:
            taken = {name: ref() for name, (ref, _) in list(self._roots.items())}
            found, instances = discovered_roots.found_roots(
                {name: obj for name, obj in taken.items() if obj is not None},
                discovered_roots.program_frames(caller),
                discovered_roots.frames_until(caller, last) if last is not None else [])
            taken.clear()
        finally:  # the frames (and all they hold) must not outlive this census
            del caller, last, outermost
        for obj in instances:
            self.track_receiver(obj, None, found=True)
        del instances
        given = self._tracked_roots()
        roots = {name: root for name, root in given.items() if name not in self._receivers}
        for name, obj in found:
            roots[name] = self._census_root(obj=weakref.ref(obj))
        found.clear()
        roots.update((name, root) for name, root in given.items() if name in self._receivers)
        return roots

    def _live_tensor_high(self) -> int | None:
        """The live-tensor meter's high since its last reset (a boundary or a census)."""
        return self._live.read()[2] if self._live is not None else None

    def _in_program_stage(self) -> bool:
        """The program (not the auditor) runs inside a stage on this thread."""
        return not in_auditor_code() and bool(self._thread_stack())

    def _census_at_high(self) -> None:
        """A census inside a stage (auditor.capture.census.census_at_highs): the peaks so far are folded into
        the open stages first, so its own memory counts in none; it names the live storages."""
        with AUDITOR_CODE:
            try:
                with self._lock:
                    self._read_meters()
                    self._census()
            except Exception as error:
                self._fault("taking a census near a live-tensor high", error)

    def _close_highs(self) -> None:
        if self._highs is not None:
            self._probes.setdefault("census", {})["census_at_highs"] = self._highs.taken
            self._highs.close()
            self._highs = None

    def _keep_out(self, began: float, kind: str) -> None:
        """The auditor's own work since perf_counter `began`: out of every stage's time (the
        clock skips it, _seconds_at too) and into the overhead under `kind`."""
        spent = time.perf_counter() - began
        self._excluded_s += spent
        self._excluded_spans.append((began, spent))
        self._overhead[kind] = self._overhead.get(kind, 0.0) + spent

    # -- plumbing ------------------------------------------------------------------------

    def _clock(self) -> float:
        """Seconds since the audit began, census time excluded."""
        return time.perf_counter() - self._t0 - self._excluded_s

    def _seconds_at(self, perf: float) -> float:
        """The audit's seconds (like _clock: census and own work excluded) at perf_counter `perf`."""
        kept_out = sum(min(spent, max(0.0, perf - began)) for began, spent in self._excluded_spans)
        return perf - self._t0 - kept_out

    def live_tensor_bytes(self) -> int | None:
        """Bytes of live tensors now, when the live-tensor meter runs (auditor.capture.tracing.size_profiles
        compares a real and a traced run's at the same call)."""
        return self._live.read()[0] if self._live is not None else None

    def open_stages(self) -> list[dict]:
        """The stages open on this thread, outermost first (each as it started: id, path): what
        data-dependent sizes are placed by (auditor.capture.tracing.size_profiles)."""
        return [opened.entry for opened in self._thread_stack()]

    def _thread_stack(self) -> list:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _emit(self, event: dict, durable: bool = False) -> None:
        """Into the record (memory) and the log; a log that fails warns once, never raises."""
        self._events.append(event)  # first: a Ctrl-C in the write leaves no logged event unrecorded
        written = self._log.write(event, durable)
        if written or self._log_warned:
            return
        self._log_warned = True
        if "event_log" in event:  # the run_finished line itself failed
            event["event_log"] = self._log_state()
        self._warn(f"{self._log.failure}; the log stops at its last whole line ({self._log.lines} "
                   f"events) and the run goes on, its events kept for {run_record.RUN_FILE}")

    def _log_state(self, written: int = 0) -> dict:
        """The record's `event_log`: complete, or where and why it stopped. `written`: lines
        about to be written by the event that carries this state."""
        if self._log.failure is None:
            return {"state": "complete", "lines": self._log.lines + written}
        return {"state": "incomplete", "lines": self._log.lines, "reason": self._log.failure}

    def _warn(self, message: str) -> None:
        try:
            warnings.warn(message, AuditorWarning, stacklevel=3)
        except Exception:  # turned into errors, or shown on a stderr the program closed:
            pass           # the record still keeps it
        self._emit({"event": "warning", "message": message})


# A forked child (os.fork, multiprocessing's fork) is not the audited process: its stages,
# marks and staged calls go unrecorded instead of into the parent's log.
os.register_at_fork(after_in_child=lambda: _set_active(None))


def new_run_folder(name: str, root: str = "runs") -> Path:
    """runs/<timestamp>-<random>-<name>: unique across processes started in the same second
    (not created here: Audit creates it on entry, renaming it on the rare clash)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "run"
    return Path(root) / f"{stamp}-{secrets.token_hex(3)}-{safe}"


def _claim(folder: Path, name: str, attempts: int = 20) -> Path:
    """Create a run folder the audit named itself, atomically: a folder that another process
    created first is never shared; the audit takes a new name instead."""
    for _ in range(attempts):
        try:
            folder.mkdir(parents=True, exist_ok=False)
            return folder
        except FileExistsError:
            folder = new_run_folder(name, str(folder.parent))
    raise FileExistsError(f"no free run folder name under {str(folder.parent)!r}")


def _reference(obj):
    """A weak reference where the object allows one, else a strong one (documented)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _is_failure(exc) -> bool:
    if exc is None:
        return False
    if isinstance(exc, SystemExit):
        return exc.code not in (None, 0)
    return True


def _describe(exc) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _exit_status(exc) -> dict:
    if exc is None:
        return {"status": "ok", "code": 0, "error": None}
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return {"status": "ok" if code == 0 else "failed", "code": code,
                "error": None if code == 0 else _describe(exc)}
    if isinstance(exc, KeyboardInterrupt):
        return {"status": "interrupted", "code": 130, "error": "KeyboardInterrupt"}
    if isinstance(exc, Interrupted):
        return {"status": "interrupted", "code": 128 + exc.signum, "error": str(exc)}
    return {"status": "failed", "code": 1, "error": _describe(exc)}


def _machine() -> dict:
    import psutil
    return {"platform": platform.platform(), "cpus": os.cpu_count(),
            "memory_total": psutil.virtual_memory().total}


def _environment() -> dict:
    """Versions without importing anything heavy: torch counts only once the run imported it."""
    torch = sys.modules.get("torch")
    threads = getattr(torch, "get_num_threads", None)
    return {"python": platform.python_version(), "torch": _version("torch"),
            "transformers": _version("transformers"), "threads": threads() if threads else None,
            "malloc": allocator_retention.malloc_settings(os.environ) if _on_glibc() else None}


def _on_glibc() -> bool:
    """Whether this process's C library is glibc (its malloc is the one the settings are for)."""
    return platform.libc_ver()[0] == "glibc"


def _version(package: str) -> str | None:
    module = sys.modules.get(package)
    if module is not None and isinstance(getattr(module, "__version__", None), str):
        return module.__version__
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version(package)
    except PackageNotFoundError:
        return None
