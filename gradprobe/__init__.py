"""GradProbe (baseline): gradient-comparison pruning, written from /work/shared/gradprobe-spec.md.

    from gradprobe import GradProbe, mask_digest
    result = GradProbe(model, strategy="magnitude").prune(batches, sparsity=0.1)
    result.sparsity, result.pruned, mask_digest(result.masks)
"""
from .decision import final_mask, is_pruned
from .loss import causal_lm_loss
from .masks import count_true, mask_digest
from .pruner import GradProbe, PruneResult, check_settings
from .strategies import STRATEGIES, Magnitude, Strategy, Wanda, make_strategy

__all__ = ["GradProbe", "PruneResult", "check_settings", "mask_digest", "count_true",
           "causal_lm_loss", "is_pruned", "final_mask", "Strategy", "Magnitude", "Wanda",
           "STRATEGIES", "make_strategy"]
