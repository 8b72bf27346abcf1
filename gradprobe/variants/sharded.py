"""GradProbe on a model sharded by FSDP2: each rank decides for the weights of its own shard.

    torchrun --nproc-per-node 2 -m gradprobe --arch tinystories-33m --variant sharded
    pruner = ShardedGradProbe(model)      # under torchrun: joins the group, fully_shards the model
    result = pruner.prune(batches, sparsity=0.1)    # the masks GradProbe(model).prune(...) gives

The structures are sparse-state's and grad-in-backward's (`LowMemoryGradProbe`), kept per rank
for its shard only (`shards`): candidates as bits, their original values, G0 and G1 at them. A
gradient reaches G when FSDP has reduce-scattered it (its post-accumulate-grad hook), read from
the rank's shard and dropped at once; no rank ever holds a whole weight or gradient but for the
layer FSDP has all-gathered (and that layer's gradients before they are reduce-scattered).

Decisions are the baseline's, bit for bit: the magnitude threshold is the k-th smallest score
over all shards (histograms summed over the ranks, exact), and every rank computes the full
gradient of the same batch and keeps its own rows of it (`shards.REDUCTIONS`), so each shard of
G0 and G1 is the baseline's. The result's counts are over every rank; its masks are gathered a
tensor at a time when read (`GatheredMasks`: a collective, so every rank reads them in order).
Alone (no process group of more than one rank) it runs unsharded, with the same decisions.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import chain

import torch

from ..gradients import gradient_passes
from ..prunable import element_count
from ..pruner import PruneResult
from ..strategies import Magnitude, TensorScores
from ..threshold import candidate_threshold
from .at_candidates import all_packed
from .candidate_record import CandidateMaxima
from .gradient_hooks import gradients_consumed_in_backward
from .packed_mask import PackedMask
from .pruner import LowMemoryGradProbe
from .shards import gathered, join_torchrun_group, local_shard, shard_model, sum_over_ranks, world_size
from .variant import Variant

SHARD_STATE = Variant(state="sparse", gradients="in-backward")


class ShardedGradProbe(LowMemoryGradProbe):
    """GradProbe on this rank's shard of an FSDP2 model (see the module docstring)."""

    phases = ("select_candidates", "save_state", "record_original_gradients", "reduce_candidates",
              "record_reduced_gradients", "decide", "apply_masks")
    # `parameters` holds this rank's shard of every weight (plain tensors; the model's own are
    # DTensors wrapping them): weights, as the census should name them.
    state_categories = {**LowMemoryGradProbe.state_categories, "parameters": "weights"}
    not_projected = ("a sharded run is projected per rank at a target world size, not as one process: "
                     "auditor project-ranks (reports/rank-projection-cpu.md)")

    def __init__(self, model: torch.nn.Module, strategy="magnitude", per_layer: bool = False, *,
                 reduction: str = "own rows"):
        if not isinstance(strategy, Magnitude) and strategy != "magnitude":
            raise ValueError("the sharded variant selects candidates by magnitude only: WANDA's "
                             "input norms are not gathered over the shards")
        join_torchrun_group(next(model.parameters()).device)
        super().__init__(shard_model(model, reduction), strategy, per_layer, variant=SHARD_STATE)
        self.sharded = self.parameters  # FSDP's DTensor parameters: hooks, shapes, gathers
        # Every phase the variant shares works on this rank's rows, as plain tensors.
        self.parameters = {name: local_shard(p) for name, p in self.sharded.items()}
        self.prunable = {name: self.parameters[name] for name in self.prunable}
        self.ranks = world_size()

    def select_candidates(self, batches: Iterable, sparsity: float) -> None:
        """M_t on this rank's rows; the threshold is over every shard (histograms summed)."""
        scores = {name: TensorScores(w) for name, w in self.prunable.items()}
        total = {name: self.sharded[name].numel() for name in scores}  # the whole tensors'
        if self.strategy.per_layer:
            chosen = {name: s.below(candidate_threshold(s.blocks, total[name], sparsity, sum_over_ranks))
                      for name, s in scores.items()}
        else:
            every_block = lambda: chain.from_iterable(s.blocks() for s in scores.values())  # noqa: E731
            threshold = candidate_threshold(every_block, sum(total.values()), sparsity, sum_over_ranks)
            chosen = {name: s.below(threshold) for name, s in scores.items()}
        self.candidates = {name: PackedMask.pack(chosen.pop(name)) for name in list(chosen)}

    def record_gradients(self, batches: Iterable, loss_fn: Callable) -> dict[str, torch.Tensor]:
        """G at this rank's candidates, each gradient read from its shard once FSDP reduced it."""
        record = CandidateMaxima(self.prunable, self.candidates, self.storage_dtype)
        with gradients_consumed_in_backward(self.sharded, lambda name, grad: record.update(name, local_shard(grad))):
            for _ in gradient_passes(self.model, batches, loss_fn):
                pass  # the hooks have read this batch's gradients already
        return record.maxima

    def candidate_count(self) -> int:
        return _over_ranks(super().candidate_count())

    def _result(self, seconds: float) -> PruneResult:
        masks = self.masks
        if not all_packed(masks):
            raise RuntimeError("the sharded variant keeps M_f as bits, but some were not packed")
        pruned = _over_ranks(sum(masks[name].count for name in self.candidates))
        total = element_count({name: self.sharded[name] for name in self.prunable})
        return PruneResult(GatheredMasks(masks, self.sharded), pruned / total, self.candidate_count(),
                           pruned, total, seconds)


def _over_ranks(count: int) -> int:
    return int(sum_over_ranks(torch.tensor([count], dtype=torch.int64)))


class GatheredMasks(Mapping[str, torch.Tensor]):
    """Final masks by name, each gathered from every rank's bits when read (bool, the whole tensor).

    Reading one is a collective: every rank reads the same names in the same order (`mask_digest`
    and `--masks-out` do). Only one whole mask exists at a time.
    """

    def __init__(self, packed: Mapping[str, PackedMask], sharded: Mapping[str, torch.Tensor]):
        self.packed, self.sharded = packed, sharded

    def __getitem__(self, name: str) -> torch.Tensor:
        return gathered(self.packed[name].unpack(), self.sharded[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self.packed)

    def __len__(self) -> int:
        return len(self.packed)
