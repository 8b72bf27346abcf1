"""The gradient record G kept at candidate positions only, and the decision read from it.

The decision compares G1 with G0 only where M_t is True, so a variant that knows M_t before its
first gradient pass keeps one value per candidate instead of one per weight: at s = 0.1, a tenth
of the baseline's dense G0 and G1. The values are the baseline's at those positions, bit for bit:
the same |grad|, rounded to the same storage dtype, folded by the same maximum.
"""
from __future__ import annotations

import torch

from ..decision import is_pruned
from .at_candidates import CandidateMask, candidate_chunks, count_candidates


class CandidateMaxima:
    """Per tensor, the running max of |grad| over batches, one value per candidate."""

    def __init__(self, tensors: dict[str, torch.Tensor], candidates: dict[str, CandidateMask],
                 dtype: torch.dtype):
        self.candidates = candidates
        # Starting from 0 gives the baseline's values: max(0, |g|) = |g| (NaN stays NaN), and a
        # tensor that gets no gradient in a batch stays at 0, as in the baseline.
        self.maxima = {name: torch.zeros(count_candidates(mask), dtype=dtype, device=tensors[name].device)
                       for name, mask in candidates.items()}

    def update(self, name: str, grad: torch.Tensor | None) -> None:
        """Fold one batch's gradient of tensor `name` in; tensors without candidates are skipped."""
        if grad is None or name not in self.maxima:  # biases and norms: computed, never recorded
            return
        kept, flat = self.maxima[name], grad.reshape(-1)
        for where, chosen, places in candidate_chunks(self.candidates[name]):
            torch.maximum(kept[places], flat[where][chosen].abs().to(kept.dtype), out=kept[places])


def final_mask_at_candidates(shape: torch.Size, candidates: CandidateMask, before: torch.Tensor,
                             after: torch.Tensor, tau: float) -> torch.Tensor:
    """M_f for one tensor (dense bool, True = pruned) from records at candidate positions.

    The rule is `decision.is_pruned`, applied to the candidates' values; everything else is False.
    """
    mask = torch.zeros(shape, dtype=torch.bool, device=before.device)
    flat = mask.view(-1)
    for where, chosen, places in candidate_chunks(candidates):
        every = torch.ones_like(before[places], dtype=torch.bool)  # these values are all candidates
        flat[where].masked_scatter_(chosen, is_pruned(every, before[places], after[places], tau))
    return mask
