"""Values at candidate positions: read out of a tensor into a short vector, and written back.

A vector of candidate values holds one value per candidate, in the tensor's row-major order:
with s = 0.1 it is a tenth of the tensor. Candidates may be a dense bool mask or a `PackedMask`;
both are walked chunk by chunk, so the transient is a few MiB whatever the tensor's size.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TypeGuard

import torch

from .packed_mask import CHUNK, PackedMask

CandidateMask = torch.Tensor | PackedMask  # dense bool, True = candidate; or the same as bits


def dense(mask: CandidateMask) -> torch.Tensor:
    """A mask known to be a bool tensor (a strategy's choice, before any packing)."""
    if isinstance(mask, PackedMask):
        raise TypeError("a bool mask was expected, not packed bits")
    return mask


def all_packed(masks: Mapping[str, CandidateMask]) -> TypeGuard[Mapping[str, PackedMask]]:
    """Whether every mask is kept as bits (so the sparse state's M_f)."""
    return all(isinstance(mask, PackedMask) for mask in masks.values())


def count_candidates(mask: CandidateMask) -> int:
    return mask.count if isinstance(mask, PackedMask) else int(torch.count_nonzero(mask))


def candidate_chunks(mask: CandidateMask) -> Iterator[tuple[slice, torch.Tensor, slice]]:
    """(positions in the flattened tensor, which of them are candidates, their places in a candidate vector)."""
    placed = 0
    for where, chosen in _chunks(mask):
        count = int(torch.count_nonzero(chosen))
        yield where, chosen, slice(placed, placed + count)
        placed += count


def candidates_between(mask: CandidateMask, start: int, stop: int) -> torch.Tensor:
    """Which of the flattened positions start to stop are candidates (bool, a view where it can be)."""
    return mask.between(start, stop) if isinstance(mask, PackedMask) else mask.reshape(-1)[start:stop]


def _chunks(mask: CandidateMask) -> Iterator[tuple[slice, torch.Tensor]]:
    if isinstance(mask, PackedMask):
        yield from mask.chunks()
        return
    flat = mask.reshape(-1)
    for start in range(0, flat.numel(), CHUNK):
        yield slice(start, start + CHUNK), flat[start:start + CHUNK]


def candidate_values(tensor: torch.Tensor, mask: CandidateMask) -> torch.Tensor:
    """A copy of `tensor`'s values at the candidates, in its own dtype (so exact)."""
    values = torch.empty(count_candidates(mask), dtype=tensor.dtype, device=tensor.device)
    flat = tensor.detach().reshape(-1)
    for where, chosen, places in candidate_chunks(mask):
        values[places] = flat[where][chosen]
    return values


@torch.no_grad()
def put_candidate_values_(tensor: torch.Tensor, mask: CandidateMask, values: torch.Tensor) -> None:
    """Write `values` back at the candidates, in place; every other element is left alone."""
    flat = tensor.view(-1)  # view, not reshape: a copy would silently drop the writes
    for where, chosen, places in candidate_chunks(mask):
        flat[where].masked_scatter_(chosen, values[places])


@torch.no_grad()
def scale_candidates_(tensor: torch.Tensor, mask: CandidateMask, factor: float) -> None:
    """Every candidate times `factor`, in place, with the baseline's arithmetic (so the same bits)."""
    flat = tensor.view(-1)
    for where, chosen, _ in candidate_chunks(mask):
        block = flat[where]
        block.copy_(torch.where(chosen, block * factor, block))
