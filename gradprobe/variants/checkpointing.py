"""Activation checkpointing that really recomputes: each decoder layer keeps only its input in
forward and recomputes its activations in backward.

Hugging Face decoder layers checkpoint only while the layer is in train mode; in eval mode the
switch is silently a no-op (which is why upstream GradProbe's flag saves nothing). So the model
goes into train mode for the duration. Dropout, train mode's other effect, is kept off by the
pruner (`gradprobe.dropout`), so the recomputed forward is the same forward. Non-reentrant
checkpointing, as PyTorch recommends: it works whatever requires grad and keeps hooks working.

Afterwards every module's own train/eval mode, the checkpointing switch and `config.use_cache`
are as they were, after a failure too. A model that already checkpoints is left as it is.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

SETTINGS = {"use_reentrant": False}


@contextmanager
def activation_checkpointing(model: torch.nn.Module):
    from transformers import PreTrainedModel
    if not (isinstance(model, PreTrainedModel) and model.supports_gradient_checkpointing):
        raise ValueError(f"{type(model).__name__} cannot checkpoint activations: the checkpointed "
                         "variants need a Hugging Face model whose layers support it")
    modes = [(module, module.training) for module in model.modules()]
    already_on = is_checkpointing(model)
    use_cache = getattr(model.config, "use_cache", None)
    try:
        if not already_on:
            set_checkpointing(model, on=True)
        if use_cache:  # one forward per batch reads no cache; HF would drop it, with a warning
            model.config.use_cache = False
        model.train()
        yield
    finally:
        for module, training in modes:
            module.training = training
        if not already_on:
            set_checkpointing(model, on=False)
        if use_cache is not None:
            model.config.use_cache = use_cache


def is_checkpointing(model) -> bool:
    # Newer transformers (5.2x) renamed it "activation checkpointing" and the old names warn; 5.17 has only those.
    if hasattr(type(model), "is_activation_checkpointing"):
        return model.is_activation_checkpointing
    return model.is_gradient_checkpointing


def set_checkpointing(model, on: bool) -> None:
    if hasattr(model, "activation_checkpointing_enable"):
        if on:
            model.activation_checkpointing_enable(dict(SETTINGS))
        else:
            model.activation_checkpointing_disable()
    elif on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(SETTINGS))
    else:
        model.gradient_checkpointing_disable()
