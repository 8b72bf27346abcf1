"""GradProbe end to end on scaled-down real architectures: results, exactness, failures, inputs."""
from __future__ import annotations

import pytest
import torch
from conftest import TINY_GPT_NEO

from architectures import UnknownArchitecture, build_model
from architectures.calibration import synthetic_batches, text_file_batches
from gradprobe import GradProbe, mask_digest

pytestmark = pytest.mark.usefixtures("one_thread")


def snapshot(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("strategy", ["magnitude", "wanda"])
def test_masks_are_deterministic_across_runs(strategy, tokens):
    digests = {mask_digest(GradProbe(build_model("tinystories-33m", **TINY_GPT_NEO), strategy)
                           .prune(tokens, sparsity=0.2).masks) for _ in range(2)}
    assert len(digests) == 1


def test_result_matches_the_model(tiny_mistral, tokens):
    before = snapshot(tiny_mistral)
    result = GradProbe(tiny_mistral).prune(tokens, sparsity=0.1)
    assert set(result.masks) == set(before)
    assert result.prunable == sum(p.numel() for p in before.values() if p.dim() >= 2)
    assert abs(result.candidates / result.prunable - 0.1) <= 1e-4
    assert 0 < result.pruned <= result.candidates and result.sparsity == result.pruned / result.prunable
    for name, p in tiny_mistral.named_parameters():
        mask = result.masks[name]
        assert torch.equal(p.detach()[~mask], before[name][~mask])  # kept weights: bit for bit
        assert not p.detach()[mask].any()
        if p.dim() < 2:
            assert not mask.any()


def test_tied_embedding_and_head_are_one_prunable_tensor(tiny_gpt_neo, tokens):
    pruner = GradProbe(tiny_gpt_neo)
    assert "transformer.wte.weight" in pruner.prunable and "lm_head.weight" not in pruner.prunable
    result = pruner.prune(tokens, sparsity=0.1)
    assert "lm_head.weight" not in result.masks and "lm_head.weight" not in pruner.saved_state
    head = tiny_gpt_neo.lm_head.weight
    assert head is tiny_gpt_neo.transformer.wte.weight  # still tied
    assert int((head == 0).sum()) == int(result.masks["transformer.wte.weight"].sum())
    # The head's gradient reaches every vocabulary row; the embedding's only the rows of seen tokens.
    seen = torch.unique(torch.cat([t.flatten() for t in tokens]))
    unseen = torch.ones(256, dtype=torch.bool)
    unseen[seen] = False
    assert unseen.any() and pruner.gradients_original["transformer.wte.weight"][unseen].gt(0).all()


@pytest.mark.parametrize("storage", [torch.float16, torch.bfloat16])
def test_low_precision_storage_leaves_unpruned_weights_bit_identical(storage, tokens, capsys):
    exact = GradProbe(build_model("tinystories-33m", **TINY_GPT_NEO)).prune(tokens, sparsity=0.3)
    model = build_model("tinystories-33m", **TINY_GPT_NEO)
    before = snapshot(model)
    pruner = GradProbe(model)
    result = pruner.prune(tokens, sparsity=0.3, storage_dtype=storage)
    assert pruner.saved_state["transformer.wte.weight"].dtype == storage
    kept_candidates = rounded_by_storage = 0
    for name, p in model.named_parameters():
        mask = result.masks[name]
        assert torch.equal(p.detach()[~mask], before[name][~mask]), name
        if name in pruner.candidates:
            kept = pruner.candidates[name] & ~mask
            kept_candidates += int(kept.sum())
            original = before[name][kept]
            rounded_by_storage += int((original.to(storage).float() != original).sum())
    assert rounded_by_storage > 0  # restoring those from S would have changed them
    differ = sum(int((result.masks[n] != exact.masks[n]).sum()) for n in result.masks)
    with capsys.disabled():
        print(f"\n  {storage} storage: {differ} of {result.candidates} decisions differ from fp32 storage "
              f"({kept_candidates} candidates kept, {rounded_by_storage} of them not representable in {storage})")
    assert differ <= 0.01 * result.candidates


class FailingLoss:
    """Causal LM loss that raises on the first batch of the second gradient pass (after reduction)."""

    def __init__(self, fail_at_call: int):
        self.calls, self.fail_at_call = 0, fail_at_call

    def __call__(self, output, labels):
        from gradprobe import causal_lm_loss
        self.calls += 1
        if self.calls == self.fail_at_call:
            raise RuntimeError("loss failed on purpose")
        return causal_lm_loss(output, labels)


@pytest.mark.parametrize("storage", [torch.float32, torch.float16])
def test_a_failure_midway_restores_every_weight(storage, tiny_gpt_neo, tokens):
    before = snapshot(tiny_gpt_neo)
    pruner = GradProbe(tiny_gpt_neo)
    with pytest.raises(RuntimeError, match="on purpose"):
        pruner.prune(tokens, loss_fn=FailingLoss(fail_at_call=3), sparsity=0.3, storage_dtype=storage)
    assert pruner.candidates  # the failure came after the reduction
    for name, p in tiny_gpt_neo.named_parameters():
        assert torch.equal(p.detach(), before[name]), name


class ShrinkingLoader:
    """Re-iterable, but yields one batch fewer on every pass after the first."""

    def __init__(self, batches):
        self.batches, self.passes = batches, 0

    def __iter__(self):
        self.passes += 1
        return iter(self.batches if self.passes == 1 else self.batches[:-1])


def test_a_loader_exhausted_midway_is_named_and_the_weights_restored(tiny_gpt_neo, tokens):
    before = snapshot(tiny_gpt_neo)
    with pytest.raises(ValueError, match="gave 1 batch.* but num_batches=2"):
        GradProbe(tiny_gpt_neo).prune(ShrinkingLoader(tokens), sparsity=0.3)
    for name, p in tiny_gpt_neo.named_parameters():
        assert torch.equal(p.detach(), before[name]), name


@pytest.mark.parametrize("settings, message", [
    (dict(sparsity=0.0), "sparsity must be between 0 and 1"),
    (dict(sparsity=1.0), "sparsity must be between 0 and 1"),
    (dict(sparsity=-0.5), "sparsity must be between 0 and 1"),
    (dict(reduction_factor=0.0), r"reduction factor must be in \(0, 1\]"),
    (dict(reduction_factor=1.5), r"reduction factor must be in \(0, 1\]"),
    (dict(num_batches=0), "num_batches must be an integer >= 1"),
    (dict(gradient_threshold=-1.0), "gradient threshold must be >= 0"),
    (dict(storage_dtype=torch.int8), "storage dtype must be a floating-point"),
])
def test_bad_settings_are_value_errors(settings, message, tiny_gpt_neo, tokens):
    with pytest.raises(ValueError, match=message):
        GradProbe(tiny_gpt_neo).prune(tokens, **settings)


@pytest.mark.parametrize("loader, message", [
    ([], "the calibration loader is empty"),
    ("short", r"gave 1 batch\(es\) but num_batches=2"),
    ("one-shot", "one-shot iterator"),
    ([[1, 2, 3]], "a calibration batch must be a tensor x or a pair"),
])
def test_bad_loaders_are_value_errors(loader, message, tiny_gpt_neo, tokens):
    loader = {"short": tokens[:1], "one-shot": iter(tokens)}.get(loader, loader) if isinstance(loader, str) else loader
    with pytest.raises(ValueError, match=message):
        GradProbe(tiny_gpt_neo).prune(loader, num_batches=2 if loader != [[1, 2, 3]] else 1)


def test_a_loader_without_len_that_runs_short_is_a_value_error(tiny_gpt_neo, tokens):
    with pytest.raises(ValueError, match=r"gave 2 batch\(es\) but num_batches=3"):
        GradProbe(tiny_gpt_neo).prune(ShrinkingLoader(tokens), num_batches=3)


def test_a_dataloader_is_read_from_the_start_on_every_pass(tokens):
    from torch.utils.data import DataLoader, TensorDataset
    loader = DataLoader(TensorDataset(torch.cat(tokens)), batch_size=2)  # batches arrive as [x]
    from_loader = GradProbe(build_model("tinystories-33m", **TINY_GPT_NEO)).prune(loader, sparsity=0.2)
    from_list = GradProbe(build_model("tinystories-33m", **TINY_GPT_NEO)).prune(tokens, sparsity=0.2)
    assert mask_digest(from_loader.masks) == mask_digest(from_list.masks)


def test_a_model_without_prunable_tensors_is_a_value_error():
    with pytest.raises(ValueError, match="no prunable tensors"):
        GradProbe(torch.nn.Sequential(torch.nn.LayerNorm(8)))


@pytest.mark.parametrize("name, message", [
    ("gpt-5", "unknown architecture 'gpt-5'; known:"),
    ("/no/such/checkpoint", "checkpoint folder '/no/such/checkpoint' does not exist"),
])
def test_unknown_architecture_or_missing_folder(name, message):
    with pytest.raises(UnknownArchitecture, match=message):
        build_model(name)
    assert issubclass(UnknownArchitecture, ValueError)


def test_a_local_checkpoint_folder_loads_and_prunes(tiny_gpt_neo, tmp_path, tokens):
    tiny_gpt_neo.save_pretrained(tmp_path)
    loaded = build_model(str(tmp_path))
    for name, p in loaded.named_parameters():
        assert torch.equal(p.detach(), dict(tiny_gpt_neo.named_parameters())[name].detach())
    expected = mask_digest(GradProbe(tiny_gpt_neo).prune(tokens).masks)
    assert mask_digest(GradProbe(loaded).prune(tokens).masks) == expected


def save_word_tokenizer(folder, text: str) -> None:
    """A word-level tokenizer trained offline on `text`, saved as a transformers tokenizer folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator([text], trainers.WordLevelTrainer(vocab_size=200, special_tokens=["[UNK]"]))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]").save_pretrained(folder)


STORY = ("Once upon a time a small dog found a red ball in the park . The dog ran to the ball and "
         "the ball rolled away . A girl laughed and threw the ball back to the happy dog . ") * 4


def test_text_file_calibration_with_a_local_tokenizer(tiny_gpt_neo, tmp_path):
    (tmp_path / "story.txt").write_text(STORY)
    save_word_tokenizer(tmp_path / "tokenizer", STORY)
    batches = text_file_batches(str(tmp_path / "story.txt"), str(tmp_path / "tokenizer"), 16, 2, 2)
    assert len(batches) == 2 and batches[0].shape == (2, 16) and int(max(b.max() for b in batches)) < 256
    result = GradProbe(tiny_gpt_neo).prune(batches, sparsity=0.1)
    assert result.pruned > 0
    synthetic = synthetic_batches(256, 16, 2, 2)
    other = GradProbe(build_model("tinystories-33m", **TINY_GPT_NEO)).prune(synthetic, sparsity=0.1)
    assert mask_digest(result.masks) != mask_digest(other.masks)  # the text is really what was read
