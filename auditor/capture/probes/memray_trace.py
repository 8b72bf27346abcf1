"""memray: every native allocation (torch CPU tensors included) with its Python and native
stack, for the whole run. At the end: memray's own peak, the allocations alive at its
high-water mark grouped into sites (the innermost frame in user code, file:line; what the
auditor itself allocated is summed apart, never a site), when that mark was reached (from
memray's memory snapshots, taken every ~10 ms) and so which stage was open, and an offline
flamegraph in the run folder (written after the run record: a full disk costs it, not the
record).

Only one memray Tracker can be active per process (not inside `pytest --memray`, not under
`memray run`): then the probe reports itself absent instead of failing the audit. A program
that starts its own Tracker while the audit's runs gets it as it would alone: the audit's
trace ends first, and what it traced until then is kept and said to have ended early.

The trace is read back in a process of its own (auditor.capture.probes.memray_reader): reading
resolves native symbols, which under an address-space limit can crash the reader; that costs
the memray section (a warning), never the audited process. memray's own log lines are kept off
the program's stderr while the audit traces (its failures show as an unreadable trace).
"""
from __future__ import annotations

import contextlib
import json
import linecache
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from auditor.facts import safe_files
from auditor.facts.allocation_sites import AUDITOR, is_auditor_code, is_program_code, passes_through
from auditor.record.run_folder import FLAMEGRAPH_FILE, TRACE_FILE

if TYPE_CHECKING:
    from memray import Tracker

TOP_SITES = 10
NATIVE_FRAMES = 16
ALL_FRAMES = 1 << 16
PYTHON_FRAMES = 16
FRAME_TEXT = 200  # C++ template names run to kilobytes; keep the head
# the highest memory snapshot must come this close to memray's peak for its time to stand
# for the high-water moment (a spike shorter than the snapshot interval is missed)
SNAPSHOT_SHARE = 0.9
TIME_BASIS = "time of memray's high-water mark, from its ~10 ms memory snapshots"
RSS_BASIS = "the run's RSS-peak stage (no snapshot time)"
SNAPSHOT_RESOLUTION_S = 0.001  # memray's snapshot times are whole milliseconds
SNAPSHOT_INTERVAL_S = 0.010  # memray's default time between snapshots
CLOCK_SLACK_S = 0.0005  # unix time to perf_counter, taken once at the start


class MemrayTrace:
    def __init__(self, folder: Path, warn: Callable[[str], None] = lambda message: None):
        self.folder = folder
        self.state = {"state": "absent"}
        self._warn = warn
        self._tracker: Tracker | None = None
        self._unpatch: Callable[[], None] | None = None
        self._reader: _Reader | None = None  # once summarized, until the flamegraph is written
        self._started: tuple[float, float] | None = None  # (perf_counter, unix time) when the tracker started
        # perf_counter times of the high-water snapshot and of the one after it, once summarized
        self.high_water_perf: float | None = None
        self.next_snapshot_perf: float | None = None
        try:
            import memray
        except ImportError:
            self.state["reason"] = ("memray is not installed "
                                    "(pip install memray; Linux and macOS only)")
            return
        path = folder / TRACE_FILE
        tracker = memray.Tracker(path, native_traces=True,
                                 file_format=memray.FileFormat.AGGREGATED_ALLOCATIONS)
        _log_level(memray, logging.CRITICAL)  # memray's "ERROR: Failed to mmap" is not the program's output
        try:
            tracker.__enter__()
        except RuntimeError as error:
            _log_level(memray, logging.WARNING)
            path.unlink(missing_ok=True)  # memray creates the file before refusing
            self.state["reason"] = f"{error} (another memray tracker is running in this process)"
            return
        self._started = (time.perf_counter(), time.time())  # memray's snapshots carry unix times
        self._tracker = tracker
        self.state = {"state": "on", "method": "memray native traces, aggregated"}
        self._unpatch = _yield_to_the_programs_tracker(memray, self._programs_tracker)

    @property
    def on(self) -> bool:
        return self._tracker is not None

    def stop(self) -> None:
        if self._unpatch is not None:
            unpatch, self._unpatch = self._unpatch, None
            unpatch()
        if self._tracker is not None:
            tracker, self._tracker = self._tracker, None
            tracker.__exit__(None, None, None)
            import memray
            _log_level(memray, logging.WARNING)  # memray's default

    def _programs_tracker(self) -> None:
        """The program enters a memray Tracker of its own (one per process): the audit's trace
        ends here, kept as far as it went, so the program's starts as it would alone."""
        if self._tracker is None:
            return
        at = time.perf_counter() - self._started[0] if self._started is not None else 0.0
        self.stop()
        self.state["reason"] = (f"ended early, {at:.2f} s into the run: the program started its own memray "
                                "Tracker (memray allows one per process); what was traced until then is kept")
        self._warn(f"memray: the audit's trace {self.state['reason']}")

    def summarize(self) -> dict:
        """Read the trace back: peak and the sites alive at the high-water mark (reading only;
        the flamegraph is written later, after the run record: write_flamegraph)."""
        path = self.folder / TRACE_FILE
        size = path.stat().st_size if path.exists() else None
        if not size:
            raise RuntimeError(f"memray's trace ({TRACE_FILE}) is {'empty' if size == 0 else 'missing'}: "
                               "memray stopped before writing it")
        self._reader = reader = _Reader(self.folder)
        try:
            read = reader.answer()
        except Exception as error:
            self._reader = None
            reader.close()
            if "does not look like a binary generated by memray" in str(error):
                raise RuntimeError(f"{error} (memray stops writing its trace when it cannot map more of its "
                                   "file: the process ran out of address space under a memory limit, or the "
                                   "disk filled)") from error
            raise
        self.high_water_perf, self.next_snapshot_perf = self._high_water_time(read["snapshots"], read["peak_memory"])
        return {
            "file": TRACE_FILE,
            "peak_memory": read["peak_memory"],
            "total_allocations": read["total_allocations"],
            "sites": read["sites"],
            "auditor_bytes": read["auditor_bytes"],
            "flamegraph": None,
        }

    def _high_water_time(self, best: dict | None, peak: int) -> tuple[float | None, float | None]:
        """perf_counter times of the snapshot with the highest heap (`best`: memray_reader's) and
        of the snapshot after it, or Nones when there is none or it falls short of the peak (the
        high-water moment fell between snapshots). memray's sampling thread stamps the time,
        then waits for the trace's lock and records the heap as it is then: under load that
        heap is from a moment up to the next stamp, not at its own."""
        if best is None or self._started is None or best["heap"] < SNAPSHOT_SHARE * peak:
            return None, None
        started_perf, started_unix = self._started
        next_ms = best["next_ms"] if best["next_ms"] is not None else best["time_ms"] + SNAPSHOT_INTERVAL_S * 1000
        return (started_perf + best["time_ms"] / 1000 - started_unix,
                started_perf + next_ms / 1000 - started_unix)

    def place(self, stages: list[dict], audit_seconds: Callable[[float], float] | None,
              fallback: dict) -> dict:
        """Which stage memray's high-water mark belongs to: the innermost of the finished
        `stages` open at its time (`audit_seconds` turns a perf_counter time into the audit's
        seconds); without a snapshot time, the run's RSS-peak stage `fallback` ({"stage",
        "stage_id"}), said so. Returns {"stage", "stage_id", "stage_basis", "at_s"}."""
        if self.high_water_perf is None or audit_seconds is None:
            return {"stage": fallback.get("stage"), "stage_id": fallback.get("stage_id"),
                    "stage_basis": RSS_BASIS, "at_s": None}
        at_s = audit_seconds(self.high_water_perf)
        until_s = audit_seconds(self.next_snapshot_perf) if self.next_snapshot_perf is not None else None
        holder = stage_at(stages, at_s, until_s)
        return {"stage": holder["path"] if holder else None, "stage_id": holder["id"] if holder else None,
                "stage_basis": TIME_BASIS, "at_s": round(at_s, 3)}

    def write_flamegraph(self) -> str | None:
        """The flamegraph of a summarized trace, in the run folder; its file name or None."""
        reader, self._reader = self._reader, None
        if reader is None:
            return None
        try:
            return reader.answer("flamegraph")
        finally:
            reader.close()


def _yield_to_the_programs_tracker(memray, stop_ours: Callable[[], None]) -> Callable[[], None]:
    """memray.Tracker, while the audit traces, as a subclass that ends the audit's trace before
    it starts (`stop_ours`); returns what puts memray's own class back."""
    original = memray.Tracker

    class Tracker(original):  # type: ignore[misc, valid-type]
        __doc__ = original.__doc__

        def __enter__(self):
            stop_ours()
            return super().__enter__()

    Tracker.__name__ = Tracker.__qualname__ = original.__name__
    Tracker.__module__ = original.__module__
    memray.Tracker = Tracker

    def unpatch() -> None:
        if memray.Tracker is Tracker:
            memray.Tracker = original
    return unpatch


def _log_level(memray, level: int) -> None:
    """Which of memray's own log lines reach stderr (an older memray: no say in it)."""
    set_level = getattr(memray, "set_log_level", None)
    if set_level is not None:
        set_level(level)


class _Reader:
    """memray_reader in a process of its own, holding the trace it read: the summary first, the
    flamegraph on request. Its crash (SIGSEGV in native symbol lookup under a memory limit) or
    failure raises RuntimeError; the audited process goes on."""

    def __init__(self, folder: Path):
        root = str(Path(__file__).resolve().parents[3])  # the folder holding the auditor package
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        # a file, not a pipe: memray's warnings cannot fill it; closed by close()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._process = subprocess.Popen(
            [sys.executable, "-m", "auditor.capture.probes.memray_reader", os.fspath(folder)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env)

    def answer(self, request: str | None = None):
        process = self._process
        assert process.stdin is not None and process.stdout is not None  # both pipes
        try:
            if request is not None:
                process.stdin.write(request + "\n")
                process.stdin.flush()
            line = process.stdout.readline()
        except OSError:  # it ended: said below
            line = ""
        if line.strip():
            return json.loads(line)
        status = process.wait()
        if status < 0:
            name = signal.Signals(-status).name
            why = ("interrupted: a Ctrl-C or stop reached its process group too"
                   if -status in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
                   else "its native symbol lookup can fail under a memory limit")
            raise RuntimeError(f"memray's reader was ended by {name} while reading the trace ({why})")
        self._stderr.seek(0)
        said = self._stderr.read().decode(errors="replace").strip().splitlines()
        raise RuntimeError(said[-1] if said else f"memray's reader ended with exit status {status}")

    def close(self) -> None:
        process = self._process
        with contextlib.suppress(OSError):
            if process.stdin is not None:
                process.stdin.close()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
        self._stderr.close()


def stage_at(stages: list[dict], at_s: float, until_s: float | None = None) -> dict | None:
    """The innermost stage open when the heap of the snapshot stamped `at_s` was recorded:
    in [at_s, until_s) (the next snapshot's stamp; by default the stamp's millisecond, as
    memray truncates), widened by a little for the clock conversion. Of the innermost stages
    (none of its children qualifies too) overlapping that window, the one with the higher RSS
    peak (where memory stood highest), then the one overlapping it most."""
    end = max(until_s if until_s is not None else at_s, at_s + SNAPSHOT_RESOLUTION_S)
    low, high = at_s - CLOCK_SLACK_S, end + CLOCK_SLACK_S
    overlap = {s["id"]: min(high, s["end_s"]) - max(low, s["start_s"]) for s in stages
               if s.get("start_s") is not None and s.get("end_s") is not None
               and s["start_s"] <= high and s["end_s"] >= low}
    holding = [s for s in stages if s.get("id") in overlap]
    parents = {s.get("parent") for s in holding}
    innermost = [s for s in holding if s["id"] not in parents] or holding
    return max(innermost, key=lambda s: ((s.get("rss") or {}).get("peak") or 0, overlap[s["id"]]),
               default=None)


def top_sites(records, limit: int = TOP_SITES) -> tuple[list[dict], int]:
    """Allocations alive at the high-water mark, grouped by their innermost user-code frame;
    and the bytes of those the auditor itself made (left out of the sites)."""
    sites: dict[str, dict] = {}
    auditor_bytes = 0
    for record in records:
        user = site_frame(python_stack(record))
        if user is not None and is_auditor_code(user[1]):
            auditor_bytes += record.size
            continue
        location = f"{user[1]}:{user[2]}" if user else "<no Python frame>"
        site_entry = sites.setdefault(location, {
            "location": location, "function": user[0] if user else None,
            "code": linecache.getline(user[1], user[2]).strip() or None if user else None,
            "bytes": 0, "allocations": 0, "_largest": None})
        site_entry["bytes"] += record.size
        site_entry["allocations"] += record.n_allocations
        if site_entry["_largest"] is None or record.size > site_entry["_largest"].size:
            site_entry["_largest"] = record
    ranked = sorted(sites.values(), key=lambda s: s["bytes"], reverse=True)[:limit]
    for site_entry in ranked:
        largest = site_entry.pop("_largest")
        site_entry["python_stack"] = [_frame_text(frame)
                                      for frame in python_stack(largest)[:PYTHON_FRAMES]]
        site_entry["native_stack"] = [_frame_text(frame)
                                      for frame in _hybrid_stack(largest)[:NATIVE_FRAMES]]
    return ranked, auditor_bytes


def python_stack(record) -> list:
    """The whole recorded Python stack, innermost first.

    `stack_trace()` without a limit drops, on the main thread, as many outer frames as were
    on the stack when the tracker started (meant to hide `memray run`'s launcher). Started
    from inside a library, that hides the user's own frames, often all of them; with an
    explicit limit memray returns the stack as recorded."""
    return record.stack_trace(max_stacks=ALL_FRAMES)


def site_frame(stack: list):
    """The innermost frame in user code; an auditor frame met first is returned as itself
    (the auditor made that allocation: top_sites sums it apart); the innermost frame otherwise
    (library code called from nowhere in user code, such as an import)."""
    below_an_operator = False  # an inner frame is torch's operator call
    for frame in stack:
        function, filename = frame[0], frame[1]
        if passes_through(function, filename, below_an_operator):
            below_an_operator = below_an_operator or filename.endswith(_OPERATOR)
            continue
        if is_program_code(filename) or filename.startswith(AUDITOR):
            return frame
    return stack[0] if stack else None


def _hybrid_stack(record) -> list:
    try:
        return record.hybrid_stack_trace()
    except (NotImplementedError, RuntimeError, ValueError):
        return []


def _frame_text(frame) -> str:
    function, filename, line = frame
    function = function if len(function) <= FRAME_TEXT else function[:FRAME_TEXT] + "..."
    return f"{function} at {filename}:{line}" if line else f"{function} ({filename})"


_OPERATOR = os.path.join("torch", "_ops.py")  # torch's operator call


def write_flamegraph(reader, records, folder: Path) -> str | None:
    """Self-contained HTML (no_web: no scripts fetched from a CDN); memray's CLI as fallback."""
    out = folder / FLAMEGRAPH_FILE
    try:
        from memray.reporters.flamegraph import FlameGraphReporter
        reporter = FlameGraphReporter.from_snapshot(
            records, memory_records=tuple(reader.get_memory_snapshots()),
            native_traces=reader.metadata.has_native_traces)
        try:
            with safe_files.replaced(out, "w") as f:  # a link planted at `out` is replaced, never followed
                reporter.render(outfile=f, metadata=reader.metadata, show_memory_leaks=False,
                                merge_threads=True, inverted=False, no_web=True)
        except OSError:  # disk full: no half-written flamegraph left to be linked
            out.unlink(missing_ok=True)
            raise
        return FLAMEGRAPH_FILE
    except (ImportError, AttributeError, TypeError):  # reporter API moved: use the CLI
        out.unlink(missing_ok=True)
        result = subprocess.run(
            [sys.executable, "-m", "memray", "flamegraph", "--no-web", "-f", "-o", str(out),
             str(folder / TRACE_FILE)], capture_output=True, text=True)
        return FLAMEGRAPH_FILE if result.returncode == 0 and out.exists() else None
