"""Where each variant's saving comes from, measured on tiny models: it must be there, or the test fails.

- grad-in-backward: no `.grad` outlives its hook, and the tensor bytes a gradient pass allocates
  stay below one dense gradient of the model (the baseline's pass allocates two: G0 and `.grad`).
- checkpointed: every decoder layer runs forward twice per batch (it really recomputes), and
  the activations saved for backward shrink.
- sparse-state: candidates as a bitmask are smaller than as an index list at s = 0.1.
"""
from __future__ import annotations

import gc

import pytest
import torch
from conftest import TINY_GPT_NEO
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from architectures import build_model
from architectures.calibration import synthetic_batches
from gradprobe.variants import make_pruner
from gradprobe.variants.checkpointing import is_checkpointing, set_checkpointing

pytestmark = pytest.mark.usefixtures("one_thread")


class NewTensorBytes(TorchDispatchMode):
    """Peak bytes of tensor storages made while active and still alive (every op is watched).

    Storages alive at entry (weights, masks, records made earlier) are not counted: this is what a
    phase adds. Works on any device; tensor bytes, not RSS, so it is exact and free of noise.
    """

    def __enter__(self):
        gc.collect()  # garbage freed later would otherwise pass for storages alive at entry
        # Weak references, kept: while one is held, no new storage can take that storage's address.
        self.before = {ref.cdata: ref for ref in (StorageWeakRef(t.untyped_storage()) for t in gc.get_objects()
                                                  if issubclass(type(t), torch.Tensor))}  # type(): no proxy lookups
        self.alive, self.peak = {}, 0
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                storage = StorageWeakRef(tensor.untyped_storage())
                if storage.cdata not in self.before:
                    self.alive.setdefault(storage.cdata, (storage, tensor.untyped_storage().nbytes()))
        self.alive = {key: kept for key, kept in self.alive.items() if not kept[0].expired()}
        self.peak = max(self.peak, sum(nbytes for _, nbytes in self.alive.values()))
        return out


def watch_phase(pruner, phase: str) -> NewTensorBytes:
    """Measure one phase of a pruner from outside, while `prune` runs as usual."""
    mode, method = NewTensorBytes(), getattr(pruner, phase)

    def watched(*args, **kwargs):
        with mode:
            return method(*args, **kwargs)
    setattr(pruner, phase, watched)
    return mode


# Weights dominate this model (hidden 128, 32 positions, 1 x 8 tokens), so a dense gradient of
# it stands out against the activations and the gradients in flight.
WIDE = dict(layers=2, hidden=128, vocab=256, heads=4, max_positions=32)


@pytest.mark.parametrize("variant", ["grad-in-backward", "lean"])
def test_grad_in_backward_never_holds_a_dense_gradient(variant, capsys):
    tokens = synthetic_batches(256, sequence_length=8, batch_size=1, num_batches=2, seed=0)
    peaks = {}
    for name in ("baseline", variant):
        model = build_model("tinystories-33m", **WIDE)
        pruner = make_pruner(name, model)
        dense = sum(p.numel() * p.element_size() for p in model.parameters())
        watched = watch_phase(pruner, "record_original_gradients")
        pruner.prune(tokens, sparsity=0.1)
        peaks[name] = watched.peak
        grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads == []  # after the variant's prune: no `.grad` left anywhere
    with capsys.disabled():
        print(f"\n  G0 pass, new tensor bytes at peak: baseline {peaks['baseline']:,}, {variant} "
              f"{peaks[variant]:,}; one dense gradient {dense:,}")
    assert peaks["baseline"] >= 2 * dense  # G0 and .grad, both dense
    assert peaks[variant] < 0.75 * dense


def test_grad_in_backward_drops_each_gradient_before_the_next_is_complete():
    """Seen from an observer hook that runs before the pruner's: only the current tensor has a `.grad`."""
    model = build_model("tinystories-33m", **TINY_GPT_NEO)
    parameters = list(model.parameters())
    largest_alive = []

    def observe(_):
        largest_alive.append(sum(p.grad.numel() for p in parameters if p.grad is not None))
    for p in parameters:
        p.register_post_accumulate_grad_hook(observe)
    tokens = synthetic_batches(256, 16, 2, 2, seed=0)
    make_pruner("grad-in-backward", model).prune(tokens, sparsity=0.1)
    assert len(largest_alive) == 2 * 2 * len(parameters)  # each tensor once per backward: tied too
    assert max(largest_alive) == max(p.numel() for p in parameters)


def count_layer_runs(model) -> list[int]:
    """Counts decoder-layer forward runs, recomputations included.

    transformers checkpoints a layer's `forward`, not its `__call__`, so the layer's own hooks run
    once; a pre-hook on a module inside the layer (the MLP) runs again on every recomputation. A
    pre-hook, because recomputation stops once it has what backward needs, before the MLP returns.
    """
    runs = [0]
    for layer in model.transformer.h:
        layer.mlp.register_forward_pre_hook(lambda *_: runs.__setitem__(0, runs[0] + 1))
    return runs


def saved_activation_bytes(model, prune) -> int:
    """Bytes autograd saves for backward during `prune`, weights excluded (they are saved by reference)."""
    weights = {StorageWeakRef(p.untyped_storage()).cdata for p in model.parameters()}
    saved = [0]

    def pack(tensor):
        if StorageWeakRef(tensor.untyped_storage()).cdata not in weights:
            saved[0] += tensor.numel() * tensor.element_size()
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        prune()
    return saved[0]


def test_checkpointing_recomputes_every_layer_and_saves_fewer_activations(tokens, capsys):
    runs, saved = {}, {}
    for name in ("baseline", "checkpointed"):
        model = build_model("tinystories-33m", **TINY_GPT_NEO).eval()
        counter = count_layer_runs(model)
        pruner = make_pruner(name, model)
        saved[name] = saved_activation_bytes(model, lambda pruner=pruner: pruner.prune(tokens, sparsity=0.1))
        runs[name] = counter[0]
    layers, batches, passes = 2, len(tokens), 2
    assert runs == {"baseline": layers * batches * passes, "checkpointed": 2 * layers * batches * passes}
    with capsys.disabled():
        print(f"\n  activations saved for backward in one prune: baseline {saved['baseline']:,} B, "
              f"checkpointed {saved['checkpointed']:,} B ({saved['checkpointed'] / saved['baseline']:.0%})")
    assert saved["checkpointed"] < 0.5 * saved["baseline"]


def test_checkpointing_restores_each_modules_mode_and_the_switch(tokens):
    model = build_model("tinystories-33m", **TINY_GPT_NEO).train()
    model.transformer.h[1].eval()  # a mixed model: each module's own mode must come back
    modes = [m.training for m in model.modules()]
    make_pruner("checkpointed", model).prune(tokens, sparsity=0.1)
    assert [m.training for m in model.modules()] == modes
    assert not is_checkpointing(model) and model.config.use_cache

    set_checkpointing(model, on=True)  # a model that checkpoints already stays so
    make_pruner("checkpointed", model).prune(tokens, sparsity=0.1)
    assert is_checkpointing(model)


def test_a_bitmask_is_smaller_than_an_index_list_at_s_0_1(capsys):
    model = build_model("tinystories-33m", **TINY_GPT_NEO)
    pruner = make_pruner("sparse-state", model)
    result = pruner.prune(synthetic_batches(256, 16, 2, 2, seed=0), sparsity=0.1)
    bitmask = sum(mask.nbytes for mask in pruner.candidates.values())
    as_bools = result.prunable
    int32_list, int64_list = 4 * result.candidates, 8 * result.candidates
    with capsys.disabled():
        print(f"\n  candidates at s=0.1 ({result.candidates:,} of {result.prunable:,}): bitmask {bitmask:,} B, "
              f"int32 indices {int32_list:,} B, int64 {int64_list:,} B, bool mask {as_bools:,} B")
    assert bitmask == sum((w.numel() + 7) // 8 for w in pruner.prunable.values())
    assert bitmask < int32_list < int64_list and bitmask <= as_bools / 8 + len(pruner.candidates)
