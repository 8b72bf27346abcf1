"""What drives memory in a transformer workload: the quantities each component scales with.

A run record's `workload` field says which architecture and token shape were audited; the
same quantities computed for a target architecture give the scale factors of a projection.

    parameters   every parameter (per-tensor state: weights, gradients, copies, masks)
    layer        parameters of one decoder layer (state kept for one layer at a time)
    activations  tokens x layers x hidden (saved activations of the residual stream)
    constant     1 (interpreter, libraries: does not grow with the model)
"""
from __future__ import annotations

from dataclasses import dataclass

import architectures

# What each census category grows with. Activations are what a forward pass keeps.
CATEGORY_DRIVER = {
    "weights": "parameters",
    "gradients": "parameters",
    "saved copies": "parameters",
    "gradient records": "parameters",
    "masks": "parameters",
    "optimizer state": "parameters",
    "other": "parameters",
    "activations and temporaries": "activations",
}


@dataclass(frozen=True)
class Shape:
    """The sizes of one architecture at one token shape."""
    architecture: str
    parameters: int
    layers: int
    hidden: int
    vocab: int
    tokens: int

    def driver(self, name: str) -> float:
        return {
            "parameters": self.parameters,
            "layer": self.parameters / max(self.layers, 1),
            "activations": self.tokens * self.layers * self.hidden,
            "constant": 1,
        }[name]


def shape_of(architecture: str, tokens: int, overrides: dict | None = None) -> Shape:
    """Sizes of a named architecture (or checkpoint folder), counted on the meta device."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    config = architectures.make_config(architecture, **overrides)
    return Shape(
        architecture=architecture,
        parameters=architectures.count_parameters(architecture, **overrides),
        layers=_first(config, "num_hidden_layers", "num_layers", "n_layer"),
        hidden=_first(config, "hidden_size", "n_embd", "d_model"),
        vocab=config.vocab_size,
        tokens=tokens,
    )


def _first(config, *names: str) -> int:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    raise ValueError(f"config of type {type(config).__name__} has none of {', '.join(names)}")


def scale(driver: str, audited: Shape, target: Shape) -> float:
    return target.driver(driver) / audited.driver(driver)
