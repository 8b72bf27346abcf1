"""The gradient record G kept at candidate positions only, and the decision read from it.

The decision compares G1 with G0 only where M_t is True, so a variant that knows M_t before its
first gradient pass keeps one value per candidate instead of one per weight: at s = 0.1, a tenth
of the baseline's dense G0 and G1. The values are the baseline's at those positions, bit for bit:
the same |grad|, rounded to the same storage dtype, folded by the same maximum.

A gradient can be folded in whole (`update`) or a few rows at a time (`update_rows`), for a
tensor whose gradient is never made whole (`row_gradients`).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from ..decision import is_pruned
from .at_candidates import CandidateMask, candidate_chunks, candidates_between, count_candidates
from .packed_mask import CHUNK, PackedMask


class CandidateMaxima:
    """Per tensor, the running max of |grad| over batches, one value per candidate."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], candidates: Mapping[str, CandidateMask],
                 dtype: torch.dtype):
        self.candidates = candidates
        self.shapes = {name: tensors[name].shape for name in candidates}
        # Starting from 0 gives the baseline's values: max(0, |g|) = |g| (NaN stays NaN), and a
        # tensor that gets no gradient in a batch stays at 0, as in the baseline.
        self.maxima = {name: torch.zeros(count_candidates(mask), dtype=dtype, device=tensors[name].device)
                       for name, mask in candidates.items()}
        self.rows: dict[str, CandidateRows] = {}  # made on first use by `update_rows`

    def update(self, name: str, grad: torch.Tensor | None) -> None:
        """Fold one batch's gradient of tensor `name` in; tensors without candidates are skipped."""
        if grad is None or name not in self.maxima:  # biases and norms: computed, never recorded
            return
        kept, flat = self.maxima[name], grad.reshape(-1)
        for where, chosen, places in candidate_chunks(self.candidates[name]):
            torch.maximum(kept[places], flat[where][chosen].abs().to(kept.dtype), out=kept[places])

    def update_rows(self, name: str, first: int, grad_rows: torch.Tensor,
                    skip: torch.Tensor | None = None) -> None:
        """Fold in this batch's gradient of rows `first`, `first + 1`, ... of tensor `name`.

        `skip` (bool, one per row) leaves rows alone whose gradient is not complete yet.
        """
        if name not in self.maxima:
            return
        if name not in self.rows:
            self.rows[name] = CandidateRows(self.candidates[name], self.shapes[name])
        chosen, places = self.rows[name].select(first, first + grad_rows.shape[0])
        kept = self.maxima[name][places]
        fresh = grad_rows.reshape(-1)[chosen].abs().to(kept.dtype)
        if skip is not None:  # those rows' candidates keep their value: max(k, k) = k
            skipped = skip.unsqueeze(1).expand(grad_rows.shape).reshape(-1)[chosen]
            fresh = torch.where(skipped, kept, fresh)
        torch.maximum(kept, fresh, out=kept)


class CandidateRows:
    """Where each row's candidates lie in a tensor's candidate vector: row r's between offsets r and r + 1.

    One int64 per row (400 KiB for a 50k-token vocabulary), counted a block of rows at a time.
    """

    def __init__(self, candidates: CandidateMask, shape: torch.Size):
        self.candidates, self.row_length = candidates, shape[1:].numel()
        rows, device = shape[0], _device(candidates)
        counts = torch.zeros(rows + 1, dtype=torch.int64, device=device)
        # count_nonzero over a dim makes an int64 per element: a 16th of a chunk keeps that at 2 MiB
        step = max(1, CHUNK // 16 // max(1, self.row_length))
        for first in range(0, rows, step):
            stop = min(rows, first + step)
            chosen = self._between(first, stop).view(stop - first, self.row_length)
            counts[first + 1:stop + 1] = torch.count_nonzero(chosen, dim=1)
        self.offsets = torch.cumsum(counts, 0).cpu()

    def select(self, first: int, stop: int) -> tuple[torch.Tensor, slice]:
        """(which elements of rows first to stop are candidates, their places in the candidate vector)."""
        return self._between(first, stop), slice(int(self.offsets[first]), int(self.offsets[stop]))

    def _between(self, first: int, stop: int) -> torch.Tensor:
        return candidates_between(self.candidates, first * self.row_length, stop * self.row_length)


def _device(candidates: CandidateMask) -> torch.device:
    return candidates.bits.device if isinstance(candidates, PackedMask) else candidates.device


def final_chunks(candidates: CandidateMask, before: torch.Tensor, after: torch.Tensor,
                 tau: float) -> Iterator[tuple[slice, torch.Tensor]]:
    """M_f chunk by chunk (positions, bool), from records at candidate positions.

    The rule is `decision.is_pruned`, applied to the candidates' values; everything else is False.
    """
    for where, chosen, places in candidate_chunks(candidates):
        every = torch.ones_like(before[places], dtype=torch.bool)  # these values are all candidates
        pruned = torch.zeros_like(chosen)
        pruned.masked_scatter_(chosen, is_pruned(every, before[places], after[places], tau))
        yield where, pruned


def final_mask_at_candidates(shape: torch.Size, candidates: CandidateMask, before: torch.Tensor,
                             after: torch.Tensor, tau: float) -> torch.Tensor:
    """M_f for one tensor (True = pruned), a dense bool mask."""
    mask = torch.zeros(shape, dtype=torch.bool, device=before.device)
    for where, pruned in final_chunks(candidates, before, after, tau):
        mask.view(-1)[where] = pruned
    return mask


def packed_final_mask_at_candidates(shape: torch.Size, candidates: CandidateMask, before: torch.Tensor,
                                    after: torch.Tensor, tau: float) -> PackedMask:
    """M_f for one tensor (True = pruned) as packed bits, never a whole bool mask."""
    chunks = final_chunks(candidates, before, after, tau)
    return PackedMask.from_chunks(shape, (pruned for _, pruned in chunks), before.device)
