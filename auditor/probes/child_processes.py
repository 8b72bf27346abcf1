"""The audited process's child processes: how much memory they held outside the record.

A child process (a DataLoader worker, a multiprocessing.Process, a subprocess) is not audited:
its memory is in none of the record's figures, which are the audited process's own. So that a
record never passes for the whole program's memory when it is not, its end says what the
children held:

- `largest_ended_peak_rss`: getrusage(RUSAGE_CHILDREN).ru_maxrss, the kernel's high-water mark of
  the largest child (or descendant) that ended and was waited for. Read at the audit's start
  and end: where it rose, a child that ended during the run peaked at exactly that. Where it
  did not rise, the children that ended peaked no higher than before the run (None).
- `alive_at_end`, `alive_rss_at_end`: the children still running as the audit ends, their RSS
  summed (psutil; their peaks are not known); `alive_uss_at_end`, the part of it no other
  process maps (USS, from /proc/PID/smaps: what they would give back on ending; None where a
  child's cannot be read).

A forked child's RSS counts the pages it still shares with this process (copy on write), so
RSS is each child's as `ps` shows it, not memory the children added; USS is what they added
(a forked worker holding 100 MB of its own beside its parent's 300 MB: 401.8 MiB RSS, 98.3
MiB USS; tests/test_child_processes.py's FORKED_WORKER).
"""
from __future__ import annotations

import resource
import sys


def ended_peak_rss() -> int:
    """The largest peak RSS of the children that ended and were waited for, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # kilobytes on Linux


def at_end(ended_peak_before: int) -> dict | None:
    """The record's `process.children` as the audit ends; None: no child rose above the
    earlier peak and none is running."""
    ended = ended_peak_rss()
    alive = _alive()
    if ended <= ended_peak_before and not alive:
        return None
    uss = [own for _, own in alive if own is not None]
    return {"largest_ended_peak_rss": ended if ended > ended_peak_before else None,
            "alive_at_end": len(alive), "alive_rss_at_end": sum(rss for rss, _ in alive),
            "alive_uss_at_end": sum(uss) if len(uss) == len(alive) else None}


def _alive() -> list[tuple[int, int | None]]:
    """(RSS, USS or None) of each child still running."""
    import psutil
    found: list[tuple[int, int | None]] = []
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return found
    for child in children:
        try:
            rss = child.memory_info().rss
        except psutil.Error:  # ended (or not ours to read) between the listing and the read
            continue
        try:
            uss = child.memory_full_info().uss
        except (psutil.Error, AttributeError):
            uss = None
        found.append((rss, uss))
    return found
