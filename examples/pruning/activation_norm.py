"""A Wanda-style pruner: each weight scored by |w| times the L2 norm of its input feature over
the calibration samples; per output row, the lowest-scored half is pruned.

State, for a linear with `cols` inputs: `InputNorms.sq_norms`, cols fp32 (cols * 4 bytes); the
layer inputs and outputs buffers, samples x length x hidden fp32 each, for the whole loop.
"""
from __future__ import annotations

import torch

from pruning.layer_inputs import capture_layer_inputs, linears, run_layer


class InputNorms:
    def __init__(self, layer: torch.nn.Linear):
        self.layer = layer
        self.sq_norms = torch.zeros(layer.weight.shape[1])
        self.rows = 0

    def add_batch(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        x = inp.reshape(-1, inp.shape[-1]).float()
        n = x.shape[0]
        self.sq_norms *= self.rows / (self.rows + n)
        self.rows += n
        self.sq_norms += x.pow(2).sum(dim=0) / self.rows


def prune_by_activation_norm(model, samples: list[torch.Tensor], sparsity: float = 0.5) -> dict:
    inputs, kwargs = capture_layer_inputs(model, samples)
    outputs = torch.zeros_like(inputs)
    masks = {}
    for i, layer in enumerate(model.model.layers):
        norms = {name: InputNorms(m) for name, m in linears(layer).items()}
        handles = [m.register_forward_hook(
            lambda module, args, out, name=name, norms=norms: norms[name].add_batch(args[0].data, out.data))
            for name, m in linears(layer).items()]
        run_layer(layer, inputs, outputs, kwargs)
        for handle in handles:
            handle.remove()
        for name, m in linears(layer).items():
            score = m.weight.data.abs() * norms[name].sq_norms.sqrt().reshape(1, -1)
            order = torch.sort(score, dim=-1, stable=True).indices
            mask = torch.zeros_like(score, dtype=torch.bool)
            mask.scatter_(1, order[:, :int(score.shape[1] * sparsity)], True)
            m.weight.data[mask] = 0
            masks[f"layers.{i}.{name}"] = mask
        del norms
        run_layer(layer, inputs, outputs, kwargs)
        inputs, outputs = outputs, inputs
    return masks
