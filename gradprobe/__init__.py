"""GradProbe (baseline): gradient-comparison pruning, written from the GradProbe specification
(shared/gradprobe-spec.md beside this repository).

    from gradprobe import GradProbe, mask_digest
    result = GradProbe(model, strategy="magnitude").prune(batches, sparsity=0.1)
    result.sparsity, result.pruned, mask_digest(result.masks)
"""
import importlib

# Loaded on first use, so the `gradprobe` command answers --help and a mistake without torch.
_HOMES = {
    ".decision": ("final_mask", "is_pruned"),
    ".loss": ("causal_lm_loss",),
    ".masks": ("count_true", "mask_digest"),
    ".pruner": ("GradProbe", "PruneResult", "check_settings"),
    ".strategies": ("STRATEGIES", "Magnitude", "Strategy", "Wanda", "make_strategy"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = ["GradProbe", "PruneResult", "check_settings", "mask_digest", "count_true",
           "causal_lm_loss", "is_pruned", "final_mask", "Strategy", "Magnitude", "Wanda",
           "STRATEGIES", "make_strategy"]


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name], __name__), name)
    globals()[name] = value
    return value
