"""Streaming GradProbe: the baseline's decisions on a model that stays on disk.

    result = StreamingGradProbe("weights/").prune(batches, out="pruned/", sparsity=0.1)

Only one stage is in memory at a time (the embeddings, one decoder layer, or the head), its
prunable weights as stored (bf16 for a 7B model: half the fp32 size) and computed with in fp32 a
16 MiB block at a time (`streamed_weights`); the hidden states between layers wait on disk
(`hidden_states`); the gradient records are kept at the candidates of the tensors in flight. The
gradients are the exact full-model gradients, got by checkpointed backpropagation one layer at a
time:

    select_candidates          one global threshold t over |w| (magnitude) or |w| * ||X_j|| (WANDA,
                               norms from a streaming forward): two counting passes over the files,
                               or, for half-precision weights by magnitude, one histogram of |w|
                               bit patterns filled as the G0 pass loads each stage (no pass of its own)
    record_original_gradients  forward, layer by layer, keeping the hidden states between layers;
                               backward from the head down: each layer is loaded again, recomputed
                               from its saved input, backpropagated from the gradient at its output;
                               each weight gradient is computed a row block at a time and read at the
                               candidates, so no dense weight gradient exists. G0 goes to scratch.
    decide_and_write           the same pass with candidates times r in every converted block (the
                               files are never changed); as each stage's G1 is complete: decide
                               (`decision.is_pruned`), write the stage's pruned weights (from the
                               stored weights still in memory) and masks.

Calibration batches of one shape go through each decoder layer together (`stacked_groups`): each
converted weight block serves them all, and each weight gradient is still taken per batch.

A stage's candidates are found again from its stored weights and t each time it is loaded, and
dropped with it (`candidates`). Between stages, freed heap memory is handed back to the OS (`heap`),
so each stage starts from the same RSS.

The output folder gets the pruned weights (the stored dtype, one file per stage) with config.json
and an index, so `from_pretrained` loads it; masks go to one safetensors file, a uint8 0/1 tensor
per parameter (1 = pruned), written from one reused part at a time. Every output's bulk bypasses
the page cache (`direct_writes`). The input folder is only read.
"""
from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..batches import CalibrationBatches
from ..decision import is_pruned
from ..loss import causal_lm_loss
from ..pruner import check_settings
from ..strategies import _hook_input_norms
from .candidates import HALF_DTYPES, Candidates, HalfMagnitudes, global_threshold, zero_mask_parts
from .gradient_records import CandidateGradients, ScratchRecords
from .heap import keep_large_blocks_out_of_the_heap, release_free_memory
from .hidden_states import SpilledStack
from .result import StreamingResult
from .safetensors_files import SafetensorsWriter
from .stages import LoadedStage, Stage, StagedModel
from .streamed_weights import BLOCK_BUFFERS, release_buffers
from .weights_folder import WeightsFolder
from .writing import FolderWriter

STRATEGIES = ("magnitude", "wanda")


@dataclass(frozen=True)
class Moment:
    """What the pruner is doing, for a progress callback.

    what: "phase" (a phase ended; `stage` names it), "loaded" (a stage is in memory, ready),
    "batch" (one batch's backward through the stage is done), "done" (the stage is finished:
    its records saved, or decided and written, and its weights freed).
    """
    what: str
    stage: str
    batch: int | None = None
    resident: dict[str, int] | None = None  # the pruner's live structures in bytes, at this moment


class StreamingGradProbe:
    # Its phases, in the spec's words. The three passes run once each; inside them, a method called
    # once per stage (embeddings, each decoder layer, head) is a phase called once per stage:
    #   load_stage          a stage's weights read from the folder
    #   find_candidates     its candidates found again from its stored weights and t
    #   forward_embeddings, forward_layer           the forward, hidden states kept between layers
    #   backward_head, backward_layer, backward_embeddings   recomputed and backpropagated; G read
    #                       at the candidates (in the reduced pass every converted block is reduced
    #                       first: the reduction is inside these, it has no phase of its own)
    #   save_original_gradients   a stage's G0 to scratch (G0 pass)
    #   decide, write_stage       each tensor's M_f, then the stage's pruned weights and masks (G1 pass)
    phases = ("select_candidates", "record_original_gradients", "decide_and_write",
              "load_stage", "find_candidates", "forward_embeddings", "forward_layer", "backward_head",
              "backward_layer", "backward_embeddings", "save_original_gradients", "decide", "write_stage")
    # What each structure it keeps is, by attribute. `candidates` comes before `loaded_stage` in
    # __init__: the positions are masks, whoever else holds them.
    state_categories = {
        "candidates": "masks",                            # M_t of the stage in memory: flat positions
        "records": "gradient records",                    # G0 or G1 at the candidates of tensors in flight
        "loaded_stage": "weights",                        # the stage in memory (prunable weights as stored)
        "model": "weights",                               # the last stage's weights, kept to load into
        "hidden": "activations and temporaries",          # hidden states between layers: the top list
                                                          # in memory, the rest spilled to scratch files
        "block_buffers": "activations and temporaries",   # the reused fp32 blocks of a weight or gradient
        "scales": "other", "counting": "other",           # WANDA's ||X_j||; the |w| histogram
    }

    @staticmethod
    def phase_label(target: str, args: tuple, kwargs: dict) -> str | None:
        """What a phase's call worked on: the stage's name ("layer 3"), or the tensor `decide` decides."""
        if target == "StreamingGradProbe.decide" and len(args) > 1 and isinstance(args[1], str):
            return args[1]
        for value in (*args, *kwargs.values()):
            if isinstance(value, Stage):
                return value.name
            if isinstance(value, LoadedStage):
                return value.stage.name
        return None

    def __init__(self, weights: str, strategy: str = "magnitude",
                 progress: Callable[[Moment], None] | None = None):
        if strategy not in STRATEGIES:
            raise ValueError(f"streaming GradProbe supports the strategies {', '.join(STRATEGIES)}, "
                             f"not {strategy!r}")
        self.strategy = strategy
        self.folder = WeightsFolder(weights)
        self.model = StagedModel(self.folder.config(), self.folder)
        self.prunable = set(self.model.prunable)
        self._progress = progress
        self.threshold: float | None = None
        self.scales: dict[str, torch.Tensor] = {}  # WANDA's ||X_j|| per tensor; none for magnitude
        self.reduction_factor: float | None = None  # set during the reduced pass only
        self.candidates: dict[str, torch.Tensor] = {}  # the stage in memory's, by tensor: positions
        self.records: dict[str, CandidateGradients] = {}
        self.hidden: SpilledStack | None = None  # per layer boundary, per batch; on disk but the top
        self.counting: HalfMagnitudes | None = None  # t of half-precision weights, counted in the G0 pass
        self.batch = 0  # the batch being backpropagated through the embeddings or the head
        self.groups: list[list[int]] = []  # batches run through a decoder layer together (`stacked_groups`)
        self.group: list[int] = []  # the batches whose gradients flow now, in their stacked order
        self.loaded_stage: LoadedStage | None = None  # the stage in memory
        self.block_buffers = BLOCK_BUFFERS  # where its weights and gradients are converted a block at a time
        self.scratch: str | None = None

    def prune(self, loader: Iterable, out: str, loss_fn: Callable | None = None, sparsity: float = 0.1,
              num_batches: int = 2, reduction_factor: float = 0.1, gradient_threshold: float = 2.0,
              masks_out: str | None = None, scratch: str | None = None) -> StreamingResult:
        check_settings(sparsity, reduction_factor, num_batches, gradient_threshold, torch.float32)
        self._check_output(out)
        batches = list(CalibrationBatches(loader, num_batches))  # token ids: small
        loss_fn = loss_fn or causal_lm_loss
        masks_out = masks_out or os.path.join(out, "masks.safetensors")
        keep_large_blocks_out_of_the_heap()
        start = time.perf_counter()
        os.makedirs(out, exist_ok=True)
        scratch_folder = self.scratch = tempfile.mkdtemp(prefix="gradprobe-scratch-", dir=scratch or out)
        try:
            self.select_candidates(batches, sparsity)
            release_free_memory()
            self.progress(Moment("phase", "candidates selected"))
            self.record_original_gradients(batches, loss_fn, ScratchRecords(scratch_folder))
            self.progress(Moment("phase", "G0 recorded"))
            counts = self.decide_and_write(batches, loss_fn, reduction_factor, gradient_threshold,
                                           ScratchRecords(scratch_folder), out, masks_out)
        finally:
            self.model.drop_released()
            release_free_memory()
            shutil.rmtree(scratch_folder, ignore_errors=True)
        prunable = sum(torch.Size(self.model.shapes[n]).numel() for n in self.model.prunable)
        if self.threshold is None:  # fixed by the first gradient pass at the latest
            raise RuntimeError("the pruner finished without a candidate threshold")
        return StreamingResult(out, masks_out, counts["pruned"] / prunable, counts["candidates"],
                               counts["pruned"], prunable, time.perf_counter() - start, self.threshold)

    # -- the phases --------------------------------------------------------------------------

    def select_candidates(self, batches: list, sparsity: float) -> None:
        """One global threshold t over the scores of all prunable tensors: |w|, or |w| * ||X_j|| (WANDA).

        Half-precision weights by magnitude: t is counted as the G0 pass loads them (`HalfMagnitudes`).
        """
        self.scales = self.input_norms(batches) if self.strategy == "wanda" else {}
        names = self.model.prunable
        if self.strategy == "magnitude" and all(self.folder.stored_tensor(n).dtype in HALF_DTYPES for n in names):
            total = sum(math.prod(self.folder.stored_tensor(n).shape) for n in names)
            self.threshold, self.counting = None, HalfMagnitudes(total, sparsity)
        else:
            self.threshold = global_threshold(self.folder, names, sparsity, self.scales)

    @torch.no_grad()
    def input_norms(self, batches: list) -> dict[str, torch.Tensor]:
        """WANDA's ||X_j|| for every Linear, read by the baseline's own hooks in a streaming forward."""
        family = self.model.family
        norms: dict[str, torch.Tensor] = {}
        with self.resident(self.model.embeddings) as stage:
            hidden = [family.embed(stage.modules, x) for x, _ in batches]
        layer_inputs = [family.layer_inputs(h) for h in hidden]
        for layer in self.model.decoder_layers:
            with self.resident(layer) as stage, self._norms_hooked(stage, norms):
                hidden = [family.run_layer(stage.layer, h, extra)
                          for h, extra in zip(hidden, layer_inputs, strict=False)]
        with self.resident(self.model.head) as stage, self._norms_hooked(stage, norms):
            for h in hidden:
                family.logits(stage.modules, h)  # the head's input norms; a tied head scores the embedding
        return norms

    @contextmanager
    def _norms_hooked(self, stage, norms: dict):
        prunable = {name: p for name, p in stage.tensors().items() if name in self.prunable}
        handles = [h for module in stage.modules.values() for h in _hook_input_norms(module, prunable, norms)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def record_original_gradients(self, batches: list, loss_fn: Callable, scratch: ScratchRecords) -> None:
        """G0 at the candidates, stage by stage to scratch."""
        self.reduction_factor = None
        self.gradient_pass(batches, loss_fn, lambda stage, records, loaded:
                           self.save_original_gradients(scratch, stage, records))

    def save_original_gradients(self, scratch: ScratchRecords, stage: Stage,
                                records: dict[str, CandidateGradients]) -> None:
        """A stage's G0, complete, to scratch until the reduced pass decides the stage."""
        scratch.save(stage.file, {name: record.maximum for name, record in records.items()})

    def decide_and_write(self, batches: list, loss_fn: Callable, reduction_factor: float, tau: float,
                         scratch: ScratchRecords, out: str, masks_out: str) -> dict[str, int]:
        """G1 on the reduced model; each stage decided and written as soon as its G1 is complete."""
        shapes = self.model.shapes
        dtypes = {name: self.folder.stored_tensor(name).dtype for name in shapes}
        weights = FolderWriter(out, self.model.config, shapes, dtypes)
        masks = SafetensorsWriter(masks_out, {name: (torch.uint8, shape) for name, shape in shapes.items()})
        counts = {"candidates": 0, "pruned": 0}

        def decide(stage: Stage, records: dict[str, CandidateGradients], loaded: LoadedStage) -> None:
            release_free_memory()  # the backward's blocks: the decision and the writes start from here
            before = scratch.open(stage.file)  # G0, read one tensor at a time

            def pruned(name: str) -> torch.Tensor | None:
                """One bool per candidate of `name` (None: not prunable); its G1 record freed."""
                if name not in records:
                    return None
                chosen = self.decide(name, before[name](), records.pop(name).maximum, tau)
                counts["candidates"] += chosen.numel()
                counts["pruned"] += int(torch.count_nonzero(chosen))
                return chosen

            self.write_stage(loaded, pruned, weights, masks)
            scratch.remove(stage.file)

        self.reduction_factor = reduction_factor
        try:
            self.gradient_pass(batches, loss_fn, decide)
        finally:
            self.reduction_factor = None
        masks.close()
        weights.finish()
        return counts

    def decide(self, name: str, original: torch.Tensor, reduced: torch.Tensor, tau: float) -> torch.Tensor:
        """M_f at tensor `name`'s candidates, from its G0 and G1 there: G1 <= G0 * (1 + tau)."""
        return is_pruned(torch.tensor(True), original, reduced, tau)

    # -- one gradient pass, a stage at a time --------------------------------------------------

    def gradient_pass(self, batches: list, loss_fn: Callable,
                      stage_done: Callable[[Stage, dict[str, CandidateGradients], LoadedStage], None]) -> None:
        self.stage_done, self.records = stage_done, {}
        self.groups = stacked_groups(batches)
        hidden = self.hidden = SpilledStack(tempfile.mkdtemp(prefix="hidden-", dir=self.scratch))
        try:
            layer_inputs = self.forward(batches)
            grads = self.backward_head(batches, loss_fn)
            for stage in reversed(self.model.decoder_layers):
                grads = self.backward_layer(stage, layer_inputs, grads)
            self.backward_embeddings(batches, grads)
        finally:
            hidden.close()

    @torch.no_grad()
    def forward(self, batches: list) -> list[dict]:
        """The hidden states between layers, kept in `self.hidden`; returns what each layer call needs."""
        self.forward_embeddings(batches)
        layer_inputs = [self.model.family.layer_inputs(h) for h in self._hidden().top()]
        for layer in self.model.decoder_layers:
            self.forward_layer(layer, layer_inputs)
        return layer_inputs

    @torch.no_grad()
    def forward_embeddings(self, batches: list) -> None:
        """Each batch embedded; the hidden states of each group of batches concatenated, for the layers."""
        with self.resident(self.model.embeddings) as stage:
            embedded = [self.model.family.embed(stage.modules, x) for x, _ in batches]
            self._hidden().push([torch.cat([embedded[batch] for batch in group]) for group in self.groups])

    @torch.no_grad()
    def forward_layer(self, layer: Stage, layer_inputs: list[dict]) -> None:
        hidden = self._hidden()
        with self.resident(layer) as stage:
            hidden.push([self.model.family.run_layer(stage.layer, h, inputs)
                         for h, inputs in zip(hidden.top(), layer_inputs, strict=False)])

    def backward_head(self, batches: list, loss_fn: Callable) -> list[torch.Tensor]:
        """The loss of each batch apart; the gradient at the last layer's output, per group."""
        from transformers.modeling_outputs import CausalLMOutputWithPast
        grads = []
        with self.resident(self.model.head, backward=True) as stage:
            for group, outputs in zip(self.groups, self._hidden().pop(), strict=False):
                parts = [part.detach().requires_grad_() for part in outputs.chunk(len(group))]
                for self.batch, hidden in zip(group, parts, strict=False):
                    self._flowing(stage, [self.batch])
                    logits = self.model.family.logits(stage.modules, hidden)
                    loss_fn(CausalLMOutputWithPast(logits=logits), batches[self.batch][1]).backward()
                    del logits  # its graph node holds the head's weight: gone before the stage is dropped
                    self.progress(Moment("batch", stage.stage.name, self.batch))
                grads.append(torch.cat([_grad(hidden) for hidden in parts]))
        return grads

    def backward_layer(self, layer: Stage, layer_inputs: list[dict], grads: list) -> list[torch.Tensor]:
        """Recompute the layer from its saved input, backpropagate the gradient at its output."""
        inputs = self._hidden().pop()
        with self.resident(layer, backward=True) as stage:
            for group, hidden, extra, grad in zip(self.groups, inputs, layer_inputs, grads, strict=False):
                self._flowing(stage, group)
                self.model.family.run_layer(stage.layer, hidden.requires_grad_(), extra).backward(grad)
                for batch in group:
                    self.progress(Moment("batch", layer.name, batch))
        return [_grad(hidden) for hidden in inputs]

    def backward_embeddings(self, batches: list, grads: list) -> None:
        with self.resident(self.model.embeddings, backward=True) as stage:
            for group, grad in zip(self.groups, grads, strict=False):
                for self.batch, part in zip(group, grad.chunk(len(group)), strict=False):
                    self._flowing(stage, [self.batch])
                    self.model.family.embed(stage.modules, batches[self.batch][0]).backward(part)
                    self.progress(Moment("batch", "embeddings", self.batch))

    def _hidden(self) -> SpilledStack:
        if self.hidden is None:
            raise RuntimeError("hidden states are kept during a gradient pass only")
        return self.hidden

    def _flowing(self, stage: LoadedStage, group: list[int]) -> None:
        """The batches whose gradients come next, stacked in this order: each weight gradient is
        taken for each of them apart."""
        self.group = group
        for weight in stage.weights.values():
            weight.stacked = len(group)

    @contextmanager
    def resident(self, stage: Stage, backward: bool = False):
        """The stage loaded (reduced in the reduced pass), hooked if backward; finished, then dropped."""
        loaded = self.load_stage(stage, backward)
        try:
            self.find_candidates(loaded, backward)  # (a loop here would keep its last tensor alive)
            release_free_memory()  # what finding the candidates left in the heap
            self.progress(Moment("loaded", stage.name))
            yield loaded
            release_buffers()
            if backward:  # finished while its weights are here: the reduced pass writes them
                done = {name: self.records.pop(name) for name in stage.owns if name in self.prunable}
                self.stage_done(stage, done, loaded)
                del done
        finally:
            self.candidates = {}
            loaded.release()
            release_buffers()
            self.loaded_stage = None
            release_free_memory()
        if backward:
            self.progress(Moment("done", stage.name))

    def load_stage(self, stage: Stage, backward: bool) -> LoadedStage:
        """The stage's weights read from the folder; the next stage's asked of the kernel meanwhile."""
        loaded = self.loaded_stage = self.model.load(stage, self.prunable)
        self.model.prefetch(self.model.following(stage, backward))  # read from disk while this computes
        return loaded

    def find_candidates(self, loaded: LoadedStage, backward: bool) -> None:
        """t, where it is counted as the stages load; then the stage's candidates, found again."""
        self._count(loaded)
        self._prepare(loaded, backward)

    def _count(self, loaded: LoadedStage) -> None:
        """In the G0 pass on half-precision weights: count |w|, and fix t once every tensor is counted."""
        if self.counting is None:
            return
        for name, weight in loaded.weights.items():
            self.counting.add(name, weight.stored)
        if len(self.counting.counted) == len(self.prunable):
            self.threshold, self.counting = self.counting.threshold(), None

    def _prepare(self, loaded: LoadedStage, backward: bool) -> None:
        reducing = self.reduction_factor is not None
        for name, weight in loaded.weights.items():
            if not (backward or reducing):  # a forward outside the reduced pass: nothing to read or reduce
                continue
            threshold = self.threshold
            if threshold is None:
                raise RuntimeError("candidates are needed before the threshold is known")
            weight.threshold, weight.scale = threshold, self.scales.get(name)
            weight.reduction = self.reduction_factor
            if backward:  # their positions: where the gradient is read, and the masks are written
                weight.candidates = Candidates(weight.stored, threshold, self.scales.get(name))
                self.candidates[name] = weight.candidates.positions
                if name not in self.records:
                    self.records[name] = CandidateGradients(weight.candidates.count())
                weight.consume = self._consumer(name, complete=name in loaded.stage.owns)
        if backward:  # the other parameters' gradients are never read: freed the moment they are complete
            for tensor in loaded.parameters.values():
                tensor.register_post_accumulate_grad_hook(_drop_grad)

    def _consumer(self, name: str, complete: bool) -> Callable:
        def consume(values: torch.Tensor, part: int) -> None:  # a weight's gradient at its candidates, one batch
            self.records[name].add(self.group[part], values, complete)
        return consume

    # -- output ---------------------------------------------------------------------------------

    def write_stage(self, loaded: LoadedStage, pruned: Callable[[str], torch.Tensor | None],
                     weights: FolderWriter, masks: SafetensorsWriter) -> None:
        """The stage's weights as stored, pruned ones zeroed (in place: the stage is done); its masks.

        One tensor at a time: decided, written, and its transients handed back before the next.
        """
        stage = loaded.stage
        with weights.stage_file(stage) as file:
            for name in stage.owns:
                streamed = loaded.weights.get(name)
                weight = streamed.stored if streamed else self.folder.load(name)  # in its stored dtype
                chosen = pruned(name)
                if chosen is None:
                    masks.write_in_parts(name, zero_mask_parts(weight.numel()))
                elif streamed is None or streamed.candidates is None:
                    raise RuntimeError(f"{name} was decided without its candidates in memory")
                else:
                    streamed.candidates.zero_chosen(weight, chosen)
                    masks.write_in_parts(name, streamed.candidates.mask_parts(chosen))
                file.write(name, weight)
                del weight, chosen
                release_free_memory()

    def _check_output(self, out: str) -> None:
        if os.path.abspath(out) == os.path.abspath(self.folder.path):
            raise ValueError(f"the output folder {out!r} is the weights folder: give a new folder "
                             "(the weights are read again while the pruned ones are written)")
        if os.path.isdir(out) and os.listdir(out):
            raise ValueError(f"the output folder {out!r} is not empty: give a new or empty folder")

    def progress(self, moment: Moment) -> None:
        if self._progress is not None:
            self._progress(Moment(moment.what, moment.stage, moment.batch, self.resident_bytes()))

    def resident_bytes(self) -> dict[str, int]:
        """The pruner's own live structures in bytes, by what they are (for measurements)."""
        def size(tensors):
            return sum(t.numel() * t.element_size() for t in tensors)
        stage = self.loaded_stage.tensors().values() if self.loaded_stage else []
        streamed = self.loaded_stage.weights.values() if self.loaded_stage else []
        return {"stage weights": size(stage),
                "hidden states": self.hidden.nbytes if self.hidden else 0,
                "candidate positions": size(w.candidates.positions for w in streamed if w.candidates),
                "gradient records": sum(r.nbytes for r in self.records.values())}


def stacked_groups(batches: list) -> list[list[int]]:
    """Batches that go through each decoder layer together: those of one shape, first seen first.

    Concatenated, they share each converted weight block and make larger products; every row's
    result is the same as alone (the products and the per-row reductions on this machine's BLAS:
    `tests/test_gradprobe_streaming.py` checks the masks bit for bit). Gradients stay per batch.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for number, (x, _) in enumerate(batches):
        groups.setdefault(tuple(x.shape), []).append(number)
    return list(groups.values())


def _grad(tensor: torch.Tensor) -> torch.Tensor:
    """The gradient backward left at a hidden state it ran through."""
    if tensor.grad is None:
        raise RuntimeError("backward left no gradient at a hidden state: the loss does not depend on it")
    return tensor.grad


def _drop_grad(tensor: torch.Tensor) -> None:
    tensor.grad = None
