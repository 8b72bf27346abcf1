"""The k-th smallest of many non-negative scores, exact, without concatenating them.

Non-negative float32 numbers sort like their bit patterns read as integers. So the k-th smallest
is found by counting: one pass histograms the high 16 bits of every score, a second pass
histograms the low 16 bits of the scores in the bin that holds the k-th. Scores stream in
blocks (see `blocks`), so the transient is a few blocks and two 65,536-bin histograms, never a
full copy: concatenating |w| for TinyStories-33M would cost 261 MiB, and `torch.kthvalue` on it
copies it again. Scores spread over several processes (a sharded model's ranks) give the same
threshold when each histogram is summed over them (`combine`): counts add exactly.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

_BINS = 1 << 16


def _alone(counts: torch.Tensor) -> torch.Tensor:
    return counts


def kth_smallest(score_blocks: Callable[[], Iterable[torch.Tensor]], k: int,
                 combine: Callable[[torch.Tensor], torch.Tensor] = _alone) -> float:
    """The k-th smallest (1-based) score; `score_blocks()` yields the scores afresh on each call,
    `combine` sums a histogram with the other processes' (if the scores are spread over several)."""
    high = combine(_histogram(score_blocks(), lambda bits: bits >> 16))
    high_bin, rank = bin_holding(high, k)
    low = combine(_histogram(score_blocks(), lambda bits: bits[(bits >> 16) == high_bin] & 0xFFFF))
    low_bin, _ = bin_holding(low, rank)
    return torch.tensor([(high_bin << 16) | low_bin], dtype=torch.int32).view(torch.float32).item()


def candidate_threshold(score_blocks: Callable[[], Iterable[torch.Tensor]], total: int,
                        fraction: float, combine: Callable[[torch.Tensor], torch.Tensor] = _alone) -> float:
    """t such that `score < t` holds for round(fraction * total) scores (fewer only on exact ties)."""
    k = round(fraction * total)
    if k <= 0:
        return 0.0  # scores are >= 0: nothing is below 0
    if k >= total:
        return float("inf")
    return kth_smallest(score_blocks, k + 1, combine)  # the smallest score that is not a candidate


def _histogram(blocks: Iterable[torch.Tensor], key: Callable) -> torch.Tensor:
    counts = torch.zeros(_BINS, dtype=torch.int64)
    for block in blocks:
        bits = block.to(torch.float32).contiguous().view(torch.int32)
        if bits.numel() and int(bits.min()) < 0:
            raise ValueError("scores must be non-negative")
        counts += torch.bincount(key(bits).flatten(), minlength=_BINS).cpu()
    return counts


def bin_holding(counts: torch.Tensor, k: int) -> tuple[int, int]:
    """The bin holding the k-th smallest value, and that value's rank inside the bin."""
    cumulative = torch.cumsum(counts, 0)
    index = int(torch.searchsorted(cumulative, k))  # first bin whose cumulative count reaches k
    before = int(cumulative[index - 1]) if index else 0
    return index, k - before
