"""Row blocks of a big tensor: elementwise work done block by block keeps its transient small.

A whole-tensor expression such as `torch.maximum(record, grad.abs())` allocates a temporary as
large as the tensor (147 MiB for TinyStories' embedding, 500 MiB for Mistral-7B's). Done over
row blocks of at most `BLOCK_ELEMENTS` elements, the same work needs a few MiB.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch

BLOCK_ELEMENTS = 1 << 22  # 4 Mi elements: 16 MiB of fp32 per temporary


def row_blocks(tensor: torch.Tensor, elements: int = BLOCK_ELEMENTS) -> Iterator[slice]:
    """Slices over dim 0 covering `tensor`, each at most `elements` elements (at least one row)."""
    if tensor.dim() == 0:
        yield slice(None)
        return
    rows = tensor.shape[0]
    per_row = max(1, tensor[0].numel()) if rows else 1
    step = max(1, elements // per_row)
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))
