"""Candidates without storing them: one global threshold t, and each tensor's candidates recomputed.

The threshold is found by the baseline's exact counting search (`threshold.candidate_threshold`),
fed one tensor at a time from disk; a tensor's candidates are then `score < t`, scored by the
baseline's own `TensorScores`. Since t is one number, candidates are recomputed block by block
whenever they are needed (to reduce them, to gather a gradient at them, to write the masks)
instead of being kept: no mask, no positions, for any tensor, ever.

The recomputation holds on the reduced weights too: times r (0 < r <= 1) a candidate's |w| can
only shrink (rounding is monotonic, so |fl(w * r)| <= |w| < t, and likewise for |w| * ||X_j||),
and the other weights are never written to. So reduced weights and t give the same candidates.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import chain

import torch

from ..blocks import row_blocks
from ..strategies import TensorScores
from ..threshold import candidate_threshold
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


class Candidates:
    """One weight tensor's candidates, `score < t`, computed block by block when asked for.

    Holds the weight: drop it with the stage it belongs to.
    """

    def __init__(self, weight: torch.Tensor, threshold: float, scale: torch.Tensor | None = None):
        self.weight, self.threshold = weight.detach(), threshold
        self.scores = TensorScores(self.weight, scale)

    def blocks(self) -> Iterator[tuple[slice, torch.Tensor]]:
        for rows in row_blocks(self.weight):
            yield rows, torch.lt(self.scores.block(rows), self.threshold)  # the baseline's comparison

    def count(self) -> int:
        return sum(int(torch.count_nonzero(chosen)) for _, chosen in self.blocks())

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor`'s values at the candidates, in row-major order (as `masked_select` reads them)."""
        return torch.cat([torch.masked_select(tensor[rows], chosen) for rows, chosen in self.blocks()])

    @torch.no_grad()
    def reduce(self, reduction_factor: float) -> None:
        """Candidates times r, in place: the baseline's `reduce_candidates`, block for block."""
        for rows, chosen in self.blocks():
            block = self.weight[rows]
            block.copy_(torch.where(chosen, block * reduction_factor, block))

    def scatter(self, target: torch.Tensor, values: torch.Tensor) -> None:
        """Put `values` (one per candidate, in `gather`'s order) into `target` at the candidates."""
        start = 0
        for rows, chosen in self.blocks():
            count = int(torch.count_nonzero(chosen))
            target[rows].masked_scatter_(chosen, values[start:start + count])
            start += count
