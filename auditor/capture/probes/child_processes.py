"""The audited process's child processes: how much memory they held outside the record.

A child process (a DataLoader worker, a multiprocessing.Process, a subprocess) is not audited:
its memory is in none of the record's figures, which are the audited process's own. So that a
record never passes for the whole program's memory when it is not, it says what the children
held:

- `largest_ended_peak_rss`: getrusage(RUSAGE_CHILDREN).ru_maxrss, the kernel's high-water mark of
  the largest child (or descendant) that ended and was waited for. Read at the audit's start
  and end: where it rose, a child that ended during the run peaked at exactly that. Where it
  did not rise, the children that ended peaked no higher than before the run (None).
- `alive_at_end`, `alive_rss_at_end`: the children still running as the audit ends, their RSS
  summed (psutil; their peaks are not known); `alive_uss_at_end`, the part of it no other
  process maps (USS, from /proc/PID/smaps: what they would give back on ending; None where a
  child's cannot be read); `alive_forked_at_end`, how many of them run this process's own
  program with its own arguments (forked without exec: copy on write).
- `at_stage_ends`: readings of the same at the end of top-level stages while a child ran
  ({stage, at_s, alive, forked, rss, uss}), so a child that ended before the audit did is
  still read, and how its own memory grew is seen stage by stage. Taken at most once a
  second (`MIN_GAP_S`) unless the set of children changed, at most `MAX_READINGS`; a child's
  memory between readings is not known.

A forked child's RSS counts the pages it still shares with this process (copy on write), so
RSS is each child's as `ps` shows it, not memory the children added; USS is what they added
(a forked worker holding 100 MB of its own beside its parent's 300 MB: 401.8 MiB RSS, 98.3
MiB USS; tests/test_child_processes.py's FORKED_WORKER). A page this process writes after the
fork becomes the child's own too: a child forked after the model is built comes to own a copy
of every page of it the parent changes later.

USS needs psutil's `memory_full_info` (Linux, macOS, Windows); where it is not available the
readings say None and the report says the children's own memory is not known.
"""
from __future__ import annotations

import os
import resource
import sys
import threading

MIN_GAP_S = 1.0      # between two readings at stage ends, unless the set of children changed
MAX_READINGS = 200   # readings kept at stage ends (the end's reading is apart)
_PROC_LISTS: bool | None = None  # /proc/PID/task/TID/children exists here (None: not looked yet)


def ended_peak_rss() -> int:
    """The largest peak RSS of the children that ended and were waited for, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # kilobytes on Linux


class ChildWatch:
    """Readings of the running children at top-level stage ends (`at_stage_end`)."""

    def __init__(self) -> None:
        self.readings: list[dict] = []
        self._seen: frozenset[int] = frozenset()
        self._last_s: float | None = None

    def at_stage_end(self, stage: str, at_s: float) -> None:
        pids = frozenset(_child_pids())
        if pids == self._seen and (not pids or (self._last_s is not None and at_s - self._last_s < MIN_GAP_S)):
            return  # none running and none before, or the same ones read under a second ago
        if len(self.readings) >= MAX_READINGS:
            return
        alive = _read(sorted(pids))
        self._seen, self._last_s = pids, at_s
        self.readings.append({"stage": stage, "at_s": round(at_s, 6), **_summed(alive)})


def at_end(ended_peak_before: int, watch: ChildWatch | None = None) -> dict | None:
    """The record's `process.children` as the audit ends; None: no child rose above the
    earlier peak, none is running and none was seen at a stage end."""
    ended = ended_peak_rss()
    alive = _read(sorted(_child_pids()))
    readings = watch.readings if watch is not None else []
    held = [r for r in readings if r["alive"]]
    if ended <= ended_peak_before and not alive and not held:
        return None
    summed = _summed(alive)
    return {"largest_ended_peak_rss": ended if ended > ended_peak_before else None,
            "alive_at_end": summed["alive"], "alive_rss_at_end": summed["rss"],
            "alive_uss_at_end": summed["uss"], "alive_forked_at_end": summed["forked"],
            **({"at_stage_ends": readings} if held else {})}


def _summed(alive: list[tuple[int, int | None, bool]]) -> dict:
    """{alive, forked, rss, uss}: USS None unless every child's was read."""
    uss = [own for _, own, _ in alive if own is not None]
    return {"alive": len(alive), "forked": sum(1 for *_, forked in alive if forked),
            "rss": sum(rss for rss, _, _ in alive), "uss": sum(uss) if len(uss) == len(alive) else None}


def _child_pids() -> list[int]:
    """The running children and their descendants: from /proc's per-thread lists where Linux
    has them (no scan of every process: read at stage ends), else psutil."""
    global _PROC_LISTS
    me = os.getpid()
    if _PROC_LISTS is None:  # a kernel without CONFIG_PROC_CHILDREN, or not Linux: psutil's scan
        _PROC_LISTS = os.path.exists(f"/proc/{me}/task/{threading.get_native_id()}/children")
    if not _PROC_LISTS:
        import psutil
        try:
            return [child.pid for child in psutil.Process().children(recursive=True)]
        except psutil.Error:
            return []
    found: list[int] = []
    queue = [me]
    while queue:
        pid = queue.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:  # ended since it was listed
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as listing:
                    pids = [int(p) for p in listing.read().split()]
            except OSError:  # the thread ended between the two reads
                continue
            found += pids
            queue += pids
    return found


def _read(pids: list[int]) -> list[tuple[int, int | None, bool]]:
    """(RSS, USS or None, forked) of each child still running: forked, it runs this process's
    program with its arguments (no exec since the fork)."""
    import psutil
    found: list[tuple[int, int | None, bool]] = []
    try:
        me = psutil.Process()
        own = (me.exe(), me.cmdline())
    except psutil.Error:
        own = None
    for pid in pids:
        try:
            child = psutil.Process(pid)
            rss = child.memory_info().rss
            if child.status() == psutil.STATUS_ZOMBIE:
                continue  # ended, not yet waited for: it holds nothing
            forked = own is not None and (child.exe(), child.cmdline()) == own
        except psutil.Error:  # ended (or not ours to read) between the listing and the read
            continue
        try:
            uss = child.memory_full_info().uss
        except (psutil.Error, AttributeError):  # not available on this platform, or not ours
            uss = None
        found.append((rss, uss, forked))
    return found
