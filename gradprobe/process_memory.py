"""The process's resident memory, read from the OS (what the CLI reports; bytes)."""
from __future__ import annotations

import resource
import sys

import psutil


def current_rss() -> int:
    return psutil.Process().memory_info().rss


def peak_rss() -> int:
    """Highest RSS of the process so far (the kernel's high-water mark, ru_maxrss)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # KiB on Linux, bytes on macOS
