"""Lean's head and token-embedding gradients taken by rows: the baseline's records bit for bit, and
no [vocab, hidden] gradient ever made.

The tiny models' head fits one chunk, so the chunk is made small here: 24 rows of a 256-token
vocabulary, the last chunk overlapping the one before it, as on the real model.
"""
from __future__ import annotations

import pytest
import torch
from conftest import TINY_GPT_NEO, TINY_MISTRAL
from torch.utils._python_dispatch import TorchDispatchMode

from architectures import build_model
from architectures.calibration import synthetic_batches
from gradprobe import mask_digest
from gradprobe.variants import PackedMask, PackedMasks, make_pruner, row_gradients

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = {"gpt-neo": ("tinystories-33m", TINY_GPT_NEO), "mistral": ("mistral-7b", TINY_MISTRAL)}
SETTINGS = dict(sparsity=0.3, gradient_threshold=0.0)
TOKENS = synthetic_batches(256, sequence_length=16, batch_size=2, num_batches=2, seed=0)
HIDDEN = 64


def build(family: str, padding_idx: int | None = None) -> torch.nn.Module:
    name, shape = FAMILIES[family]
    model = build_model(name, seed=0, **shape).eval()
    model.get_input_embeddings().padding_idx = padding_idx
    return model


def prune(family: str, variant: str, tokens=TOKENS, padding_idx: int | None = None):
    model = build(family, padding_idx)
    pruner = make_pruner(variant, model)
    result = pruner.prune(tokens, **SETTINGS)
    return result, pruner, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture
def small_head_chunks(monkeypatch):
    monkeypatch.setattr(row_gradients, "HEAD_CHUNK_ELEMENTS", 24 * HIDDEN)


@pytest.mark.parametrize("family", FAMILIES)  # tied head (GPT-Neo), untied head (Mistral)
def test_rows_give_the_baselines_records_masks_and_weights(family, small_head_chunks):
    expected, base, base_weights = prune(family, "baseline")
    result, lean, weights = prune(family, "lean")
    head = lean.model.get_output_embeddings().weight
    name = next(n for n, p in lean.parameters.items() if p is head)
    assert name in lean.gradients_original  # the head's record came through the rows
    for tensor, dense_mask in base.candidates.items():
        for record in ("gradients_original", "gradients_reduced"):
            assert torch.equal(getattr(lean, record)[tensor], getattr(base, record)[tensor][dense_mask]), \
                (record, tensor)
    assert 0 < expected.pruned < expected.candidates
    assert mask_digest(result.masks) == mask_digest(expected.masks)
    assert all(torch.equal(weights[n], w) for n, w in base_weights.items())


def test_a_padding_row_gets_only_the_heads_part(small_head_chunks):
    """Mistral declares a padding id in some checkpoints: the embedding's gradient skips its row."""
    tokens = [t.clone() for t in TOKENS]
    for t in tokens:
        t[:, ::3] = 7  # the padding id, read many times
    expected, base, _ = prune("mistral", "baseline", tokens, padding_idx=7)
    result, lean, _ = prune("mistral", "lean", tokens, padding_idx=7)
    assert mask_digest(result.masks) == mask_digest(expected.masks)
    for tensor, dense_mask in base.candidates.items():
        assert torch.equal(lean.gradients_original[tensor], base.gradients_original[tensor][dense_mask]), tensor


class VocabularySized(TorchDispatchMode):
    """Counts the float tensors of `shape` that operators make (the weights and their views left out)."""

    def __init__(self, weights, shape):
        super().__init__()
        self.weights, self.shape, self.made = {w.untyped_storage().data_ptr() for w in weights}, shape, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if (isinstance(t, torch.Tensor) and t.shape == self.shape and t.is_floating_point()
                    and t.untyped_storage().data_ptr() not in self.weights):
                self.made += 1
        return out


@pytest.mark.parametrize("variant, made", [("lean", False), ("grad-in-backward", True)])
def test_no_vocabulary_sized_gradient_is_made(variant, made, small_head_chunks):
    model = build_model("tinystories-33m", seed=0, **{**TINY_GPT_NEO, "vocab": 300})  # 256 x 64 is the MLP's
    pruner = make_pruner(variant, model)
    watch = VocabularySized(model.parameters(), model.get_input_embeddings().weight.shape)
    record_gradients = pruner.record_gradients

    def watched(*args):  # the gradient passes only: the strategy scores a tiny tensor in one block
        with watch:
            return record_gradients(*args)
    pruner.record_gradients = watched
    pruner.prune(TOKENS, **SETTINGS)
    assert (watch.made > 0) == made, watch.made


def test_a_tied_weight_used_elsewhere_is_refused_and_the_model_restored():
    model = build("gpt-neo")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    embedding = model.get_input_embeddings().weight
    model.transformer.ln_f.register_forward_hook(lambda module, args, out: out + 0 * embedding.sum())
    with pytest.raises(RuntimeError, match="transformer.wte.weight got a gradient besides"):
        make_pruner("lean", model).prune(TOKENS, **SETTINGS)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert type(model.get_output_embeddings()).forward is model.get_output_embeddings().forward.__func__


def test_final_masks_are_bits_unpacked_on_request():
    expected, _, _ = prune("gpt-neo", "baseline")
    result, lean, _ = prune("gpt-neo", "lean")
    assert isinstance(result.masks, PackedMasks) and set(result.masks) == set(expected.masks)
    for name, mask in lean.masks.items():
        assert isinstance(mask, PackedMask) and mask.nbytes == (mask.shape.numel() + 7) // 8
        assert torch.equal(result.masks[name], expected.masks[name]), name
    assert result.pruned == sum(m.count for m in lean.masks.values()) == expected.pruned


@pytest.mark.parametrize("rows", [1, 24, 100, 256])
def test_a_head_chunk_of_any_size_is_exact(rows, monkeypatch):
    """One row asked for (16 given: a one-row product has other bits), a multiple of 8, a
    chunk that overlaps the one before it by 44 rows, and the whole vocabulary in one."""
    monkeypatch.setattr(row_gradients, "HEAD_CHUNK_ELEMENTS", rows * HIDDEN)
    expected, base, _ = prune("gpt-neo", "baseline")
    result, lean, _ = prune("gpt-neo", "lean")
    name = "transformer.wte.weight"
    assert torch.equal(lean.gradients_original[name], base.gradients_original[name][base.candidates[name]])
    assert mask_digest(result.masks) == mask_digest(expected.masks)
