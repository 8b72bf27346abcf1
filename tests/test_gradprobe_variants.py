"""Low-memory variants: the baseline's decisions, bit for bit, from leaner structures.

Settings make the decision matter: s = 0.3 and tau = 0, so a quarter to a half of the candidates
are kept, on a tied GPT-Neo and an untied Mistral, with both strategies.
"""
from __future__ import annotations

from functools import cache

import pytest
import torch
from conftest import TINY_GPT_NEO, TINY_MISTRAL

from architectures import build_model
from architectures.calibration import synthetic_batches
from gradprobe import GradProbe, causal_lm_loss, mask_digest
from gradprobe.variants import PRESETS, VARIANTS, LowMemoryGradProbe, PackedMask, Variant, make_pruner, packed_mask
from gradprobe.variants.at_candidates import candidate_values, put_candidate_values_
from gradprobe.variants.checkpointing import is_checkpointing

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = {"gpt-neo": ("tinystories-33m", TINY_GPT_NEO), "mistral": ("mistral-7b", TINY_MISTRAL)}
EXACT = ["sparse-state", "grad-in-backward", "checkpointed", "lean"]
SETTINGS = dict(sparsity=0.3, gradient_threshold=0.0)
TOKENS = synthetic_batches(256, sequence_length=16, batch_size=2, num_batches=2, seed=0)


def build(family: str) -> torch.nn.Module:
    name, shape = FAMILIES[family]
    return build_model(name, seed=0, **shape).eval()


def weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.fixture(scope="module", autouse=True)
def _forget_pruned():
    """The cached models die with this module: tests of other files in the same process count
    every parameter alive (census, live tensors) and must not see these."""
    yield
    pruned.cache_clear()


@cache
def pruned(family: str, variant: str, strategy: str):
    """(result, weights after pruning, pruner) for one variant; cached: baselines are shared."""
    model = build(family)
    pruner = make_pruner(variant, model, strategy)
    result = pruner.prune(TOKENS, **SETTINGS)
    return result, weights(model), pruner


# -- the same decisions -------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["magnitude", "wanda"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("variant", EXACT)
def test_exact_variants_make_the_baselines_decisions(variant, family, strategy):
    expected, expected_weights, _ = pruned(family, "baseline", strategy)
    result, after, _ = pruned(family, variant, strategy)
    assert 0 < expected.pruned < expected.candidates  # some candidates kept: the rule had a say
    assert mask_digest(result.masks) == mask_digest(expected.masks)
    assert (result.candidates, result.pruned, result.prunable) == \
        (expected.candidates, expected.pruned, expected.prunable)
    for name, weight in expected_weights.items():
        assert torch.equal(after[name], weight), name


def test_chunked_walks_give_the_same_decisions(monkeypatch):
    """Big tensors are walked chunk by chunk; tiny ones would fit one chunk, so force many."""
    monkeypatch.setattr(packed_mask, "CHUNK", 64)
    monkeypatch.setattr("gradprobe.variants.at_candidates.CHUNK", 64)
    expected, expected_weights, _ = pruned("gpt-neo", "baseline", "magnitude")
    model = build("gpt-neo")
    result = make_pruner("lean", model).prune(TOKENS, **SETTINGS)
    assert mask_digest(result.masks) == mask_digest(expected.masks)
    assert all(torch.equal(p.detach(), expected_weights[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize("variant", ["sparse-state", "grad-in-backward", "lean"])
def test_records_are_the_baselines_at_the_candidates(variant):
    """G0, G1 (and a sparse S) hold the baseline's values at the candidates, and nothing else.

    The tied GPT-Neo embedding is among them: its G0 holds both the head's and the embedding's
    contribution only if the gradient was read after both were accumulated.
    """
    _, _, base = pruned("gpt-neo", "baseline", "magnitude")
    _, _, lean = pruned("gpt-neo", variant, "magnitude")
    assert "transformer.wte.weight" in lean.gradients_original
    for name, dense_mask in base.candidates.items():
        chosen = lean.candidates[name]
        if isinstance(chosen, PackedMask):
            assert torch.equal(chosen.unpack(), dense_mask), name
        else:
            assert torch.equal(chosen, dense_mask), name
        for record in ("gradients_original", "gradients_reduced"):
            assert torch.equal(getattr(lean, record)[name], getattr(base, record)[name][dense_mask]), (record, name)
        if lean.variant.state == "sparse":
            assert torch.equal(lean.saved_state[name], base.saved_state[name][dense_mask]), name


def test_sparse_state_keeps_only_what_the_decision_needs():
    result, _, pruner = pruned("gpt-neo", "sparse-state", "magnitude")
    assert set(pruner.saved_state) == set(pruner.prunable)  # nothing for biases and norms
    for name, weight in pruner.prunable.items():
        chosen = pruner.candidates[name]
        assert isinstance(chosen, PackedMask) and chosen.bits.dtype == torch.uint8
        assert chosen.nbytes == (weight.numel() + 7) // 8  # 1 bit per weight
        for kept in (pruner.saved_state[name], pruner.gradients_original[name], pruner.gradients_reduced[name]):
            assert kept.shape == (chosen.count,)
        assert pruner.saved_state[name].dtype == weight.dtype  # exact originals
    assert result.candidates == sum(m.count for m in pruner.candidates.values())


def test_grad_in_backward_leaves_no_gradient_and_no_hook():
    model = build("gpt-neo")
    make_pruner("grad-in-backward", model).prune(TOKENS, **SETTINGS)
    assert all(p.grad is None for p in model.parameters())
    causal_lm_loss(model(TOKENS[0]), TOKENS[0]).backward()  # a hook left behind would drop these
    assert all(p.grad is not None for p in model.parameters())


# -- low precision: not exact, measured -----------------------------------------------------------

@pytest.mark.parametrize("variant, storage", [("low-precision", None), ("lean", torch.bfloat16),
                                              ("lean", torch.float16)])
def test_low_precision_keeps_unpruned_weights_and_counts_differing_decisions(variant, storage, capsys):
    exact, _, _ = pruned("gpt-neo", "baseline", "magnitude")
    model = build("gpt-neo")
    before = weights(model)
    pruner = make_pruner(variant, model)
    result = pruner.prune(TOKENS, **SETTINGS, **({"storage_dtype": storage} if storage else {}))
    storage = storage or torch.bfloat16  # low-precision's own default
    assert pruner.gradients_original["transformer.wte.weight"].dtype == storage
    rounded = 0  # kept candidates that the storage dtype cannot hold: restoring them is the test
    for name, p in model.named_parameters():
        mask = result.masks[name]
        assert torch.equal(p.detach()[~mask], before[name][~mask]), name
        assert not p.detach()[mask].any()
        if name in pruner.prunable:
            kept = before[name][pruner.candidates[name].unpack() if variant == "lean" else pruner.candidates[name]]
            rounded += int((kept.to(storage).float() != kept).sum())
    assert rounded > 0
    differ = sum(int((result.masks[n] != exact.masks[n]).sum()) for n in result.masks)
    with capsys.disabled():
        print(f"\n  {variant} with {storage} storage: {differ} of {result.candidates} decisions differ "
              f"from fp32 ({result.pruned} pruned against {exact.pruned})")
    assert differ <= 0.01 * result.candidates


def test_low_precision_is_the_baselines_half_precision_option():
    """Same masks and weights as the baseline given bf16 storage (only its transients differ)."""
    expected_model, model = build("mistral"), build("mistral")
    expected = GradProbe(expected_model).prune(TOKENS, **SETTINGS, storage_dtype=torch.bfloat16)
    result = make_pruner("low-precision", model).prune(TOKENS, **SETTINGS)
    assert mask_digest(result.masks) == mask_digest(expected.masks)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), expected_model.parameters(), strict=False))


# -- failures leave the model as it was -----------------------------------------------------------

class FailingLoss:
    """Causal LM loss that raises on its 3rd call: the first batch after the reduction."""

    def __init__(self):
        self.calls = 0

    def __call__(self, output, labels):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("loss failed on purpose")
        return causal_lm_loss(output, labels)


@pytest.mark.parametrize("variant", list(PRESETS))
def test_a_failure_midway_restores_weights_modes_and_hooks(variant):
    model = build("gpt-neo")
    dropout = next(m for m in model.modules() if isinstance(m, torch.nn.Dropout))
    dropout.p = 0.25
    before = weights(model)
    pruner = make_pruner(variant, model)
    with pytest.raises(RuntimeError, match="on purpose"):
        pruner.prune(TOKENS, loss_fn=FailingLoss(), **SETTINGS)
    assert pruner.candidates  # it failed after the reduction
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), before[name]), name
    assert not any(m.training for m in model.modules()) and dropout.p == 0.25
    assert not is_checkpointing(model)
    causal_lm_loss(model(TOKENS[0]), TOKENS[0]).backward()
    assert all(p.grad is not None for p in model.parameters())  # no gradient hook left


# -- the registry and the switches ----------------------------------------------------------------

def test_registry_names_every_preset_and_builds_the_right_pruner():
    assert list(VARIANTS)[:6] == ["baseline", "sparse-state", "grad-in-backward", "checkpointed",
                                  "low-precision", "lean"]
    model = build("mistral")
    assert type(make_pruner("baseline", model)) is GradProbe
    lean = make_pruner("lean", model, "wanda", per_layer=True)
    assert isinstance(lean, LowMemoryGradProbe) and lean.strategy.per_layer
    assert lean.variant == Variant(state="sparse", gradients="in-backward", checkpointing=True, rows=True)
    assert PRESETS["low-precision"].storage_dtype == torch.bfloat16


def test_unknown_variant_and_bad_switches_are_value_errors():
    with pytest.raises(ValueError, match="unknown variant 'tiny'; known: baseline, sparse-state, "
                                         "grad-in-backward, checkpointed, low-precision, lean"):
        make_pruner("tiny", build("mistral"))
    with pytest.raises(ValueError, match="state must be one of full, sparse"):
        Variant(state="compressed")
    with pytest.raises(ValueError, match="gradients must be one of dense, in-backward"):
        Variant(gradients="later")
    with pytest.raises(ValueError, match="storage dtype must be a floating-point"):
        Variant(storage_dtype=torch.int8)


def test_checkpointing_needs_a_model_that_supports_it():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    batches = [(torch.randn(2, 4), torch.randn(2, 4))]
    pruner = LowMemoryGradProbe(model, variant=Variant(checkpointing=True))
    with pytest.raises(ValueError, match="cannot checkpoint activations"):
        pruner.prune(batches, lambda out, y: (out - y).pow(2).sum(), num_batches=1)


# -- the building blocks --------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1,), (8,), (9,), (13, 7), (64, 3)])
def test_packed_masks_and_candidate_values_round_trip(shape, monkeypatch):
    monkeypatch.setattr(packed_mask, "CHUNK", 16)
    monkeypatch.setattr("gradprobe.variants.at_candidates.CHUNK", 16)
    torch.manual_seed(0)
    mask = torch.rand(shape) < 0.4
    packed = PackedMask.pack(mask)
    assert torch.equal(packed.unpack(), mask) and packed.count == int(mask.sum())
    tensor = torch.randn(shape)
    assert torch.equal(candidate_values(tensor, packed), tensor[mask])
    target = torch.zeros(shape)
    put_candidate_values_(target, packed, tensor[mask])
    assert torch.equal(target, torch.where(mask, tensor, 0.0))


# -- the same code on CUDA ------------------------------------------------------------------------

@pytest.fixture
def deterministic_cuda(monkeypatch):
    """CUDA's fastest kernels may add in any order; exactness needs the deterministic ones."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("variant", EXACT)
def test_exact_variants_on_cuda_make_the_cuda_baselines_decisions(variant, deterministic_cuda):
    tokens = [t.cuda() for t in TOKENS]
    results, after = {}, {}
    for name in ("baseline", variant):
        model = build("gpt-neo").cuda()
        pruner = make_pruner(name, model, "wanda")
        results[name], after[name] = pruner.prune(tokens, **SETTINGS), weights(model)
        assert all(m.device.type == "cuda" for m in results[name].masks.values())
    assert mask_digest(results[variant].masks) == mask_digest(results["baseline"].masks)
    assert all(torch.equal(after[variant][n], w) for n, w in after["baseline"].items())
    if variant in ("grad-in-backward", "lean"):
        assert all(p.grad is None for p in pruner.parameters.values())
