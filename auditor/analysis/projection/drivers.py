"""What drives memory in a transformer workload: the quantities each component scales with.

A run record's `workload` field says which architecture and token shape were audited; the
same quantities computed for a target architecture give the scale factors of a projection.
All are read from the config and a model built on the meta device (nothing is allocated):

    constant           1 (interpreter, libraries, fixed-size blocks: does not grow)
    tied               elements of parameters shared by two modules (a tied embedding and
                       head: its gradient arrives twice and is summed into a new tensor)
    largest            elements of the largest parameter tensor (embedding or head)
    parameters         every parameter (per-tensor state: weights, gradients, copies)
    matrix parameters  parameters in tensors of 2 or more dimensions (per-matrix records, masks)
    layer              parameters of one decoder layer (state kept for one layer at a time)
    activations        tokens x layers x hidden (saved activations of the residual stream)
    logits             tokens x vocab (the output head's activations and their gradient)
    attention          batch x heads x sequence^2 x layers (eager attention scores)
    buffers            bytes of the model's buffers (GPT-Neo: a max_positions^2 causal mask
                       per layer), which grow with neither parameters nor tokens

`FIT_DRIVERS` lists, in order of preference, the drivers a fitted projection may split a
transient onto (`projection`): where two drivers move alike in every run, the earlier wins.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

import architectures

# What each census category grows with. Activations are what a forward pass keeps.
CATEGORY_DRIVER = {
    "weights": "parameters",
    "gradients": "parameters",
    "saved copies": "parameters",
    "gradient records": "matrix parameters",
    "masks": "matrix parameters",
    "buffers": "buffers",
    "optimizer state": "parameters",
    "other": "parameters",
    "activations and temporaries": "activations",
}
BUFFERS_SUFFIX = ".buffers"   # the census names a module's buffers ROOT.buffers

FIT_DRIVERS = ("constant", "tied", "largest", "parameters", "layer", "activations", "logits",
               "attention", "buffers")


@dataclass(frozen=True)
class Shape:
    """The sizes of one architecture at one token shape."""
    architecture: str
    parameters: int
    layers: int
    hidden: int
    vocab: int
    tokens: int
    overrides: tuple = ()           # (name, value) pairs the architecture was built with
    sequence: int = 0               # tokens per sequence (0: tokens, one sequence)
    batch: int = 1
    heads: int = 1
    matrix_parameters: int = 0
    tied: int = 0
    largest: int = 0
    layer: int = 0
    buffer_bytes: int = 0

    def driver(self, name: str) -> float:
        sequence = self.sequence or self.tokens
        return {
            "parameters": self.parameters,
            "matrix parameters": self.matrix_parameters or self.parameters,
            "tied": self.tied,
            "largest": self.largest,
            "layer": self.layer or self.parameters / max(self.layers, 1),
            "activations": self.tokens * self.layers * self.hidden,
            "logits": self.tokens * self.vocab,
            "attention": self.batch * self.heads * sequence * sequence * self.layers,
            "buffers": self.buffer_bytes,
            "constant": 1,
        }[name]

    def as_dict(self) -> dict:
        out = asdict(self)
        out["overrides"] = dict(self.overrides)
        return out


def shape_of(architecture: str, tokens: int, overrides: dict | None = None,
             sequence: int | None = None, batch: int | None = None) -> Shape:
    """Sizes of a named architecture (or checkpoint folder), counted on the meta device."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    key = tuple(sorted(overrides.items()))
    sizes = _meta_sizes(architecture, key)
    batch = batch or 1
    return Shape(architecture=architecture, tokens=tokens, overrides=key,
                 sequence=sequence or tokens // batch, batch=batch, **sizes)


def workload_shape(workload: dict, tokens: int | None = None) -> Shape:
    """The shape of a run record's `workload` field; `tokens` overrides its token count."""
    settings = workload.get("settings") or {}
    batch = settings.get("batch_size") or 1
    sequence = settings.get("sequence_length")
    if tokens is not None and tokens != workload["tokens"]:
        sequence = max(tokens // batch, 1)
    return shape_of(workload["architecture"], tokens or workload["tokens"],
                    workload.get("overrides"), sequence=sequence, batch=batch)


@lru_cache(maxsize=64)
def _meta_sizes(architecture: str, overrides: tuple) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    config = architectures.make_config(architecture, **dict(overrides))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    names: dict[int, list] = {}
    unique = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
        unique[id(p)] = p
    layers = _first(config, "num_hidden_layers", "num_layers", "n_layer")
    stacks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == layers]
    layer = (sum(p.numel() for p in stacks[0].parameters()) // max(layers, 1)) if stacks else 0
    return dict(
        parameters=sum(p.numel() for p in unique.values()),
        layers=layers,
        hidden=_first(config, "hidden_size", "n_embd", "d_model"),
        vocab=config.vocab_size,
        heads=_first(config, "num_attention_heads", "num_heads", "n_head"),
        matrix_parameters=sum(p.numel() for p in unique.values() if p.dim() >= 2),
        tied=sum(unique[i].numel() for i, n in names.items() if len(n) > 1),
        largest=max((p.numel() for p in unique.values()), default=0),
        layer=layer,
        buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
    )


def _first(config, *names: str) -> int:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    raise ValueError(f"config of type {type(config).__name__} has none of {', '.join(names)}")


def component_driver(name: str, category: str) -> str:
    """The driver a census component scales with, before any fit: buffers by their own bytes,
    the rest by their category (`CATEGORY_DRIVER`)."""
    if name.endswith(BUFFERS_SUFFIX):
        return "buffers"
    return CATEGORY_DRIVER.get(category, "parameters")


def scale(driver: str, audited: Shape, target: Shape) -> float:
    """target / audited for one driver (1 where the audited run has none of it: nothing to grow)."""
    base = audited.driver(driver)
    return target.driver(driver) / base if base else 1.0
