"""A variant is a set of switches over the baseline; every combination runs one loop and one rule.

    Variant()                                        the baseline's structures
    Variant(state="sparse")                          sparse-state
    Variant(gradients="in-backward")                 grad-in-backward
    Variant(checkpointing=True)                      checkpointed
    Variant(storage_dtype=torch.bfloat16)            low-precision
    Variant("sparse", "in-backward", True, rows=True) lean; add storage_dtype for lean + low precision
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

STATES = ("full", "sparse")
GRADIENTS = ("dense", "in-backward")


@dataclass(frozen=True)
class Variant:
    # "full": S copies every parameter, M_t is a bool per weight (the baseline's).
    # "sparse": S keeps only the candidates' original values, M_t is a bitmask (`packed_mask`).
    state: str = "full"
    # "dense": each backward fills every `.grad`, read afterwards (the baseline's).
    # "in-backward": each gradient is folded into G once complete, then dropped (`gradient_hooks`).
    gradients: str = "dense"
    # Decoder layers recompute their activations in backward instead of keeping them (`checkpointing`).
    checkpointing: bool = False
    # dtype of the gradient maxima, and of S when it is full (the baseline's option). A sparse S
    # stays in the weights' own dtype: it is small, and kept candidates are restored from it.
    storage_dtype: torch.dtype = torch.float32
    # With in-backward gradients: the output head's and token embedding's weight gradients are
    # folded in by rows (`row_gradients`), so no [vocab, hidden] gradient is ever made.
    rows: bool = False

    def __post_init__(self):
        if self.state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}, got {self.state!r}")
        if self.gradients not in GRADIENTS:
            raise ValueError(f"gradients must be one of {', '.join(GRADIENTS)}, got {self.gradients!r}")
        if not (isinstance(self.storage_dtype, torch.dtype) and self.storage_dtype.is_floating_point):
            raise ValueError(f"storage dtype must be a floating-point torch dtype, got {self.storage_dtype!r}")
        if self.rows and self.gradients != "in-backward":
            raise ValueError("rows=True folds gradients in during backward: it needs gradients='in-backward'")

    @property
    def candidates_first(self) -> bool:
        """Whether M_t is chosen before the first gradient pass, so G is kept at candidates only.

        Both sparse state and in-backward gradients need it: neither ever holds G for every weight.
        """
        return self.state == "sparse" or self.gradients == "in-backward"
