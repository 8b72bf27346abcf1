"""Candidate selection: exact thresholds, the target fraction, and Wanda's score against a reference."""
from __future__ import annotations

import copy

import pytest
import torch

from gradprobe import GradProbe, Magnitude, Wanda, make_strategy
from gradprobe.batches import CalibrationBatches
from gradprobe.blocks import row_blocks
from gradprobe.prunable import prunable_tensors
from gradprobe.threshold import candidate_threshold, kth_smallest

pytestmark = pytest.mark.usefixtures("one_thread")


def test_kth_smallest_is_exact_with_ties_and_zeros():
    torch.manual_seed(0)
    tensors = [torch.randn(300, 7).abs(), torch.zeros(4, 10), torch.rand(9, 9).round(), torch.tensor([[3e-39]])]
    every = torch.cat([t.flatten() for t in tensors]).sort().values
    blocks = lambda: (t[rows] for t in tensors for rows in row_blocks(t, 50))  # noqa: E731
    for k in (1, 40, 41, 42, 100, 1000, every.numel()):
        assert kth_smallest(blocks, k) == every[k - 1].item()


def test_candidate_threshold_takes_the_exact_fraction():
    scores = torch.randn(1000, 100).abs()
    t = candidate_threshold(lambda: iter([scores]), scores.numel(), 0.1)
    assert int((scores < t).sum()) == 10_000


@pytest.mark.parametrize("strategy", ["magnitude", "wanda"])
@pytest.mark.parametrize("family", ["tiny_gpt_neo", "tiny_mistral"])
def test_global_candidates_hit_the_target_within_a_tenth_of_a_percent(strategy, family, tokens, request):
    model = request.getfixturevalue(family)
    for sparsity in (0.1, 0.5):
        prunable = prunable_tensors(model)
        candidates = make_strategy(strategy).select(model, prunable, sparsity, CalibrationBatches(tokens, 2))
        fraction = sum(int(c.sum()) for c in candidates.values()) / sum(c.numel() for c in candidates.values())
        assert abs(fraction - sparsity) <= 0.001 * sparsity


@pytest.mark.parametrize("strategy", ["magnitude", "wanda"])
def test_per_layer_candidates_hit_the_target_in_every_tensor(strategy, tiny_mistral, tokens):
    prunable = prunable_tensors(tiny_mistral)
    chosen = make_strategy(strategy, per_layer=True).select(tiny_mistral, prunable, 0.3, CalibrationBatches(tokens, 2))
    for name, mask in chosen.items():
        assert abs(int(mask.sum()) - 0.3 * mask.numel()) <= 0.001 * 0.3 * mask.numel() + 1, name


def test_wanda_per_layer_evens_out_the_mixed_scales_of_a_global_threshold(tiny_mistral, tokens):
    prunable = prunable_tensors(tiny_mistral)
    batches = CalibrationBatches(tokens, 2)
    embedding = "model.embed_tokens.weight"  # scored by |w|; the Linears by |w| * ||X||
    fraction = lambda masks: masks[embedding].float().mean().item()  # noqa: E731
    assert abs(fraction(Wanda().select(tiny_mistral, prunable, 0.1, batches)) - 0.1) > 0.02
    assert fraction(Wanda(per_layer=True).select(tiny_mistral, prunable, 0.1, batches)) == pytest.approx(0.1, abs=1e-3)


def reference_wanda_candidates(model, batches, sparsity):
    """Wanda written the plain way: keep every input, sort every score."""
    from transformers.pytorch_utils import Conv1D
    prunable = prunable_tensors(model)
    by_weight = {id(w): name for name, w in prunable.items()}
    inputs, conv1d, hooks = {}, set(), []
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, Conv1D)) and id(module.weight) in by_weight:
            name = by_weight[id(module.weight)]
            if isinstance(module, Conv1D):
                conv1d.add(name)
            hooks.append(module.register_forward_hook(
                lambda m, i, o, n=name: inputs.setdefault(n, []).append(i[0])))
    with torch.no_grad():
        for x in batches:
            model(x)
    for h in hooks:
        h.remove()
    scores = {}
    for name, w in prunable.items():
        score = w.detach().abs()
        if name in inputs:
            norms = torch.stack([x.reshape(-1, x.shape[-1]).norm(dim=0) for x in inputs[name]]).amax(0)
            score = score * (norms[:, None] if name in conv1d else norms[None, :])
        scores[name] = score
    every = torch.cat([s.flatten() for s in scores.values()]).sort().values
    threshold = every[round(sparsity * every.numel())]
    return {name: s < threshold for name, s in scores.items()}


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=256, n_positions=32,
                                       bos_token_id=255, eos_token_id=255))
    return model.eval()  # GPT-2 has dropout on by default; the pruner turns it off, bare strategies don't


@pytest.mark.parametrize("family", ["tiny_gpt_neo", "tiny_mistral", "gpt2"])
def test_wanda_matches_the_plain_reference(family, tokens, request):
    model = tiny_gpt2() if family == "gpt2" else request.getfixturevalue(family)
    expected = reference_wanda_candidates(model, tokens, 0.2)
    chosen = Wanda().select(model, prunable_tensors(model), 0.2, CalibrationBatches(tokens, 2))
    assert chosen.keys() == expected.keys()
    for name in chosen:
        assert torch.equal(chosen[name], expected[name]), name


def test_wanda_reads_conv1d_inputs_along_its_first_axis(tokens):
    model = tiny_gpt2()
    scales = Wanda().scales(model, prunable_tensors(model), CalibrationBatches(tokens, 2))
    assert scales["transformer.h.0.attn.c_attn.weight"].shape == (32, 1)  # Conv1D weight is [in, out]
    assert scales["transformer.h.0.mlp.c_proj.weight"].shape == (128, 1)
    assert "transformer.wpe.weight" not in scales  # embeddings: plain |w|


def test_magnitude_takes_the_smallest_weights(tiny_gpt_neo, tokens):
    """The candidates are the round(s * P) smallest |w| over all prunable tensors at once: every
    candidate's |w| is below every other weight's (picking the largest 10%, or 10% of each
    tensor, keeps the count and fails here)."""
    model = copy.deepcopy(tiny_gpt_neo)
    prunable = prunable_tensors(model)
    scaled = next(iter(prunable))
    with torch.no_grad():
        prunable[scaled].mul_(100.0)  # one global threshold: this tensor has ~no candidates
    chosen = Magnitude().select(model, prunable, 0.1, CalibrationBatches(tokens, 2))
    magnitudes = torch.cat([prunable[name].detach().abs().flatten() for name in chosen])
    flags = torch.cat([chosen[name].flatten() for name in chosen])
    assert int(flags.sum()) == round(0.1 * flags.numel())
    assert magnitudes[flags].max() < magnitudes[~flags].min()
    assert float(chosen[scaled].float().mean()) < 0.01  # not s of every tensor
    result = GradProbe(model, Magnitude()).prune(tokens, sparsity=0.1)
    assert result.candidates == int(flags.sum())
    for name, pruned in result.masks.items():  # pruned weights are candidates
        assert not (pruned & ~chosen[name]).any() if name in chosen else not pruned.any(), name


def test_unknown_strategy_is_a_value_error(tiny_gpt_neo):
    with pytest.raises(ValueError, match="unknown strategy 'random'; known: magnitude, wanda"):
        GradProbe(tiny_gpt_neo, strategy="random")
