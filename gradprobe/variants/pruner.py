"""GradProbe with low-memory switches: the baseline's loop and decision rule, leaner structures.

    pruner = LowMemoryGradProbe(model, variant=Variant("sparse", "in-backward", checkpointing=True))
    result = pruner.prune(batches, sparsity=0.1)    # the masks GradProbe(model).prune(...) gives

It inherits `GradProbe.prune` (the loop, the restore on failure, the result) and overrides only
the phases a switch changes:

    candidates first   with a sparse state or in-backward gradients, M_t is chosen before any
                       gradient pass, so G0 and G1 are kept at candidate positions only. M_t does
                       not depend on gradients (magnitude reads |w|, WANDA runs a forward-only
                       pass), so it is the baseline's M_t, G0 there is the baseline's G0, and the
                       decisions are the baseline's.
    state="sparse"     S is the candidates' original values, M_t a bitmask; only candidates are
                       ever written to, so restoring them restores the model.
    (any)              candidates are reduced and restored a chunk at a time, never with a
                       whole-tensor masked_select / masked_scatter_ (their transients are 4x / 2x
                       the tensor).
    gradients="in-backward"  G is updated inside backward and `.grad` dropped at once.
    rows               ... and the head's and token embedding's gradients are folded in by rows,
                       never made whole (`row_gradients`).
    state="sparse"     M_f is kept as bits too; the result's masks unpack one tensor when asked.
    checkpointing      the gradient passes run under `activation_checkpointing`.
    storage_dtype      the baseline's option: dtype of G and of a full S.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext

import torch

from ..gradients import gradient_passes
from ..prunable import element_count
from ..pruner import GradProbe, PruneResult, holds_exactly
from .at_candidates import (
    CandidateMask,
    all_packed,
    candidate_values,
    count_candidates,
    dense,
    put_candidate_values_,
    scale_candidates_,
)
from .candidate_record import CandidateMaxima, final_mask_at_candidates, packed_final_mask_at_candidates
from .checkpointing import activation_checkpointing
from .gradient_hooks import gradients_consumed_in_backward
from .packed_mask import PackedMask, PackedMasks
from .row_gradients import gradients_by_rows
from .variant import Variant

BASELINE_STRUCTURES = Variant()  # every switch off (frozen, so one instance serves as the default)


class LowMemoryGradProbe(GradProbe):
    # The baseline's phases and structures (candidates first where a switch needs it); a sparse S
    # (candidates' values) is still saved copies, M_t and M_f as bits still masks.
    phases = ("select_candidates", "save_state", "record_original_gradients", "reduce_candidates",
              "record_reduced_gradients", "decide", "apply_masks")
    state_categories = GradProbe.state_categories
    # M_t and M_f are bits (`PackedMask`) with state="sparse", bool tensors otherwise. The baseline's
    # methods that read them as tensors run for state="full" only: each is overridden for "sparse".
    candidates: dict[str, CandidateMask]  # type: ignore[assignment]  # the baseline's, or bits
    masks: dict[str, CandidateMask]  # type: ignore[assignment]  # the baseline's, or bits

    def __init__(self, model: torch.nn.Module, strategy="magnitude", per_layer: bool = False, *,
                 variant: Variant = BASELINE_STRUCTURES):
        super().__init__(model, strategy, per_layer)
        self.variant = variant

    def prune(self, loader: Iterable, loss_fn: Callable | None = None, sparsity: float = 0.1,
              num_batches: int = 2, reduction_factor: float = 0.1, gradient_threshold: float = 2.0,
              storage_dtype: torch.dtype | None = None) -> PruneResult:
        """As `GradProbe.prune`; `storage_dtype` defaults to the variant's."""
        return super().prune(loader, loss_fn, sparsity, num_batches, reduction_factor,
                             gradient_threshold, storage_dtype or self.variant.storage_dtype)

    def measuring(self) -> AbstractContextManager:
        if self.variant.checkpointing:
            return activation_checkpointing(self.model)
        return super().measuring()

    def measure(self, batches: Iterable, loss_fn: Callable, sparsity: float,
                reduction_factor: float) -> None:
        if not self.variant.candidates_first:
            return super().measure(batches, loss_fn, sparsity, reduction_factor)
        self.select_candidates(batches, sparsity)
        self.save_state(self.storage_dtype)
        self.record_original_gradients(batches, loss_fn)
        self.reduce_candidates(reduction_factor)
        self.record_reduced_gradients(batches, loss_fn)

    def select_candidates(self, batches: Iterable, sparsity: float) -> None:
        super().select_candidates(batches, sparsity)
        if self.variant.state == "sparse":  # packed one by one, each bool mask freed once packed
            bools = self.candidates
            self.candidates = {name: PackedMask.pack(dense(bools.pop(name))) for name in list(bools)}

    def save_state(self, storage_dtype: torch.dtype = torch.float32) -> None:
        if self.variant.state == "full":
            return super().save_state(storage_dtype)
        self.storage_dtype = storage_dtype
        self.saved_state = {name: candidate_values(self.prunable[name], chosen)
                            for name, chosen in self.candidates.items()}

    def record_gradients(self, batches: Iterable, loss_fn: Callable) -> dict[str, torch.Tensor]:
        if not self.variant.candidates_first:
            return super().record_gradients(batches, loss_fn)
        record = CandidateMaxima(self.prunable, self.candidates, self.storage_dtype)
        if self.variant.gradients == "in-backward":
            rows: AbstractContextManager[set[str]] = (gradients_by_rows(self.model, self.parameters, record)
                                                      if self.variant.rows else nullcontext(set()))
            with rows as by_rows, gradients_consumed_in_backward(self.parameters, _checked(record.update, by_rows)):
                for _ in gradient_passes(self.model, batches, loss_fn):
                    pass  # the hooks have read this batch's gradients already
        else:
            for _ in gradient_passes(self.model, batches, loss_fn):
                for name, tensor in self.prunable.items():
                    record.update(name, tensor.grad)
        return record.maxima

    def reduce_candidates(self, reduction_factor: float) -> None:
        """As the baseline's, a chunk at a time, for either kind of M_t.

        Where a full S rounds the weights (half-precision storage), the candidates' exact values
        are kept first, as the baseline does, but chunk by chunk: `torch.masked_select` over a
        whole tensor makes a transient four times the tensor's size (605 MiB for TinyStories'
        147 MiB embedding), which set low-precision's peak. A sparse S is exact already.
        """
        for name, chosen in self.candidates.items():
            weight = self.prunable[name]
            if self.variant.state == "full" and not holds_exactly(self.storage_dtype, weight.dtype):
                self.candidate_originals[name] = candidate_values(weight, chosen)
            scale_candidates_(weight, chosen, reduction_factor)

    def final_mask(self, name: str, gradient_threshold: float) -> torch.Tensor:
        """M_f of a full-state variant (the sparse state keeps it as bits: `decide`)."""
        if not self.variant.candidates_first:
            return super().final_mask(name, gradient_threshold)
        return final_mask_at_candidates(self.prunable[name].shape, self.candidates[name],
                                        self.gradients_original[name], self.gradients_reduced[name],
                                        gradient_threshold)

    def decide(self, gradient_threshold: float) -> None:
        if self.variant.state == "full":
            return super().decide(gradient_threshold)
        self.masks = {name: self._packed_final_mask(name, gradient_threshold) if name in self.candidates
                      else PackedMask.zeros(p.shape, p.device) for name, p in self.parameters.items()}

    def _packed_final_mask(self, name: str, gradient_threshold: float) -> PackedMask:
        return packed_final_mask_at_candidates(self.prunable[name].shape, self.candidates[name],
                                               self.gradients_original[name], self.gradients_reduced[name],
                                               gradient_threshold)

    @torch.no_grad()
    def apply_masks(self) -> None:
        if self.variant.state == "full":
            return super().apply_masks()
        masks = self.masks
        if not all_packed(masks):
            raise RuntimeError("the sparse state keeps M_f as bits, but some were not packed")
        self.restore_weights()
        for name in self.candidates:  # a chunk at a time: M_f is never unpacked whole
            flat = self.prunable[name].view(-1)
            for where, pruned in masks[name].chunks():
                flat[where].masked_fill_(pruned, 0)

    @torch.no_grad()
    def restore_weights(self) -> None:
        """As the baseline's; exact copies of candidates go back a chunk at a time (no
        whole-tensor `masked_scatter_`, whose transient is twice the tensor)."""
        exact_copies = self.saved_state if self.variant.state == "sparse" else self.candidate_originals
        for name, p in self.parameters.items():
            if name in exact_copies:
                put_candidate_values_(p, self.candidates[name], exact_copies[name])
            elif name in self.saved_state and holds_exactly(self.storage_dtype, p.dtype):
                p.copy_(self.saved_state[name])

    def candidate_count(self) -> int:
        return sum(count_candidates(mask) for mask in self.candidates.values())

    def _result(self, seconds: float) -> PruneResult:
        if self.variant.state == "full":
            return super()._result(seconds)
        masks = self.masks
        if not all_packed(masks):
            raise RuntimeError("the sparse state keeps M_f as bits, but some were not packed")
        pruned = sum(masks[name].count for name in self.candidates)
        total = element_count(self.prunable)
        return PruneResult(PackedMasks(masks), pruned / total, self.candidate_count(), pruned, total,
                           seconds)


def _checked(update, by_rows: set[str]):
    """`update`, refusing a whole gradient for a tensor whose rows are folded in already."""
    def checked(name: str, grad: torch.Tensor | None) -> None:
        if grad is not None and name in by_rows:
            raise RuntimeError(f"{name} got a gradient besides its head and embedding uses; "
                               "row gradients cannot record it: use a variant without rows")
        update(name, grad)
    return checked
