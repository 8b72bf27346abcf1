"""Handing freed memory back to the OS between stages.

glibc keeps freed heap memory for reuse instead of returning it, so after a decoder layer's
backward (many activations and gradient blocks under its 32 MiB mmap threshold) the process's
RSS stays hundreds of MiB above what is alive, and the next layer is loaded on top of that.
`malloc_trim(0)` returns every free page; it costs a few milliseconds. Elsewhere (macOS, musl)
this is a no-op.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache


@cache
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_memory() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
