"""Reference low-memory GradProbe variants, selectable by name.

    from gradprobe.variants import make_pruner
    result = make_pruner("lean", model, "magnitude").prune(batches, sparsity=0.1)

Presets (each a `Variant` of switches over the baseline, run by `LowMemoryGradProbe`):

    baseline          the baseline `GradProbe` itself
    sparse-state      S = candidates' original values only; M_t, M_f bitmasks; G0, G1 at candidates
    grad-in-backward  each gradient consumed by a post-accumulate hook, `.grad` dropped at once
    checkpointed      decoder layers recompute their activations in backward
    low-precision     S and G in bf16; unpruned weights stay bit-identical
    lean              sparse-state + grad-in-backward + checkpointed, and the head's and token
                      embedding's gradients folded in by rows, never made whole
    streaming         `gradprobe.streaming` on a temporary weights folder (its memory floor needs
                      the folder API: `python -m gradprobe.streaming prune --weights FOLDER`)
    sharded           the model sharded by FSDP2 over torchrun's ranks, each rank deciding for its
                      own shard (`sharded`); alone, unsharded

All but low-precision make exactly the baseline's decisions (same masks, same pruned weights).

A registry entry is any callable `(model, strategy, per_layer=False) -> pruner` whose pruner's
`prune(loader, loss_fn, sparsity, num_batches, reduction_factor, gradient_threshold,
storage_dtype)` returns a `PruneResult`; a pruner class with `GradProbe`'s signature is one.
Its class says what it does, for anyone watching from outside (`auditor gradprobe` stages and
censuses it by these alone): `phases`, its methods in the spec's words; `state_categories`, what
each attribute it keeps is; optionally `inner_pruners` (pruners it runs inside `prune`, whose
phases are its own too), `phase_label` (names what a phase's call worked on) and `not_projected`
(why it cannot be projected on fake tensors).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Protocol

import torch

from ..pruner import GradProbe, PruneResult
from ..streaming.on_model import StreamingOnModel
from .packed_mask import PackedMask, PackedMasks
from .pruner import LowMemoryGradProbe
from .sharded import ShardedGradProbe
from .variant import Variant


class Pruner(Protocol):
    """What a registry entry makes: a pruner whose `prune` returns a `PruneResult`."""

    def prune(self, loader: Iterable, loss_fn: Callable | None = None, sparsity: float = 0.1,
              num_batches: int = 2, reduction_factor: float = 0.1, gradient_threshold: float = 2.0,
              storage_dtype: torch.dtype = torch.float32) -> PruneResult: ...


PRESETS: dict[str, Variant] = {
    "sparse-state": Variant(state="sparse"),
    "grad-in-backward": Variant(gradients="in-backward"),
    "checkpointed": Variant(checkpointing=True),
    "low-precision": Variant(storage_dtype=torch.bfloat16),
    "lean": Variant(state="sparse", gradients="in-backward", checkpointing=True, rows=True),
}

VARIANTS: dict[str, Callable[..., Pruner]] = {
    "baseline": GradProbe,
    **{name: partial(LowMemoryGradProbe, variant=variant) for name, variant in PRESETS.items()},
    "streaming": StreamingOnModel,
    "sharded": ShardedGradProbe,
}


def check_variant(name: str) -> None:
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")


def make_pruner(name: str, model: torch.nn.Module, strategy="magnitude", per_layer: bool = False) -> Pruner:
    check_variant(name)
    return VARIANTS[name](model, strategy, per_layer=per_layer)


__all__ = ["VARIANTS", "PRESETS", "Variant", "LowMemoryGradProbe", "ShardedGradProbe", "PackedMask", "PackedMasks",
           "check_variant", "make_pruner"]
