"""Streaming GradProbe behind the in-memory pruner interface, for `gradprobe --variant streaming`.

    pruner = StreamingOnModel(model, "magnitude")
    result = pruner.prune(batches, sparsity=0.1)     # a PruneResult; the model is pruned in place

The model is written to a temporary weights folder, pruned there by `StreamingGradProbe`, and the
masks and pruned weights are read back into it. This gives streaming the same interface, inputs
and outputs as the other variants (so `auditor compare` can check its decisions), not its memory:
the model is in memory the whole time. Stages are computed in fp32 whatever the model's dtype
(the baseline computes in the model's own). The memory floor is the folder API
(`StreamingGradProbe(folder)`, `python -m gradprobe.streaming prune --weights FOLDER`).
"""
from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable

import torch

from ..pruner import PruneResult
from .pruner import StreamingGradProbe
from .writing import save_model


class StreamingOnModel:
    storage_dtype = torch.float32
    # Its own phases; the folder pruner's (`inner_pruners`) run between them, inside `prune`.
    phases = ("write_weights_folder", "apply_masks")
    inner_pruners = (StreamingGradProbe,)
    # Its structures: M_f read back, and the folder pruner's (kept on it as `streaming`).
    state_categories = {"masks": "masks", **{f"streaming.{name}": category for name, category
                                             in StreamingGradProbe.state_categories.items()}}
    # What the auditor's job audits and projects instead of this wrapper: the folder pruner on a
    # weights folder, as `python -m gradprobe.streaming prune --weights FOLDER` runs (this wrapper
    # keeps the whole model in memory besides, which is not streaming's memory).
    folder_pruner = StreamingGradProbe

    def __init__(self, model: torch.nn.Module, strategy: str = "magnitude", per_layer: bool = False):
        if per_layer:
            raise ValueError("the streaming variant uses one global threshold; per-layer is not supported")
        if any(p.device.type != "cpu" for p in model.parameters()):
            raise ValueError("the streaming variant runs on CPU: build the model with --device cpu")
        self.model, self.strategy = model, strategy
        self.streaming: StreamingGradProbe | None = None  # the folder pruner of the last run
        self.masks: dict[str, torch.Tensor] = {}

    def prune(self, loader: Iterable, loss_fn: Callable | None = None, sparsity: float = 0.1,
              num_batches: int = 2, reduction_factor: float = 0.1, gradient_threshold: float = 2.0,
              storage_dtype: torch.dtype = torch.float32) -> PruneResult:
        if storage_dtype != torch.float32:
            raise ValueError("the streaming variant keeps its gradient records in fp32; "
                             f"storage dtype {storage_dtype} is not supported")
        self.streaming, self.masks = None, {}
        with tempfile.TemporaryDirectory(prefix="gradprobe-streaming-") as folder:
            self.streaming = self.write_weights_folder(f"{folder}/weights")
            result = self.streaming.prune(loader, f"{folder}/pruned", loss_fn, sparsity, num_batches,
                                          reduction_factor, gradient_threshold)
            self.apply_masks(result.masks)
        return PruneResult(self.masks, result.sparsity, result.candidates, result.pruned, result.prunable,
                           result.seconds)

    def write_weights_folder(self, folder: str) -> StreamingGradProbe:
        """The model written as a weights folder, and the folder pruner on it."""
        save_model(self.model, folder)
        return StreamingGradProbe(folder, self.strategy)

    @torch.no_grad()
    def apply_masks(self, stored) -> None:
        """M_f read from the masks file into memory; the model's weights zeroed under it."""
        self.masks = dict(stored.items())
        for name, p in self.model.named_parameters():  # the pruned weights: originals, zeros under M_f
            p.masked_fill_(self.masks[name].to(p.device), 0)
