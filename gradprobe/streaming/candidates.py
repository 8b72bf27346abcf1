"""Candidates without a candidate mask in memory: one global threshold, positions recomputed per load.

The magnitude strategy's threshold t is found by the same exact counting search the baseline
uses (`threshold.candidate_threshold`), fed one tensor at a time from disk; a tensor's candidates
are then `score < t`, scored by the baseline's own `TensorScores`. Since t is one number, a
stage's candidates are recomputed each time the stage is loaded, from its original weights,
instead of being stored: the same weights and the same t always give the same candidates.

In a loaded stage, candidates are held as flat positions (ascending, int32 where they fit: 0.4
bytes per weight at 10% candidates, where a bool mask would take 1).
"""
from __future__ import annotations

import math
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


def candidate_positions(weight: torch.Tensor, threshold: float, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Flat positions of `weight`'s candidates, ascending (the order `masked_select` reads them)."""
    scores = TensorScores(weight, scale)
    per_row = weight[0].numel() if weight.dim() else 1
    index_dtype = torch.int32 if weight.numel() < 2**31 else torch.int64
    parts = []
    for rows in row_blocks(weight):
        below = torch.lt(scores.block(rows), threshold).view(-1)  # the baseline's comparison
        parts.append((torch.nonzero(below).view(-1) + (rows.start or 0) * per_row).to(index_dtype))
    return torch.cat(parts) if parts else torch.empty(0, dtype=index_dtype)


@torch.no_grad()
def reduce(weight: torch.Tensor, positions: torch.Tensor, reduction_factor: float) -> None:
    """Candidates times r, in place (as the baseline: the same fp32 multiply)."""
    flat = weight.view(-1)
    flat.index_put_((positions,), flat.index_select(0, positions) * reduction_factor)
