"""Which tensors GradProbe may prune: every trainable parameter with 2 or more dimensions.

That is every Linear weight and the embeddings. A head tied to the token embedding is the same
tensor, so it appears once, under the embedding's name, and is pruned through it.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch


def model_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter by name, each tensor once: `named_parameters` drops tied duplicates by identity."""
    return dict(model.named_parameters(remove_duplicate=True))


def prunable_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p for name, p in model_parameters(model).items()
            if p.requires_grad and p.dim() >= 2}


def element_count(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() for t in tensors.values())
