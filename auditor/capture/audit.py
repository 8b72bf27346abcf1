"""The audit: runs one run's lifecycle and keeps its event log.

    with auditor.Audit(out="runs/x", name="prune", memray=True) as audit:
        prune(model)
    audit.record          # the run record (also runs/x/run.json)

`torch_profiler=True` also records a torch.profiler trace with memory, stages as ranges, in
runs/x/profiler/ for TensorBoard (auditor.capture.probes.torch_profiler).

The audit holds three parts and opens and closes stages with them: the probe set (which
probes run, reading them at every stage boundary: auditor.capture.probe_set), the book of
open stages and unstaged intervals (auditor.capture.stage_book) and the census roots
(auditor.capture.census_roots). Everything it learns is an event, kept in memory for the
record and appended to the run folder's event log as it happens.

The audited program never breaks because of the audit: a probe that fails mid-run is switched
off (RSS falls back to sampling), an event log that cannot be written (disk full) leaves the
events in memory, a run.json that cannot be written is a warning, and a staged callable the
audit itself uses is a plain call inside the audit's own code (auditor.capture.stage.AUDITOR_CODE).
Each degradation is an AuditorWarning and a line in the record's warnings.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import signal
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Literal

from auditor.capture import machine, nested_audit, ranks
from auditor.capture.census_roots import CensusRoots
from auditor.capture.exit_status import describe as _describe
from auditor.capture.exit_status import shell_code
from auditor.capture.probe_set import ProbeSet
from auditor.capture.stage import AUDITOR_CODE, _set_active, active_audit, unrecorded_said
from auditor.capture.stage_book import MARK_KEYS, Clock, Interval, StageBook
from auditor.capture.stage_lifecycle import StageLifecycle
from auditor.capture.staging.targets import Staging, Target, _labels
from auditor.record import run_folder as run_record
from auditor.record.schema import Exit, Mark, written_as


class AuditorWarning(UserWarning):
    """A probe that could not run, or a stage the audit had to close itself."""


class Interrupted(BaseException):
    """Raised in the audited program by a signal that ends it (SIGTERM under `auditor run`),
    as Ctrl-C raises KeyboardInterrupt: its stages close as failed and the record says
    interrupted, naming the signal."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


NOT_STARTED = "the audit has not started: enter it first"


class RunLog:
    """The run's events: in memory for the record, and appended to the event log (opened when
    the audit starts). A log that fails warns once and never raises; the events stay in memory."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.file: run_record.EventLog | None = None
        self._warned = False

    def open(self, folder: Path) -> None:
        self.file = run_record.EventLog(folder)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

    def emit(self, event: dict, durable: bool = False) -> None:
        """Into the record (memory) and the log."""
        self.events.append(event)  # first: a Ctrl-C in the write leaves no logged event unrecorded
        log = self.file
        if log is None:
            raise RuntimeError(NOT_STARTED)
        written = log.write(event, durable)
        if written or self._warned:
            return
        self._warned = True
        if "event_log" in event:  # the run_finished line itself failed
            event["event_log"] = self.state()
        self.warn(f"{log.failure}; the log stops at its last whole line ({log.lines} "
                  f"events) and the run goes on, its events kept for {run_record.RUN_FILE}")

    def state(self, written: int = 0) -> dict:
        """The record's `event_log`: complete, or where and why it stopped. `written`: lines
        about to be written by the event that carries this state."""
        log = self._file()
        if log.failure is None:
            return {"state": "complete", "lines": log.lines + written}
        return {"state": "incomplete", "lines": log.lines, "reason": log.failure}

    def warn(self, message: str) -> None:
        with contextlib.suppress(Exception):  # turned into errors, or shown on a stderr the program
            warnings.warn(message, AuditorWarning, stacklevel=3)  # closed: the record still keeps it
        self.emit({"event": "warning", "message": message})

    def fault(self, doing: str, error: Exception) -> None:
        self.warn(f"the audit failed {doing} ({type(error).__name__}: {error}); the program "
                  "goes on, the record may lack this stage")

    def _file(self) -> run_record.EventLog:
        if self.file is None:
            raise RuntimeError(NOT_STARTED)
        return self.file


class Audit(StageLifecycle):
    def __init__(self, out: str | os.PathLike | None = None, name: str | None = None, *,
                 memray: bool = False, tracemalloc: bool = False, census: bool = False,
                 cuda_history: bool = False, live_tensors: bool = False, traced: bool = False,
                 torch_profiler: bool = False, stage_targets: Iterable[object] = (), command: str | None = None,
                 on_stage_end: Callable[[dict], object] | None = None,
                 stage_label: Callable[[str, tuple, dict], str | None] | None = None,
                 record_sizes: bool = False, observed_sizes: list | None = None, estimate_sizes: bool = True,
                 rank: dict | None = None):
        """Validates everything (ValueError, one line) and creates nothing until entered.

        `stage_label(target_name, args, kwargs) -> str | None` names what each call of a staged
        callable worked on (auditor.capture.staging.call_labels); None keeps the default label.

        Data-dependent sizes (auditor.capture.tracing.data_dependent): `record_sizes` (a real run) records
        each value-sized operator's output/input ratio per call site in the record's
        `data_dependent_sizes`; a traced run sizes those outputs by `observed_sizes` (that field
        of a real run's record), else by fractions the program declares, and `estimate_sizes=False`
        makes them all empty (the lower bound its estimated bytes are measured against).

        `rank`: this process's rank as its launcher knows it (auditor.capture.staging.spawned_ranks), where
        the environment and torch.distributed do not say it yet; a process group read later confirms it."""
        if stage_label is not None and not callable(stage_label):
            raise ValueError(f"stage_label should be a function (target_name, args, kwargs) -> "
                             f"str | None, not a {type(stage_label).__name__}")
        if observed_sizes is not None and not isinstance(observed_sizes, list):
            raise ValueError("observed_sizes should be a real run's data_dependent_sizes (a list), "
                             f"not a {type(observed_sizes).__name__}")
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
        self.record_written = False  # run.json on disk (a full disk can cost it, not the run)
        self.workers_audited = False  # workers it spawned audit the stage targets (staging.spawned_ranks)
        self._entered = False
        self._calls: dict[str, int] = {}
        self._lock = threading.RLock()
        # Its parts. None holds the audit itself: a finished audit is freed as soon as it is dropped.
        self._log = RunLog()
        self._warn, self._fault, self._emit = self._log.warn, self._log.fault, self._log.emit
        self._clock = Clock()
        self._book = StageBook()
        self._probe_set = ProbeSet(self.options, observed_sizes, estimate_sizes, self._book,
                                   self._warn, self._log.emit, self._lock)
        self._census_roots = CensusRoots(self._probe_set, self._book, self._clock, self._lock, self._staging,
                                         self._warn, self._fault, _instance_labels(self))
        self._pid = 0  # the run's process and where its files go, set when the audit is entered
        self._dir = self.folder

    @property
    def stage_targets(self) -> list[Target]:
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
        running = active_audit()
        if running is not None:  # a program that audits itself, run under `auditor run`: never an error
            return nested_audit.join(self, running, _claim, _exit_status)
        self._entered = True
        self._pid = os.getpid()
        self._clock.start()
        started_at = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        self._staging.apply()  # first: the one step that can still refuse, before any file
        pending: list[str] = []  # warnings of probes that cannot run, once the audit is active
        try:
            if self._chosen_folder:
                self.folder = _claim(self.folder, self.name)
            self._dir = Path(os.path.abspath(self.folder))  # where files go, whatever the
            self._log.open(self._dir)                       # program does with its cwd
            probes = self._probe_set.start_meters(self._dir, pending)
            probes["census"] = self._census_roots.start(pending)
            self._probe_set.start_recorders(pending)
            self._probe_set.reset()  # the probes' own start (the meter's scan of objects) is no peak
            readings = self._probe_set.read()
            rss_at_start = readings["rss"][0]
            self._probe_set.run_peaks["rss"] = rss_at_start
            self._book.audit_thread = threading.get_ident()  # the live-tensor meter counts its operators
            self._book.intervals[self._book.audit_thread] = Interval(
                None, None, None, threading.current_thread().name, round(self._clock.now(), 6), readings)
            self._log.emit({
                "event": "run_started", "schema": run_record.SCHEMA, "name": self.name,
                "command": self.command, "started_at": started_at, "device": self._probe_set.device,
                "machine": machine.machine(), "environment": machine.environment(), "options": self.options,
                "process": {"pid": os.getpid(), "rss_at_start": rss_at_start, "cwd": os.getcwd()}, "probes": probes,
                **({"rank": self.rank} if self.rank else {}),
            }, durable=True)
            self._probe_set.watch_children()  # after platform.platform()'s `uname -p`
        except BaseException:
            self._abandon()
            raise
        for message in pending:
            self._warn(message)
        _set_active(self)
        return self

    def _abandon(self) -> None:
        """Undo a start that failed half-way: no tracker, trace or patch left behind."""
        self._probe_set.abandon_traces()
        self._census_roots.close_highs()
        self._probe_set.abandon_meters()
        self._log.close()
        self._staging.restore()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if os.getpid() != self._pid:  # a forked child leaving the block: the parent's record
            return False              # and log are not its to write
        with AUDITOR_CODE:
            try:
                self._finish(exc)
            finally:
                self._log.close()
        return False

    def _finish(self, exc: BaseException | None) -> None:
        began = time.perf_counter()
        end_s = self._clock.now()
        try:
            with self._lock:
                self._close_left_open(end_s, exc)
        finally:  # whatever failed above, the program gets its own callables back
            _set_active(None)
            self._staging.restore()
        for message in [*self._staging.rebound, unrecorded_said()]:
            if message is not None:
                self._warn(message)
        for target in self._staging.targets:
            if target.name not in self._calls and not self.workers_audited:  # theirs: in their records
                self._warn(self._staging.never_called(target))
        self._census_roots.close_highs()
        with self._lock:
            ends = self._probe_set.final_readings()
        self._end_run_intervals(end_s, ends)
        self._probe_set.close_meters()
        self._probe_set.stop_tracing()
        memray = self._probe_set.stop_recorders()
        self._clock.overhead["finish_s"] = time.perf_counter() - began
        self._log.emit(self._finish_event(end_s, ends, memray, exc), durable=True)
        self._write_record()  # the record first: a full disk then costs only the optional files
        files, probes = self._probe_set.write_files(memray)
        if files or probes:
            self._log.emit({"event": "artifacts", "files": files, "probes": probes}, durable=True)
            self._write_record()

    def _write_record(self) -> None:
        self.record = run_record.assemble(self._log.events)
        try:
            run_record.write_json_atomically(self._dir / run_record.RUN_FILE, self.record)
        except OSError as error:
            log = self._log.file
            kept = ("an earlier run.json stays" if self.record_written else
                    f"`auditor rebuild {self.folder}` writes it from {run_record.EVENTS_FILE} once there is space"
                    if log is None or log.failure is None else
                    f"{run_record.EVENTS_FILE} holds the first {log.lines} events")
            self._warn(f"{run_record.RUN_FILE} could not be written ({error.strerror or error}); {kept}")
            return
        self.record_written = True

    def _finish_event(self, end_s: float, ends: dict, memray: dict | None, exc: BaseException | None) -> dict:
        events, run_peaks = self._log.events, self._probe_set.run_peaks
        finished = [e["stage"] for e in events if e["event"] == "stage_finished"]
        where = run_record.locate_peak(finished, run_record.unstaged_items(events), run_peaks["rss"])
        holder = run_record.peak_stage(finished, run_peaks["rss"], where)
        peak = {"rss": run_peaks["rss"], "stage": holder["path"] if holder else None,
                "stage_id": holder["id"] if holder else None, "where": where,
                "py_heap": run_peaks.get("py_heap"), "cuda_allocated": run_peaks.get("cuda")}
        trace = self._probe_set.memray
        if memray is not None and trace is not None:  # the stage open at memray's high-water time
            memray.update(trace.place(finished, self._clock.seconds_at, peak))
        rank = {}
        if self.rank is not None and self._rank_start is not None:  # torch.distributed has the last word
            rank["rank"], mismatch = ranks.at_end(self._rank_start, self.rank)
            if mismatch:
                self._warn(mismatch)
        files = {"events": run_record.EVENTS_FILE, "run": run_record.RUN_FILE}
        if memray:
            files.update(memray=memray["file"])
        children = self._probe_set.children()  # first: nothing of the auditor's own has started a process yet
        return {
            "event": "run_finished",
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "duration_s": round(end_s, 6), "device": self._probe_set.device, "environment": machine.environment(),
            "process": {**events[0]["process"], "rss_at_end": ends["rss"], **children},
            "probes": self._probe_set.states, "peak": peak, "memray": memray, "exit": _exit_status(exc).to_json(),
            "files": files, "event_log": self._log.state(written=1),
            "audit_overhead_s": {k: round(v, 6) for k, v in self._clock.overhead.items()}, **rank,
        }

    # -- the program's own calls -----------------------------------------------------------

    def mark(self, name: str) -> None:
        try:
            self._mark(name)
        except Exception as error:
            self._fault(f"reading mark {name!r}", error)

    def _mark(self, name: str) -> None:
        with self._lock:
            self._probe_set.poll_cuda()
            readings = {key: values for key, (values, _) in self._probe_set.read().items()}
            stack = self._book.thread_stack()
            inside = stack[-1] if stack else self._book.outer_stage()  # an asyncio task's first: its thread's
            stage_path = inside.entry["path"] if inside else None
            mark = Mark(name=name, stage=stage_path, t_s=round(self._clock.now(), 6),
                        thread=threading.current_thread().name, rss=readings["rss"],
                        py_heap=readings.get("py_heap"), cuda=readings.get("cuda"))
            self._log.emit({"event": "mark", "mark": written_as(mark, MARK_KEYS).to_json()})

    def annotate(self, key: str, value: object) -> None:
        """Add a field to the run record (e.g. the workload it ran), written to the log now."""
        if key in run_record.RESERVED:
            raise ValueError(f"{key!r} is a run-record field the audit writes itself")
        with AUDITOR_CODE:
            self._log.emit({"event": "annotation", "key": key, "value": value}, durable=True)

    def numbered(self, name: str) -> str:
        """`name` for the first call, then `name#2`, `name#3`... (staged targets)."""
        with self._lock:
            count = self._calls[name] = self._calls.get(name, 0) + 1
        return name if count == 1 else f"{name}#{count}"

    def track(self, name: str, obj: object, categories: dict[str, str] | None = None) -> None:
        """A census root called `name` (auditor.capture.census_roots); nothing while the census is off."""
        self._census_roots.track(name, obj, categories)

    def track_receiver(self, obj: object, label: str | None = None, found: bool = False) -> str | None:
        """A staged method's `self` as a census root (auditor.capture.census_roots.CensusRoots.track_receiver)."""
        return self._census_roots.track_receiver(obj, label, found)

    @contextlib.contextmanager
    def own_work(self, kind: str, transient_memory: bool = False) -> Iterator[None]:
        """The auditor's own work inside the run (labelling a staged call): its time is kept
        out of the stages, like the census's, and counted in the overhead under `kind`. With
        `transient_memory` (a scan of every object), the peaks reached so far are folded in
        first and the meters reset after, so its memory counts in no peak."""
        if transient_memory:
            with self._lock:
                self._probe_set.read()
        began = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                if transient_memory:
                    self._probe_set.reset()
                self._clock.keep_out(began, kind)

    def live_tensor_bytes(self) -> int | None:
        """Bytes of live tensors now, when the live-tensor meter runs (auditor.capture.tracing.size_profiles
        compares a real and a traced run's at the same call)."""
        return self._probe_set.live_tensor_bytes()

    def open_stages(self) -> list[dict]:
        """The stages open on this thread, outermost first (each as it started: id, path): what
        data-dependent sizes are placed by (auditor.capture.tracing.size_profiles)."""
        return [opened.entry for opened in self._book.thread_stack()]


# A forked child (os.fork, multiprocessing's fork) is not the audited process: its stages,
# marks and staged calls go unrecorded instead of into the parent's log.
os.register_at_fork(after_in_child=lambda: _set_active(None))


def _instance_labels(audit: Audit) -> Callable[[object], tuple[bool, str | None]]:
    """The call labels' name for an object of a staged class (auditor.capture.staging.call_labels),
    held through a weak reference: the census roots never keep their audit alive."""
    owner = weakref.ref(audit)
    return lambda obj: _labels(owner()).instance_label(obj)


def new_run_folder(name: str, root: str = "runs") -> Path:
    """runs/<timestamp>-<random>-<name>: unique across processes started in the same second
    (not created here: Audit creates it on entry, renaming it on the rare clash)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:50] or "run"  # within 255 bytes
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


def _exit_status(exc) -> Exit:
    if exc is None:
        return Exit(status="ok", code=0, error=None)
    if isinstance(exc, SystemExit):
        code = shell_code(exc.code)  # what the shell sees: sys.exit(263) exits 7
        return Exit(status="ok" if code == 0 else "failed", code=code, error=None if code == 0 else _describe(exc))
    signum = getattr(exc, "signum", signal.SIGINT)  # process_group.Stopped: a job command's SIGTERM too
    if isinstance(exc, KeyboardInterrupt) and signum == signal.SIGINT:
        return Exit(status="interrupted", code=130, error="KeyboardInterrupt")
    if isinstance(exc, (Interrupted, KeyboardInterrupt)):
        return Exit(status="interrupted", code=128 + signum, error=str(exc))
    return Exit(status="failed", code=1, error=_describe(exc))
