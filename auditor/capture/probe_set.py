"""The probe set of one audit: which probes run (the audit's options), building them in their
order, reading them at every stage boundary, and stopping them and writing their files at the end.

At every stage boundary, open or close, each meter's high-water mark is folded into every
open stage and every thread's current interval (all threads: the meters are process-wide)
and into the run, then reset. A stage or interval open at a boundary has been open since the
previous reset, so each peak is exact, and a child's reset never erases its parent's peak.

With the live-tensor meter, each interval's high also brings what was alive at that moment
(auditor.capture.probes.live_tensors, no copy while the program runs): a stage keeps the set of the
interval that held its peak, grouped into `at_peak` rows at its end with the owners of the
census taken then; an unstaged interval's rows get their owners at the next census.

A probe that fails mid-run is switched off (RSS falls back to sampling), with a warning.
"""
from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from auditor.capture.probes import child_processes
from auditor.capture.probes import cuda as cuda_probe
from auditor.capture.probes.python_heap import PythonHeapProbe
from auditor.capture.probes.rss import RssProbe
from auditor.capture.stage_book import Interval, OpenStage, PeakSet, Readings, StageBook
from auditor.record import schema

if TYPE_CHECKING:  # each imports torch or memray: built only when its option is on
    from auditor.capture.probes.live_tensors import LiveTensorProbe
    from auditor.capture.probes.memray_trace import MemrayTrace
    from auditor.capture.probes.torch_import import TorchImportWatch
    from auditor.capture.probes.torch_profiler import TorchProfilerTrace
    from auditor.capture.tracing.data_dependent import SizeRecorder
    from auditor.capture.tracing.fake_tensors import ValueFreeMode

# the live-tensor meter of a program that had not imported torch when the audit started
LIVE_WAITS = "waits for the program to import torch (started at the next stage boundary after it)"
LIVE_AT_IMPORT = ("started when the program imported torch, after the audit began (tensors count from "
                  "there: none existed before)")
LIVE_LATE = ("started late, at the first stage boundary after the program imported torch: stages open then "
             "count from there; tensors made before were found by a scan of live objects")
LIVE_NEVER = "never started: the program never imported torch (no tensor to count)"
LIVE_NO_BOUNDARY = ("never started: the program imported torch, but no stage boundary came after it on the "
                    "audit's thread with no dispatch mode of the program's open")
_PROBE_NAMES = {"py_heap": "python_heap"}  # a meter's key -> its entry in the record's probes
METER_KEYS = ("rss", "py_heap", "cuda", "live_tensors")  # a stage's fields, in the record's order
# A stage's or an interval's reading of each meter, in METER_KEYS' order (None: that meter is off).
MeterReadings = tuple[schema.Readings | None, schema.Readings | None, schema.CudaReadings | None,
                      schema.LiveTensors | None]


class Meter(Protocol):
    """A probe read at every boundary (RSS, Python heap, CUDA, live tensors): `read()` gives its
    values now, their level and the high-water mark since the last `reset()`."""
    key: str

    def read(self) -> tuple[Any, int, int]: ...

    def reset(self) -> None: ...

    def entry(self, start: Any, end: Any, peak: int) -> schema.Readings | schema.CudaReadings: ...

    def describe(self) -> dict: ...

    def close(self) -> None: ...


class ProbeSet:
    """The probes of one audit. `states` is the record's `probes` (each probe's state); `meters`
    the probes read at boundaries; the rest, None while off."""

    def __init__(self, options: dict[str, bool], observed_sizes: list | None, estimate_sizes: bool,
                 book: StageBook, warn: Callable[[str], None], emit: Callable[[dict], None],
                 lock: threading.RLock | None = None):
        self.options = options
        self._observed_sizes, self._estimate_sizes = observed_sizes, estimate_sizes
        self._book, self._warn, self._emit = book, warn, emit
        self.folder = Path()  # where the probes' files go, set at the start
        self.meters: list[Meter] = []
        self.states: dict[str, dict] = {}
        self.run_peaks: dict[str, int] = {}
        self.awaiting_owners: list[tuple[int, PeakSet, set]] = []  # unstaged at_peak sets until the next census
        self.live: LiveTensorProbe | None = None  # the live-tensor meter, while it runs: its at_peak sets
        self.cuda: cuda_probe.CudaProbe | None = None
        self.history: cuda_probe.CudaHistory | None = None
        self.memray: MemrayTrace | None = None
        self.torch_profiler: TorchProfilerTrace | None = None
        self._tracing: AbstractContextManager[ValueFreeMode] | None = None
        self._value_free: ValueFreeMode | None = None
        self._sizes: SizeRecorder | None = None
        self._children_before = 0  # the ended children's peak RSS before the run
        self._child_watch: child_processes.ChildWatch | None = None
        self._children_at_end: dict | None = None
        self._live_waits = False  # the live-tensor meter waits for the program to import torch
        self._torch_watch: TorchImportWatch | None = None  # ... and this sees the import
        self._lock = lock  # the audit's: the meter started at torch's import takes it

    # -- building them, in their order ---------------------------------------------------

    def start_meters(self, folder: Path, pending: list[str]) -> dict[str, dict]:
        """The meters, and the modes the body runs under (fake tensors, size recording).
        Returns the record's `probes` so far; a probe that cannot run adds to `pending`."""
        self.folder = folder
        if self.options["torch_profiler"]:  # built (torch imported) before the run's peak counts
            from auditor.capture.probes.torch_profiler import TorchProfilerTrace
            self.torch_profiler = TorchProfilerTrace(folder)
        rss = RssProbe()
        rss.reset()  # the run's peak counts from here, not from the process's past
        self.meters = [rss]
        self.states = probes = {"rss": rss.describe()}
        if rss.reason:
            pending.append(rss.reason)
        probes["cuda"] = {"state": "pending"}
        probes["python_heap"] = {"state": "off"}
        if self.options["tracemalloc"]:
            heap = PythonHeapProbe()
            self.meters.append(heap)
            probes["python_heap"] = heap.describe()
        self.poll_cuda()
        probes["traced"] = {"state": "off"}
        if self.options["traced"]:  # before the meter: the meter must see fake tensors
            from auditor.capture.tracing.fake_tensors import traced
            self._tracing = traced(self._observed_sizes, self._estimate_sizes)
            self._value_free = self._tracing.__enter__()
            probes["traced"] = {"state": "on", "method": "FakeTensorMode, values read as 0, "
                                "data-dependent sizes estimated (auditor.capture.tracing.data_dependent)"}
        if self.options["record_sizes"]:  # the real run's data-dependent sizes, before the meter (modes nest)
            from auditor.capture.tracing.data_dependent import SizeRecorder
            self._sizes = SizeRecorder()
            self._sizes.__enter__()
        probes["live_tensors"] = {"state": "off"}
        if self.options["live_tensors"]:
            if "torch" in sys.modules or self.options["census"]:  # the census imports torch at the start
                self._start_live_tensors()
            else:  # never torch's import for a program without it (+200 MiB, ~1 GB of address space)
                self._live_waits = True
                probes["live_tensors"] = {"state": "pending", "reason": LIVE_WAITS}
                from auditor.capture.probes.torch_import import TorchImportWatch
                self._torch_watch = TorchImportWatch(self._on_torch_imported)
        return probes

    def _on_torch_imported(self) -> None:
        """Right after the program's `import torch`: the meter starts there when that import ran
        on the audit's thread and the audit's lock is free (never waited for: the import holds
        torch's module lock), else at the next stage boundary."""
        if self._lock is None or not self._lock.acquire(blocking=False):
            return
        try:
            self._poll_live_tensors(LIVE_AT_IMPORT)
        finally:
            self._lock.release()

    def _start_live_tensors(self) -> None:
        from auditor.capture.probes.live_tensors import LiveTensorProbe
        self.live = live = LiveTensorProbe()
        self.meters.append(live)
        self.states["live_tensors"] = live.describe()

    def _poll_live_tensors(self, started: str = LIVE_LATE) -> None:
        """Start the live-tensor meter that waits for torch, at the first boundary on the audit's
        thread after the program imported it (a dispatch mode is the thread's: it must be
        entered there), and with no dispatch mode of the program's open (modes leave in order).
        Stages and intervals open now count from here; tensors made before are found by the
        meter's scan of live objects."""
        if not self._live_waits or "torch" not in sys.modules or threading.get_ident() != self._book.audit_thread:
            return
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
        if _get_current_dispatch_mode_stack():
            return
        self._live_waits = False
        try:
            self._start_live_tensors()
        except Exception as error:  # a meter that cannot start costs its figures, never the run
            self.states["live_tensors"] = {"state": "failed", "reason": f"{type(error).__name__}: {error}"}
            self._warn(f"the live_tensors probe could not start: {type(error).__name__}: {error}")
            return
        live = self.live
        assert live is not None  # just started
        _, level, _ = live.read()
        live.reset()
        targets: list[OpenStage | Interval] = [*self._book.open, *self._book.intervals.values()]
        for opened in targets:
            opened.starts[live.key], opened.peaks[live.key] = level, level
        self.run_peaks[live.key] = level
        self.states["live_tensors"]["reason"] = started

    def start_recorders(self, pending: list[str]) -> None:
        """What records the whole run beside the meters: CUDA history, the torch profiler's
        trace and memray's, after the meters and the census (auditor.capture.census_roots)."""
        probes = self.states
        probes["cuda_history"] = {"state": "off"}
        if self.options["cuda_history"]:
            self.history = history = cuda_probe.CudaHistory()
            probes["cuda_history"] = history.state
            if not history.on:
                pending.append(f"CUDA memory history absent: {history.state['reason']}")
        probes["torch_profiler"] = {"state": "off"}
        if self.torch_profiler is not None:  # late, for the same reason as memray
            self.torch_profiler.start()
            probes["torch_profiler"] = self.torch_profiler.state
            if not self.torch_profiler.on:
                pending.append(f"torch profiler absent: {self.torch_profiler.state['reason']}")
        probes["memray"] = {"state": "off"}
        if self.options["memray"]:  # last, so its trace holds as little of our setup as possible
            from auditor.capture.probes.memray_trace import MemrayTrace
            self.memray = memray = MemrayTrace(self.folder, self._warn)
            probes["memray"] = memray.state
            if not memray.on:
                pending.append(f"memray absent: {memray.state['reason']}")

    def abandon_traces(self) -> None:
        """Undo a start that failed half-way, the traces first (then `abandon_meters`)."""
        if self.memray is not None:
            self.memray.stop()
        if self.torch_profiler is not None:
            self.torch_profiler.stop()

    def abandon_meters(self) -> None:
        """The rest of an abandoned start: no meter or dispatch mode left behind."""
        for meter in reversed(self.meters):
            meter.close()
        self.stop_tracing()

    # -- reading them at boundaries ------------------------------------------------------

    def read(self, reset: bool = False) -> Readings:
        """Each meter's (values, level), its high-water mark folded into the open stages and
        the run; `reset` starts a new peak interval. A meter that fails is switched off."""
        readings = {}
        for meter in list(self.meters):
            try:
                values, level, high = meter.read()
                live = self.live
                at_peak = live is not None and meter is live and live.keeps_composition
                self.fold(meter.key, high, live.peak_set if at_peak and live is not None else None)
                if reset:
                    meter.reset()
            except Exception as error:
                if not self.meter_failed(meter, error):
                    continue
                values, level, high = meter.read()
                self.fold(meter.key, high)
            readings[meter.key] = (values, level)
        return readings

    def reset(self) -> None:
        for meter in list(self.meters):
            try:
                meter.reset()
            except Exception as error:
                if self.meter_failed(meter, error):
                    meter.reset()

    def meter_failed(self, meter: Meter, error: Exception) -> bool:
        """Switch a failing meter off, with a warning; RSS, always measured, falls back to
        sampling instead. True when the meter can be read again."""
        what = f"{type(error).__name__}: {error}"
        if isinstance(meter, RssProbe) and meter.method != "sampler":
            meter.fall_back(f"reading or resetting VmHWM failed mid-run ({what})")
            self.states["rss"] = meter.describe()
            self._warn(f"RSS probe: {meter.reason}")
            return True
        self.meters.remove(meter)
        if meter is self.live:
            self.live = None
        self.close_meter(meter)
        self.states[_PROBE_NAMES.get(meter.key, meter.key)] = {"state": "failed", "reason": what}
        self._warn(f"the {meter.key} probe failed and was switched off: {what}")
        return False

    def close_meter(self, meter: Meter) -> None:
        try:
            meter.close()
        except Exception as error:
            self._warn(f"the {meter.key} probe did not close cleanly: {type(error).__name__}: {error}")

    def fold(self, key: str, high: int, peak_set: Callable[[], PeakSet] | None = None) -> None:
        """A meter's high-water mark into every open stage and interval (all threads: the
        meters are process-wide) and the run. `peak_set()`: what was alive at that high (the
        live-tensor meter), taken where it is a new peak, built at most once."""
        book = self._book
        targets: list[OpenStage | Interval] = [*book.open, *book.intervals.values()]
        if peak_set is not None:
            taken = None
            for target in targets:
                if key in target.peaks and (target.at_peak is None or high > target.peaks[key]):
                    taken = peak_set() if taken is None else taken
                    target.at_peak = taken
        for target in targets:
            if high > target.peaks.get(key, high):
                target.peaks[key] = high
        if high > self.run_peaks.get(key, -1):
            self.run_peaks[key] = high

    def poll_cuda(self) -> None:
        """Switch the CUDA probe on once the audited code has initialized CUDA, and the live-tensor
        meter once it has imported torch (at every boundary)."""
        self._poll_live_tensors()
        if self.cuda is not None or "torch" not in sys.modules:
            return
        cuda = cuda_probe.initialized_cuda()
        if cuda is None:
            return
        self.cuda = probe = cuda_probe.CudaProbe(cuda)
        values, level, high = probe.read()
        probe.reset()
        book = self._book
        targets: list[OpenStage | Interval] = [*book.open, *book.intervals.values()]
        for opened in targets:  # no GPU memory before CUDA
            opened.starts["cuda"], opened.peaks["cuda"] = dict(cuda_probe.CudaProbe.ZERO), high
        # Initialized during the run: all of its peak is the run's; before it: count from now.
        self.run_peaks["cuda"] = high if "rss" in self.run_peaks else level
        self.meters.append(probe)
        self.states["cuda"] = probe.describe()

    @property
    def device(self) -> str:
        return self.cuda.device if self.cuda is not None else "cpu"

    def meter_fields(self, starts: dict, ends: dict, peaks: dict) -> MeterReadings:
        """A stage's or an interval's reading of each meter: start, end and peak."""
        rss: schema.Readings | None = None
        heap: schema.Readings | None = None
        cuda: schema.CudaReadings | None = None
        live: schema.LiveTensors | None = None
        for meter in self.meters:
            key = meter.key
            if key in starts and key in ends:
                reading = meter.entry(starts[key], ends[key], peaks[key])
                if type(reading) is schema.Readings:  # type(), not isinstance: LiveTensors are Readings too
                    if key == "rss":
                        rss = reading
                    else:
                        heap = reading
                elif type(reading) is schema.CudaReadings:
                    cuda = reading
                elif type(reading) is schema.LiveTensors:
                    live = reading
        return rss, heap, cuda, live

    def unstaged_fields(self, unstaged_id: int, interval: Interval, ends: dict, census: bool) -> MeterReadings:
        """An unstaged interval's readings, as a stage's; what was alive at its live-tensor
        peak waits for its owners when a `census` will come."""
        fields = self.meter_fields(interval.starts, ends, interval.peaks)
        live = fields[3]
        if live is not None:
            alive = self.alive(interval.at_peak)
            at_peak = live.at_peak = self.at_peak(interval.at_peak, alive, None)
            if at_peak is not None and census:
                self.awaiting_owners.append((unstaged_id, interval.at_peak, alive))
        return fields

    def follow(self, thread_id: int, path: str | None) -> None:
        """Tell the live-tensor meter the innermost stage open on the thread it counts."""
        if self.live is not None and thread_id == self._book.audit_thread:
            self.live.set_stage(path)

    def live_tensor_bytes(self) -> int | None:
        """Bytes of live tensors now, when the live-tensor meter runs."""
        return self.live.read()[0] if self.live is not None else None

    def live_tensor_high(self) -> int | None:
        """The live-tensor meter's high since its last reset (a boundary or a census)."""
        return self.live.read()[2] if self.live is not None else None

    # -- the program's child processes (never audited: the record's `process.children`) --

    def watch_children(self) -> None:
        self._children_before = child_processes.ended_peak_rss()
        self._child_watch = child_processes.ChildWatch()

    def read_children(self, stage: str, at_s: float) -> None:
        """At a top-level stage's end: their memory, when it changed."""
        try:
            assert self._child_watch is not None  # made when the audit started
            self._child_watch.at_stage_end(stage, at_s)
        except Exception as error:  # a probe that fails costs its figure, never the record
            self._warn(f"child processes could not be read at the end of {stage}: {type(error).__name__}: {error}")

    def children(self) -> dict:
        """`process.children`, where the program's child processes held memory: as they stood
        when the recorders stopped, before memray's reader (a process of the auditor's) ran."""
        if self._children_at_end is not None:
            return self._children_at_end
        try:
            children = child_processes.at_end(self._children_before, self._child_watch)
        except Exception as error:  # a probe that fails costs its figure, never the record
            self._warn(f"child processes could not be read: {type(error).__name__}: {error}")
            return {}
        return {"children": children} if children else {}

    # -- what was alive at a live-tensor peak --------------------------------------------

    def alive(self, peak_set: PeakSet | None) -> set:
        if peak_set is None or self.live is None:
            return set()
        try:
            return self.live.alive(peak_set)
        except Exception as error:
            self.meter_failed(self.live, error)
            return set()

    def at_peak(self, peak_set: PeakSet | None, alive: set, census: dict | None) -> schema.AtPeak | None:
        """What was alive at a live-tensor peak, grouped; None if the meter is off."""
        if peak_set is None or self.live is None:
            return None
        try:
            return self.live.at_peak(peak_set, alive, census)
        except Exception as error:
            self.meter_failed(self.live, error)
            return None

    def resolve_owners(self, census: dict | None) -> None:
        """The owners a census found: kept on the live-tensor meter's rows (a storage freed
        later is still named), and given to the unstaged intervals' at_peak that wait for them."""
        awaiting, self.awaiting_owners = self.awaiting_owners, []
        if census is None or self.live is None:
            return
        try:
            self.live.note_owners(census)
        except Exception as error:
            self.meter_failed(self.live, error)
            return
        for unstaged_id, peak_set, alive in awaiting:
            at_peak = self.at_peak(peak_set, alive, census)
            if at_peak is not None:
                self._emit({"event": "unstaged_at_peak", "id": unstaged_id, "at_peak": at_peak.to_json()})

    # -- stopping them, and their files ----------------------------------------------------

    def final_readings(self) -> dict:
        """The meters' values at the run's end (the caller holds the audit's lock)."""
        if self._torch_watch is not None:
            self._torch_watch.remove()
        if self._live_waits:  # the run's end is no boundary to start it at
            self._live_waits = False
            self.states["live_tensors"] = {"state": "absent", "reason": LIVE_NEVER if "torch" not in sys.modules
                                           else LIVE_NO_BOUNDARY}
        self.poll_cuda()
        ends = {key: values for key, (values, _) in self.read().items()}
        if self.cuda is None:
            self.states["cuda"] = {"state": "absent", "reason": cuda_probe.absence_reason()}
        return ends

    def close_meters(self) -> None:
        for meter in reversed(self.meters):  # dispatch modes leave in the reverse order
            self.close_meter(meter)  # before reading the memray trace: tracemalloc would slow it

    def stop_tracing(self) -> None:
        """Leave the fake-tensor and size-recording modes; what they found goes into the record."""
        if self._sizes is not None:
            self._sizes.__exit__(None, None, None)
            self._emit({"event": "annotation", "key": "data_dependent_sizes", "value": self._sizes.entries()})
            self._sizes = None
        if self._tracing is None:
            return
        self._tracing.__exit__(None, None, None)
        self._tracing = None
        value_free = self._value_free
        assert value_free is not None  # entered with the tracing
        self._emit({"event": "annotation", "key": "traced",
                    "value": {"data_dependent_ops": dict(value_free.data_dependent),
                              "estimated_sizes": value_free.estimates.entries()}})

    def stop_recorders(self) -> dict | None:
        """Stop memray, then the profiler (its trace is no allocation of the run); returns
        memray's summary, None if it was off or could not be read."""
        # traced, if only until the program started its own Tracker
        memray = self.memray if self.memray is not None and self.memray.state.get("state") == "on" else None
        if memray is not None:
            memray.stop()
        self._stop_torch_profiler()
        if memray is not None:  # its reader is a child process: the program's children are read before
            self._children_at_end = self.children()
        return self._finish_memray(memray) if memray is not None else None

    def _stop_torch_profiler(self) -> None:
        if self.torch_profiler is None or not self.torch_profiler.on:
            return
        try:
            self.torch_profiler.stop()
        except Exception as error:  # a profiler that fails must not cost the record
            reason = f"{type(error).__name__}: {error}"
            self.states["torch_profiler"] = {"state": "failed", "reason": reason}
            self._warn(f"torch profiler did not stop cleanly: {reason}")

    def _finish_memray(self, memray: MemrayTrace) -> dict | None:
        try:
            return memray.summarize()
        except Exception as error:  # a broken trace must not cost the rest of the record
            reason = f"{type(error).__name__}: {error}"
            self.states["memray"] = {"state": "failed", "reason": reason}
            self._warn(f"memray trace could not be read: {error}")
            return None

    def write_files(self, memray: dict | None) -> tuple[dict, dict]:
        """The optional files, after the record: flamegraph, profiler trace, CUDA history.
        Returns the files written and, for each that was not, its probe's failed state."""
        writers: dict[str, tuple[str, Callable[[], str | None]]] = {}
        if memray is not None and self.memray is not None:
            writers["flamegraph"] = ("memray", self.memray.write_flamegraph)
        if self.torch_profiler is not None and self.states["torch_profiler"].get("state") == "on":
            writers["torch_profiler"] = ("torch_profiler", self.torch_profiler.write)
        if self.history is not None and self.history.on:
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
                probes[probe] = {**self.states.get(probe, {}), "state": "failed", "reason": reason}
                self._warn(f"{key.replace('_', ' ')} was not written: {reason}")
        return files, probes

    def _write_cuda_history(self) -> str:
        assert self.history is not None  # a writer only while it is on
        name = self.history.finish(self.folder)
        if name is None:
            raise RuntimeError(self.history.state.get("reason", "no snapshot was written"))
        return name

