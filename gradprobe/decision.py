"""The GradProbe decision rule, as pure functions that every variant decides through.

After candidates are tentatively scaled down, a candidate is pruned when its gradient did not
grow beyond the allowance, and kept when it did:

    M_f = M_t & (G1 <= G0 * (1 + tau))

Zero before and zero after counts as pruned (0 <= 0). The comparison runs in the records'
storage dtype, so a half-precision record can flip decisions that sit on the boundary.
"""
from __future__ import annotations

import torch

from .blocks import row_blocks


def is_pruned(candidate: torch.Tensor, before: torch.Tensor, after: torch.Tensor,
              tau: float) -> torch.Tensor:
    """The rule elementwise, on any matching shapes: whole tensors, blocks, or gathered values."""
    return candidate & (after <= before * (1.0 + tau))


def final_mask(candidates: torch.Tensor, before: torch.Tensor, after: torch.Tensor,
               tau: float) -> torch.Tensor:
    """M_f for one tensor, block by block so the transient stays a few MiB."""
    mask = torch.empty_like(candidates)
    for rows in row_blocks(candidates):
        mask[rows] = is_pruned(candidates[rows], before[rows], after[rows], tau)
    return mask
