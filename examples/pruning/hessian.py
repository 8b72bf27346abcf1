"""An OBS-style pruner: a Hessian X X^T per linear, accumulated batch by batch through forward
hooks, weights scored by w^2 / diag(H^-1)... simplified to w^2 * diag(H), then freed.

State, for a linear with `cols` inputs: `HessianStat.H`, cols x cols fp32 (cols * cols * 4
bytes), alive from the stat's creation until `free()`; the layer inputs and outputs buffers,
samples x length x hidden fp32 each, alive for the whole loop.
"""
from __future__ import annotations

import math

import torch

from pruning.layer_inputs import capture_layer_inputs, linears, run_layer


class HessianStat:
    def __init__(self, layer: torch.nn.Linear):
        self.layer = layer
        cols = layer.weight.shape[1]
        self.H = torch.zeros(cols, cols)
        self.samples = 0

    def add_batch(self, inp: torch.Tensor) -> None:
        x = inp.reshape(-1, inp.shape[-1]).float()
        n = x.shape[0]
        self.H *= self.samples / (self.samples + n)
        self.samples += n
        x = math.sqrt(2 / self.samples) * x.t()
        self.H += x @ x.t()

    def prune(self, sparsity: float) -> torch.Tensor:
        W = self.layer.weight.data  # an alias: the pruned zeros land in the model
        score = W.float() ** 2 * torch.diag(self.H).reshape(1, -1)
        k = int(W.numel() * sparsity)
        threshold = torch.kthvalue(score.flatten(), k).values if k else -1.0
        mask = score <= threshold
        W[mask] = 0
        return mask

    def free(self) -> None:
        self.H = None


def prune_with_hessians(model, samples: list[torch.Tensor], sparsity: float = 0.5) -> dict:
    """Prunes `model` in place, layer by layer; returns the masks by linear name."""
    inputs, kwargs = capture_layer_inputs(model, samples)
    outputs = torch.zeros_like(inputs)
    masks = {}
    for i, layer in enumerate(model.model.layers):
        stats = {name: HessianStat(m) for name, m in linears(layer).items()}
        handles = [m.register_forward_hook(
            lambda module, args, out, name=name, stats=stats: stats[name].add_batch(args[0].data))
            for name, m in linears(layer).items()]
        run_layer(layer, inputs, outputs, kwargs)
        for handle in handles:
            handle.remove()
        for name, stat in stats.items():
            masks[f"layers.{i}.{name}"] = stat.prune(sparsity)
            stat.free()
        run_layer(layer, inputs, outputs, kwargs)  # the next layer sees the pruned outputs
        inputs, outputs = outputs, inputs
    return masks
