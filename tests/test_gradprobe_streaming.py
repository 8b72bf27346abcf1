"""Streaming GradProbe: the baseline's exact decisions, one decoder layer in memory, outputs on disk."""
from __future__ import annotations

import json
import os
import weakref

import pytest
import torch
from conftest import TINY_GPT_NEO, TINY_MISTRAL
from safetensors.torch import load_file

from architectures import build_model, make_config
from gradprobe import GradProbe, causal_lm_loss, mask_digest
from gradprobe.batches import CalibrationBatches
from gradprobe.streaming import StreamingGradProbe, generate_random_weights, save_model
from gradprobe.streaming.cli import main
from gradprobe.streaming.gradient_records import ScratchRecords
from gradprobe.streaming.stages import StagedModel

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {"gpt_neo": ("tinystories-33m", TINY_GPT_NEO), "mistral": ("mistral-7b", TINY_MISTRAL)}


def written_weights(folder: str) -> dict[str, torch.Tensor]:
    weights = {}
    for file in os.listdir(folder):
        if file.endswith(".safetensors") and file != "masks.safetensors":
            weights.update(load_file(os.path.join(folder, file)))
    return weights


@pytest.fixture(params=sorted(TINY))
def family(request):
    return request.param


@pytest.fixture
def weights(family, tmp_path):
    """A tiny model of the family, and the same model written as a weights folder."""
    arch, overrides = TINY[family]
    folder = str(tmp_path / "weights")
    save_model(build_model(arch, seed=0, **overrides), folder)
    return folder


# At tau = 0 about half the candidates are kept: the gradient comparison decides.
@pytest.mark.parametrize("strategy, tau", [("magnitude", 2.0), ("magnitude", 0.0), ("wanda", 0.0)])
def test_masks_and_pruned_weights_are_the_baselines_bit_for_bit(family, weights, tokens, tmp_path,
                                                                 strategy, tau):
    arch, overrides = TINY[family]
    model = build_model(arch, seed=0, **overrides)
    baseline = GradProbe(model, strategy).prune(tokens, sparsity=0.1, gradient_threshold=tau)
    result = StreamingGradProbe(weights, strategy).prune(tokens, str(tmp_path / "out"), sparsity=0.1,
                                                         gradient_threshold=tau)
    assert 0 < result.pruned < result.candidates or tau > 0
    assert (result.candidates, result.pruned, result.prunable) == \
           (baseline.candidates, baseline.pruned, baseline.prunable)
    assert mask_digest(result.masks) == mask_digest(baseline.masks)
    for name, mask in baseline.masks.items():  # the file: uint8 0/1, one tensor per parameter
        assert torch.equal(load_file(result.masks_path)[name], mask.to(torch.uint8))
    pruned = written_weights(result.out)
    assert set(pruned) == set(baseline.masks)
    for name, p in model.named_parameters():  # the baseline's pruned model, bit for bit
        assert torch.equal(pruned[name], p.detach()), name


def test_the_output_folder_loads_with_from_pretrained(weights, tokens, tmp_path):
    result = StreamingGradProbe(weights).prune(tokens, str(tmp_path / "out"), sparsity=0.2)
    reloaded = build_model(result.out)
    pruned = written_weights(result.out)
    for name, p in reloaded.named_parameters():
        assert torch.equal(p.detach(), pruned[name])
        assert int((p == 0).sum()) >= int(result.masks[name].sum())


def test_tied_head_gradient_is_summed_with_the_embeddings_before_the_max(tokens, tmp_path):
    model = build_model("tinystories-33m", seed=0, **TINY_GPT_NEO)
    save_model(model, str(tmp_path / "weights"))
    baseline = GradProbe(model)
    baseline.prune(tokens, sparsity=0.1)
    streaming = StreamingGradProbe(str(tmp_path / "weights"))
    batches = list(CalibrationBatches(tokens, 2))
    streaming.select_candidates(batches, 0.1)
    scratch = ScratchRecords(str(tmp_path / "scratch"))
    streaming.record_original_gradients(batches, causal_lm_loss, scratch)
    name = "transformer.wte.weight"
    g0 = scratch.load("embeddings.safetensors")[name]
    expected = baseline.gradients_original[name][baseline.candidates[name]]
    assert torch.equal(g0, expected)
    # Rows of tokens never seen get their gradient from the head alone; seen rows from both uses.
    rows = baseline.candidates[name].nonzero()[:, 0]
    seen = torch.isin(rows, torch.cat([t.flatten() for t in tokens]))
    assert seen.any() and (~seen).any() and g0[~seen].gt(0).all()


def test_one_decoder_layer_is_resident_at_a_time(weights, tokens, tmp_path, monkeypatch):
    built = weakref.WeakSet()  # every decoder layer module the pruner builds, while it lives
    build_layer = StagedModel._build_layer

    def tracked(self, index):
        layer = build_layer(self, index)
        built.add(layer)
        return layer

    monkeypatch.setattr(StagedModel, "_build_layer", tracked)
    alive = []  # (moment, stage, decoder layers alive): no gc.collect, so a cycle keeping one counts
    pruner = StreamingGradProbe(weights, progress=lambda m: alive.append((m.what, m.stage, len(built))))
    pruner.prune(tokens, str(tmp_path / "out"), sparsity=0.1)
    layers = len(pruner.model.decoder_layers)
    assert pruner.model.layers_loaded == 4 * layers  # forward and backward, two passes
    assert pruner.model.most_layers_resident == 1 and len(built) == 0
    in_layers = [count for what, stage, count in alive if stage.startswith("layer")]
    elsewhere = [count for what, stage, count in alive if not stage.startswith("layer")]
    assert len(in_layers) > 4 * layers and max(in_layers) == 1
    assert elsewhere and max(elsewhere) == 0  # none while the embeddings or the head are in memory


def test_bf16_weights_are_pruned_in_bf16_and_kept_exactly(tokens, tmp_path):
    config = make_config("mistral-7b", **TINY_MISTRAL)
    generate_random_weights(config, str(tmp_path / "weights"), seed=3, dtype=torch.bfloat16)
    before = written_weights(str(tmp_path / "weights"))
    result = StreamingGradProbe(str(tmp_path / "weights")).prune(tokens, str(tmp_path / "out"), sparsity=0.3)
    after = written_weights(result.out)
    assert result.pruned > 0
    for name, weight in after.items():
        mask = result.masks[name]
        assert weight.dtype == torch.bfloat16
        assert torch.equal(weight[~mask], before[name][~mask]) and not weight[mask].any()


def test_random_weights_are_seeded_and_written_a_stage_at_a_time(tmp_path):
    config = make_config("mistral-7b", **TINY_MISTRAL)
    generate_random_weights(config, str(tmp_path / "a"), seed=1)
    generate_random_weights(config, str(tmp_path / "b"), seed=1)
    a, b = written_weights(str(tmp_path / "a")), written_weights(str(tmp_path / "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    files = sorted(f for f in os.listdir(tmp_path / "a") if f.endswith(".safetensors"))
    assert files == ["embeddings.safetensors", "head.safetensors", "layer-000.safetensors",
                     "layer-001.safetensors"]


def test_bad_inputs_are_clear_value_errors(weights, tokens, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        StreamingGradProbe(str(tmp_path / "nowhere"))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ValueError, match="no config.json"):
        StreamingGradProbe(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="unknown|supports the strategies"):
        StreamingGradProbe(weights, strategy="random")
    pruner = StreamingGradProbe(weights)
    with pytest.raises(ValueError, match="is the weights folder"):
        pruner.prune(tokens, weights)
    with pytest.raises(ValueError, match="sparsity"):
        pruner.prune(tokens, str(tmp_path / "out"), sparsity=1.5)


def test_a_config_that_does_not_match_the_weights_is_a_value_error(weights, tmp_path):
    with open(os.path.join(weights, "config.json")) as file:
        config = json.load(file)
    config["hidden_size"] *= 2
    with open(os.path.join(weights, "config.json"), "w") as file:
        json.dump(config, file)
    with pytest.raises(ValueError, match="does not match its config: .* on disk, the config implies"):
        StreamingGradProbe(weights)
    config["hidden_size"] //= 2
    with open(os.path.join(weights, "config.json"), "w") as file:
        json.dump(config, file)
    os.remove(os.path.join(weights, "layer-001.safetensors"))
    with pytest.raises(ValueError, match=r"missing, e\.g\. '.*\.1\."):
        StreamingGradProbe(weights)
    with open(os.path.join(weights, "config.json"), "w") as file:
        file.write("{not json")
    with pytest.raises(ValueError, match="cannot be read"):
        StreamingGradProbe(weights)


def test_cli_prunes_a_folder_and_reports_one_line_errors(weights, tmp_path, capsys):
    out, summary = str(tmp_path / "out"), str(tmp_path / "summary.json")
    assert main(["prune", "--weights", weights, "--out", out, "--seq-len", "16", "--batch-size", "2",
                 "--summary-json", summary]) == 0
    printed = capsys.readouterr().out
    with open(summary) as file:
        record = json.load(file)
    assert record["mask_digest"] in printed and record["most_decoder_layers_resident"] == 1
    with pytest.raises(SystemExit) as exit_:
        main(["prune", "--weights", str(tmp_path / "nowhere"), "--out", out])
    error = capsys.readouterr().err
    assert exit_.value.code == 2 and error.count("\n") == 1 and "does not exist" in error


def test_registered_variant_prunes_a_model_in_memory_like_the_baseline(tokens):
    from gradprobe.variants import make_pruner
    expected_model = build_model("tinystories-33m", seed=0, **TINY_GPT_NEO)
    expected = GradProbe(expected_model).prune(tokens, sparsity=0.2, gradient_threshold=0.0)
    model = build_model("tinystories-33m", seed=0, **TINY_GPT_NEO)
    result = make_pruner("streaming", model).prune(tokens, sparsity=0.2, gradient_threshold=0.0)
    assert mask_digest(result.masks) == mask_digest(expected.masks) and result.pruned == expected.pruned
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), expected_model.parameters(), strict=False))
    with pytest.raises(ValueError, match="per-layer"):
        make_pruner("streaming", model, per_layer=True)


def test_candidates_are_the_baselines_and_reduce_as_it_does():
    from gradprobe.strategies import TensorScores
    from gradprobe.streaming.candidates import Candidates
    weight = torch.randn(3000, 700) * torch.logspace(-30, 3, 3000).unsqueeze(1)  # > one block, subnormals
    scale = torch.rand(1, 700) * 10
    for threshold, s in [(0.5, None), (1e-30, None), (2.0, scale)]:
        expected = TensorScores(weight, s).below(threshold)
        candidates = Candidates(weight.clone(), threshold, s)
        assert expected.any() and torch.equal(candidates.gather(weight), weight[expected])
        candidates.reduce(0.1)
        assert torch.equal(candidates.weight, torch.where(expected, weight * 0.1, weight))
        mask = torch.zeros(weight.shape, dtype=torch.uint8)
        candidates.scatter(mask, torch.ones(candidates.count(), dtype=torch.uint8))
        assert torch.equal(mask.bool(), expected)


def test_batches_of_one_shape_go_through_the_layers_together_and_decide_as_apart(family, weights, tmp_path):
    """Batches of one shape are stacked through each decoder layer; their gradients stay apart, so
    the decisions are the baseline's with batches of two shapes interleaved (three groups' worth)."""
    from architectures.calibration import synthetic_batches
    from gradprobe.streaming.pruner import stacked_groups
    long = synthetic_batches(256, sequence_length=16, batch_size=1, num_batches=2, seed=1)
    short = synthetic_batches(256, sequence_length=11, batch_size=1, num_batches=1, seed=2)
    batches = [long[0], short[0], long[1]]
    assert stacked_groups(list(CalibrationBatches(batches, 3))) == [[0, 2], [1]]
    arch, overrides = TINY[family]
    model = build_model(arch, seed=0, **overrides)
    baseline = GradProbe(model).prune(batches, num_batches=3, sparsity=0.1, gradient_threshold=0.0)
    result = StreamingGradProbe(weights).prune(batches, str(tmp_path / "out"), num_batches=3, sparsity=0.1,
                                               gradient_threshold=0.0)
    assert 0 < result.pruned < result.candidates
    assert mask_digest(result.masks) == mask_digest(baseline.masks)
