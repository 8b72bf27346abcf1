"""Dropout off while GradProbe measures, without touching the model's own train/eval mode.

Putting the whole model in eval mode would also change what train-mode-only code does (Hugging
Face activation checkpointing, for one), so only the dropout rates are set to 0 and put back.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

# Attention code in transformers reads a float rate (`self.attention_dropout`) rather than a module.
_RATE_ATTRIBUTES = ("attention_dropout",)


@contextmanager
def dropout_disabled(model: torch.nn.Module):
    saved: list[tuple[torch.nn.Module, str, float]] = []
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            saved.append((module, "p", module.p))
        for attribute in _RATE_ATTRIBUTES:
            rate = getattr(module, attribute, None)
            if isinstance(rate, float):
                saved.append((module, attribute, rate))
    try:
        for module, attribute, _ in saved:
            setattr(module, attribute, 0.0)
        yield
    finally:
        for module, attribute, rate in saved:
            setattr(module, attribute, rate)
