"""GradProbe's settings as a user gives them: the names it accepts (variants, strategies, storage
dtypes) and the limits of its numbers. Nothing here imports torch, so a command line that runs
GradProbe refuses a mistake before torch loads; `pruner.check_settings` holds the API to the same
limits, and tests/test_bad_input.py keeps the names in step with the registries that use them.
"""
from __future__ import annotations

import math

VARIANTS = ("baseline", "sparse-state", "grad-in-backward", "checkpointed", "low-precision", "lean",
            "streaming", "sharded")  # gradprobe.variants.VARIANTS
STRATEGIES = ("magnitude", "wanda")  # gradprobe.strategies.STRATEGIES
STORAGE_DTYPES = ("bf16", "fp16", "fp32")  # --storage-dtype
FOLDER_VARIANTS = ("streaming",)  # pruned from a weights folder: `--weights-dtype` is its files' dtype
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def check_variant_name(name: str) -> None:
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")


def check_numbers(sparsity: float, reduction_factor: float, num_batches: int,
                  gradient_threshold: float) -> None:
    """ValueError (one line) for a number GradProbe cannot run with."""
    if not 0 < sparsity < 1:
        raise ValueError(f"sparsity must be between 0 and 1 (exclusive), got {sparsity}")
    if not 0 < reduction_factor <= 1:
        raise ValueError(f"reduction factor must be in (0, 1], got {reduction_factor}")
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1:
        raise ValueError(f"num_batches must be an integer >= 1, got {num_batches!r}")
    if not (gradient_threshold >= 0 and math.isfinite(gradient_threshold)):
        raise ValueError(f"gradient threshold must be >= 0 and finite, got {gradient_threshold}")
