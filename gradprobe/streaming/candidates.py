"""Candidates without a mask: one global threshold t, and each tensor's candidates found on load.

The threshold is found by the baseline's exact counting search (`threshold.candidate_threshold`),
fed one tensor at a time from disk, or, for half-precision weights by magnitude, by one histogram
of their |w| bit patterns (`HalfMagnitudes`), filled as the first gradient pass loads them; a
tensor's candidates are then `score < t`, scored by the baseline's own `TensorScores`. Since t
is one number, a stage's candidates are found again each time the stage is loaded, from its
original weights, and dropped with the stage: nothing about the candidates of the other stages
is kept. While a stage is loaded its candidates are flat
positions (ascending, int32 where they fit): 0.4 bytes per weight at 10% candidates where a bool
mask takes 1, and a gradient is gathered at them by one `index_select` (a `masked_select` over
the blocks again would cost ~50x the time, every batch).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import chain

import torch

from ..strategies import TensorScores
from ..threshold import bin_holding, candidate_threshold
from .weights_folder import WeightsFolder


def global_threshold(folder: WeightsFolder, names: list[str], sparsity: float,
                     scales: dict[str, torch.Tensor] | None = None) -> float:
    """t such that a fraction `sparsity` of all the named tensors' scores lie below it.

    Each of the search's two counting passes reads the tensors from disk again, one at a time,
    in their stored dtype (|w| of a bf16 weight is exact in fp32, as the scores are taken).
    """
    scales = scales or {}
    total = sum(math.prod(folder.stored_tensor(name).shape) for name in names)

    def every_block():
        return chain.from_iterable(TensorScores(folder.load(name), scales.get(name)).blocks() for name in names)

    return candidate_threshold(every_block, total, sparsity)


HALF_DTYPES = (torch.bfloat16, torch.float16)
CHUNK_ELEMENTS = 1 << 19  # 2 MiB of fp32 scores: under the mmap threshold (`heap.MMAP_THRESHOLD`)
MASK_PART = 1 << 21  # 2 MiB of a uint8 mask, likewise


class HalfMagnitudes:
    """The magnitude threshold of half-precision weights in one pass: a histogram of |w| bit patterns.

    A bf16 or fp16 |w| has one of 2^15 bit patterns, and non-negative patterns sort like their
    values, so counting them gives the k-th smallest |w| exactly, and it is the k-th smallest fp32
    score the baseline's two-pass search finds (fp32 holds every half value exactly). Tensors are
    counted as the first gradient pass loads them, so no pass over the files is spent on t.
    """

    def __init__(self, total: int, sparsity: float):
        self.total, self.sparsity = total, sparsity
        self.counts = torch.zeros(1 << 15, dtype=torch.int64)
        self.counted: set[str] = set()
        self.dtype: torch.dtype | None = None

    def add(self, name: str, stored: torch.Tensor) -> None:
        if name in self.counted:
            return  # a tied tensor, loaded by two stages
        self.counted.add(name)
        self.dtype = stored.dtype
        bits = stored.reshape(-1).view(torch.int16)
        magnitude = torch.empty(min(bits.numel(), CHUNK_ELEMENTS), dtype=torch.int16)  # reused: see Candidates
        for start in range(0, bits.numel(), CHUNK_ELEMENTS):
            chunk = bits[start:start + CHUNK_ELEMENTS]
            part = torch.bitwise_and(chunk, 0x7FFF, out=magnitude[:chunk.numel()])
            self.counts += torch.bincount(part, minlength=1 << 15)

    def threshold(self) -> float:
        """As `threshold.candidate_threshold`: the smallest score that is not a candidate."""
        k = round(self.sparsity * self.total)
        if k <= 0:
            return 0.0
        if k >= self.total:
            return float("inf")
        if self.dtype is None:
            raise RuntimeError("no tensor was counted: the threshold has nothing to rank")
        pattern, _ = bin_holding(self.counts, k + 1)
        return torch.tensor([pattern], dtype=torch.int16).view(self.dtype).float().item()


class Candidates:
    """One weight tensor's candidates, `score < t`, as flat positions found a chunk of rows at a time.

    Chunks of at most `CHUNK_ELEMENTS` keep every temporary (the fp32 scores, the comparison, the
    chunk's positions) under the 4 MiB mmap threshold the pruner sets (`heap`), so they come from
    the heap, reused chunk after chunk, and stay in the cache. Scored in 16 MiB blocks, each block's
    temporaries were fresh mappings: a 7B decoder layer faulted in ~1.4 GB of pages per search.
    """

    def __init__(self, weight: torch.Tensor, threshold: float, scale: torch.Tensor | None = None):
        self.weight = weight.detach()
        rows = self.weight.reshape(1, -1) if self.weight.dim() < 2 else self.weight.reshape(self.weight.shape[0], -1)
        width = rows.shape[1]
        if scale is not None and self.weight.dim() < 2:
            scale = scale.view(1, -1)
        index_dtype = torch.int32 if self.weight.numel() < 2**31 else torch.int64
        step = max(1, CHUNK_ELEMENTS // max(1, width))
        scores = torch.empty(min(rows.shape[0], step) * width)
        below = torch.empty(scores.shape, dtype=torch.bool)
        parts = []
        for start in range(0, rows.shape[0], step):
            end = min(rows.shape[0], start + step)
            chunk = scores[:(end - start) * width].view(end - start, width)
            torch.abs(chunk.copy_(rows[start:end]), out=chunk)  # the score, as TensorScores: |w| in fp32
            if scale is not None:
                chunk.mul_(scale if scale.shape[0] == 1 else scale[start:end])
            chosen = torch.lt(chunk, threshold, out=below[:chunk.numel()].view(chunk.shape)).view(-1)
            parts.append((torch.nonzero(chosen).view(-1) + start * width).to(index_dtype))
        self.positions = torch.cat(parts) if parts else torch.empty(0, dtype=index_dtype)

    def count(self) -> int:
        return self.positions.numel()

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor`'s values at the candidates, in row-major order (as `masked_select` reads them)."""
        return tensor.reshape(-1).index_select(0, self.positions)

    @torch.no_grad()
    def reduce(self, reduction_factor: float) -> None:
        """Candidates times r, in place (the same fp32 multiply as the baseline's `reduce_candidates`)."""
        flat = self.weight.view(-1)
        flat.index_put_((self.positions,), flat.index_select(0, self.positions) * reduction_factor)

    def range_bounds(self, start: int, end: int) -> tuple[int, int]:
        """Where the candidates with flat positions in [start, end) lie in `positions` (a slice)."""
        bounds = torch.tensor([start, end], dtype=self.positions.dtype)
        low, high = torch.searchsorted(self.positions, bounds).tolist()
        return low, high

    def zero_chosen(self, weight: torch.Tensor, chosen: torch.Tensor, step: int = 1 << 20) -> None:
        """weight[candidate] = 0 where `chosen` (one bool per candidate), in place, a million at a time
        (the int64 index that indexing makes is then 8 MiB, not 8 bytes per candidate)."""
        flat = weight.view(-1)
        for start in range(0, self.count(), step):
            positions = self.positions[start:start + step][chosen[start:start + step]]
            flat.index_fill_(0, positions.to(torch.int64), 0)

    def mask_parts(self, chosen: torch.Tensor, part: int = MASK_PART) -> Iterator[tuple[int, torch.Tensor]]:
        """The uint8 mask, 1 at the chosen candidates, as `zero_mask_parts` gives its parts."""
        for start, values in zero_mask_parts(self.weight.numel(), part):
            low, high = self.range_bounds(start, start + values.numel())
            positions = self.positions[low:high][chosen[low:high]]
            values.index_fill_(0, (positions - start).to(torch.int64), 1)
            yield start, values

    def scatter(self, target: torch.Tensor, values: torch.Tensor) -> None:
        """Put `values` (one per candidate, in `gather`'s order) into `target` at the candidates."""
        target.view(-1).index_put_((self.positions,), values)


def zero_mask_parts(size: int, part: int = MASK_PART) -> Iterator[tuple[int, torch.Tensor]]:
    """An all-zero uint8 mask of `size` elements as (first element, part) pairs over the flat
    tensor; every part is the same reused buffer, zeroed again and valid until the next."""
    buffer = torch.empty(min(size, part), dtype=torch.uint8)
    for start in range(0, size, part):
        yield start, buffer[:min(size, start + part) - start].zero_()
