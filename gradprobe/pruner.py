"""GradProbe, the baseline: prune the candidates whose gradient does not grow when they shrink.

    result = GradProbe(model, strategy="magnitude").prune(batches, sparsity=0.1)

Each phase is its own method, so a caller (or an auditor, from outside) can watch it:
save_state -> record_original_gradients -> select_candidates -> reduce_candidates ->
record_reduced_gradients -> decide -> apply_masks. The first five run in `measure`, inside
`measuring()`; a variant (`gradprobe.variants`) reorders or extends those two and shares the
rest: the loop, the restore on failure and the decision rule. As the baseline, it keeps every structure
the spec names, whole, and leaves them on the pruner when `prune` returns:

    saved_state          S   a copy of every parameter, in the storage dtype
    gradients_original   G0  running max |grad| per prunable tensor, dense, storage dtype
    candidates           M_t bool per prunable tensor, True = candidate
    gradients_reduced    G1  as G0, measured on the reduced model
    masks                M_f bool per parameter, True = pruned (all False if not prunable)

and the model's `.grad` as the last backward left it. Elementwise work runs block by block
(`blocks`), so no phase adds an accidental full-size transient on top of these structures.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from .batches import CalibrationBatches
from .blocks import row_blocks
from .decision import final_mask
from .dropout import dropout_disabled
from .gradients import record_gradients
from .loss import causal_lm_loss
from .masks import count_true
from .prunable import element_count, model_parameters, prunable_tensors
from .settings import check_numbers
from .strategies import Strategy, make_strategy


@dataclass(frozen=True)
class PruneResult:
    masks: Mapping[str, torch.Tensor]  # every parameter by name; True = pruned (bits unpacked on access
                                       # for the sparse-state variants: read one mask at a time)
    sparsity: float                 # pruned / prunable elements
    candidates: int
    pruned: int
    prunable: int
    seconds: float                  # wall time of `prune`


def check_settings(sparsity: float, reduction_factor: float, num_batches: int,
                   gradient_threshold: float, storage_dtype: torch.dtype) -> None:
    check_numbers(sparsity, reduction_factor, num_batches, gradient_threshold)
    if not (isinstance(storage_dtype, torch.dtype) and storage_dtype.is_floating_point):
        raise ValueError(f"storage dtype must be a floating-point torch dtype, got {storage_dtype!r}")


class GradProbe:
    """The pruner; the structures of its last run stay on it (see the module docstring)."""

    # Its phases, the methods a caller (or an auditor, from outside) can watch, in the spec's order.
    phases = ("save_state", "record_original_gradients", "select_candidates", "reduce_candidates",
              "record_reduced_gradients", "decide", "apply_masks")
    # What each structure it keeps is, in the spec's words, by attribute.
    state_categories = {
        "saved_state": "saved copies", "candidate_originals": "saved copies",
        "gradients_original": "gradient records", "gradients_reduced": "gradient records",
        "candidates": "masks", "masks": "masks",
    }

    def __init__(self, model: torch.nn.Module, strategy: str | Strategy = "magnitude",
                 per_layer: bool = False):
        self.model = model
        self.strategy = make_strategy(strategy, per_layer) if isinstance(strategy, str) else strategy
        self.parameters = model_parameters(model)
        self.prunable = prunable_tensors(model)
        if not self.prunable:
            raise ValueError("the model has no prunable tensors "
                             "(trainable parameters with 2 or more dimensions)")
        self._forget(torch.float32)

    def _forget(self, storage_dtype: torch.dtype) -> None:
        """Drop the last run's structures, so a new run never holds two of them."""
        self.storage_dtype = storage_dtype
        self.saved_state: dict[str, torch.Tensor] = {}
        self.gradients_original: dict[str, torch.Tensor] = {}
        self.candidates: dict[str, torch.Tensor] = {}
        self.gradients_reduced: dict[str, torch.Tensor] = {}
        self.masks: dict[str, torch.Tensor] = {}
        self.candidate_originals: dict[str, torch.Tensor] = {}  # only where S rounds: see restore_weights

    def prune(self, loader: Iterable, loss_fn: Callable | None = None, sparsity: float = 0.1,
              num_batches: int = 2, reduction_factor: float = 0.1, gradient_threshold: float = 2.0,
              storage_dtype: torch.dtype = torch.float32) -> PruneResult:
        check_settings(sparsity, reduction_factor, num_batches, gradient_threshold, storage_dtype)
        batches = CalibrationBatches(loader, num_batches, device=self._device())
        loss_fn = loss_fn or causal_lm_loss
        start = time.perf_counter()
        self._forget(storage_dtype)  # a new run never holds two runs' structures
        try:
            with dropout_disabled(self.model), self.measuring():
                self.measure(batches, loss_fn, sparsity, reduction_factor)
            self.decide(gradient_threshold)
            self.apply_masks()
        except BaseException:
            self.restore_weights()  # a failed prune leaves the model as it found it
            raise
        return self._result(time.perf_counter() - start)

    def measuring(self) -> AbstractContextManager:
        """What the model runs under while it is measured, besides dropout off: nothing, here.

        A variant enters its own context (activation checkpointing, say) and gets it undone,
        on failure too, by the same loop.
        """
        return nullcontext()

    def measure(self, batches: Iterable, loss_fn: Callable, sparsity: float,
                reduction_factor: float) -> None:
        """Every phase that touches the model, in the spec's order: S, G0, M_t, reduction, G1."""
        self.save_state(self.storage_dtype)
        self.record_original_gradients(batches, loss_fn)
        self.select_candidates(batches, sparsity)
        self.reduce_candidates(reduction_factor)
        self.record_reduced_gradients(batches, loss_fn)

    def save_state(self, storage_dtype: torch.dtype = torch.float32) -> None:
        """S: a full copy of every parameter, taken before anything changes."""
        self.storage_dtype = storage_dtype
        self.saved_state = {name: p.detach().to(storage_dtype, copy=True)
                            for name, p in self.parameters.items()}

    def record_gradients(self, batches: Iterable, loss_fn: Callable) -> dict[str, torch.Tensor]:
        return record_gradients(self.model, self.prunable, batches, loss_fn, self.storage_dtype)

    def record_original_gradients(self, batches: Iterable, loss_fn: Callable) -> None:
        """G0, on the unmodified model."""
        self.gradients_original = self.record_gradients(batches, loss_fn)

    def select_candidates(self, batches: Iterable, sparsity: float) -> None:
        """M_t, chosen by the strategy."""
        self.candidates = self.strategy.select(self.model, self.prunable, sparsity, batches)

    @torch.no_grad()
    def reduce_candidates(self, reduction_factor: float) -> None:
        """Every candidate times r, all tensors at once; no other weight is written to."""
        for name, chosen in self.candidates.items():
            weight = self.prunable[name]
            if not holds_exactly(self.storage_dtype, weight.dtype):
                self.candidate_originals[name] = torch.masked_select(weight, chosen)
            for rows in row_blocks(weight):
                block = weight[rows]
                block.copy_(torch.where(chosen[rows], block * reduction_factor, block))

    def record_reduced_gradients(self, batches: Iterable, loss_fn: Callable) -> None:
        """G1, on the reduced model."""
        self.gradients_reduced = self.record_gradients(batches, loss_fn)

    def decide(self, gradient_threshold: float) -> None:
        """M_f = M_t & (G1 <= G0 * (1 + tau)); all False for parameters that are not prunable."""
        self.masks = {}
        for name, p in self.parameters.items():
            if name in self.candidates:
                self.masks[name] = self.final_mask(name, gradient_threshold)
            else:
                self.masks[name] = torch.zeros(p.shape, dtype=torch.bool, device=p.device)

    def final_mask(self, name: str, gradient_threshold: float) -> torch.Tensor:
        """One prunable tensor's M_f, from its dense records."""
        return final_mask(self.candidates[name], self.gradients_original[name],
                          self.gradients_reduced[name], gradient_threshold)

    @torch.no_grad()
    def apply_masks(self) -> None:
        """Every weight back to its original value, then the pruned ones set to zero."""
        self.restore_weights()
        for name in self.candidates:
            self.prunable[name].masked_fill_(self.masks[name], 0)

    @torch.no_grad()
    def restore_weights(self) -> None:
        """Every parameter back to its value at `save_state`, bit for bit.

        Where S holds a parameter exactly (fp32 S, or S in the parameter's own dtype), the
        parameter is copied back from S, as the spec says. Where S rounds it (fp16/bf16 S of an
        fp32 model), copying back would round every weight, which is upstream's fp16 bug; but
        only candidates were ever written to, so only they are put back, from the exact values
        `reduce_candidates` kept (4 bytes per candidate).
        """
        for name, p in self.parameters.items():
            if name in self.candidate_originals:
                p.masked_scatter_(self.candidates[name], self.candidate_originals[name])
            elif name in self.saved_state and holds_exactly(self.storage_dtype, p.dtype):
                p.copy_(self.saved_state[name])

    def candidate_count(self) -> int:
        return count_true(self.candidates)

    def _result(self, seconds: float) -> PruneResult:
        pruned = count_true({name: self.masks[name] for name in self.candidates})
        total = element_count(self.prunable)
        return PruneResult(self.masks, pruned / total, self.candidate_count(), pruned, total, seconds)

    def _device(self) -> torch.device:
        return next(iter(self.parameters.values())).device


def holds_exactly(storage: torch.dtype, values: torch.dtype) -> bool:
    """Whether every number of dtype `values` survives a round trip through `storage`."""
    wider = storage in (torch.float32, torch.float64) and storage.itemsize > values.itemsize
    return storage == values or (wider and values.is_floating_point)
