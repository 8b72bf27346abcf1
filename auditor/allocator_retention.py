"""What glibc's malloc keeps after frees, as the projections model it.

glibc serves blocks below its mmap threshold from the heap, and each thread's arena may keep up
to its trim threshold (twice the mmap threshold) free at its top. The threshold starts at
128 KiB and follows the largest mmapped block freed, up to 32 MiB on 64-bit (a threshold set
in the environment stays fixed). The live-tensor meter follows it (`allocator_threshold` of a
stage's live tensors); a small run's stays small, a large one's reaches tens of MiB, so what
the arenas may keep grows by 0 to threads x 2 x the difference. Projections take the middle,
threads x the difference.

Measured on GradProbe (GPT-Neo, 1 -> 2 layers, hidden 128 -> 512): RSS beyond tensors grew
from 366 to 429 MiB, and stayed at 366 with the threshold fixed (MALLOC_MMAP_THRESHOLD_=131072).
"""
from __future__ import annotations

MMAP_THRESHOLD_START = 128 * 1024
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit


def growth(threads: int, audited_threshold: int, target_threshold: float) -> int:
    """The retention growth a projection adds: the middle of 0 to threads x 2 x the threshold's
    growth (never below 0)."""
    return max(round(threads * (target_threshold - audited_threshold)), 0)
