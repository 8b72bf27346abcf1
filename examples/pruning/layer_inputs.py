"""The inputs of the first decoder layer for every calibration sample, kept in one buffer.

Per-layer pruners run the model one layer at a time: they need what enters the first layer
(and the keyword arguments the model passes it: position embeddings, masks) for all samples.
"""
from __future__ import annotations

import torch


class _Stop(Exception):
    """Raised by the first layer's hook once it has seen its input."""


def capture_layer_inputs(model, samples: list[torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """(inputs, layer_kwargs): inputs is (len(samples), length, hidden) in fp32."""
    layers = model.model.layers
    length, hidden = samples[0].shape[1], model.config.hidden_size
    inputs = torch.zeros(len(samples), length, hidden)
    seen = {"index": 0, "kwargs": None}

    def catch(module, args, kwargs):
        inputs[seen["index"]] = args[0][0] if args else kwargs["hidden_states"][0]
        seen["index"] += 1
        seen["kwargs"] = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        raise _Stop

    handle = layers[0].register_forward_pre_hook(catch, with_kwargs=True)
    try:
        with torch.no_grad():
            for sample in samples:
                try:  # noqa: SIM105 (reports/example-hessian-pruner.md cites this file by line)
                    model(sample, use_cache=False)  # a cache would grow with every layer call
                except _Stop:
                    pass
    finally:
        handle.remove()
    return inputs, seen["kwargs"]


def linears(module: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    return {name: m for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)}


def run_layer(layer, inputs: torch.Tensor, outputs: torch.Tensor, kwargs: dict) -> None:
    with torch.no_grad():
        for j in range(inputs.shape[0]):
            out = layer(inputs[j:j + 1], **kwargs)
            outputs[j] = (out[0] if isinstance(out, tuple) else out)[0]
