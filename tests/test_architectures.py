"""Named architectures: published parameter counts (meta device), scaled-down members, bad names."""
from __future__ import annotations

import pytest

from architectures import UnknownArchitecture, build_model, count_parameters, make_config


@pytest.mark.parametrize("name, parameters", [
    ("tinystories-33m", 68_514_048),
    ("mistral-7b", 7_241_732_096),
    ("llama-2-7b", 6_738_415_616),
    ("gpt-neo-125m", 125_198_592),
    ("gpt-neo-1.3b", 1_315_575_808),
])
def test_parameter_counts_of_the_named_architectures(name, parameters):
    assert count_parameters(name) == parameters


def test_scaled_down_members_keep_the_family_and_its_special_tokens_in_range():
    model = build_model("tinystories-33m", layers=2, hidden=64, vocab=256, heads=4)
    config = model.config
    assert (config.model_type, config.num_layers, config.hidden_size, config.vocab_size) == ("gpt_neo", 2, 64, 256)
    assert config.bos_token_id < 256 and config.eos_token_id < 256
    assert model.lm_head.weight is model.transformer.wte.weight
    mistral = make_config("mistral-7b", layers=2, hidden=64, heads=4, kv_heads=2, vocab=256)
    assert (mistral.num_hidden_layers, mistral.num_key_value_heads, mistral.tie_word_embeddings) == (2, 2, False)


def test_same_seed_same_weights():
    a, b = (build_model("mistral-7b", seed=3, layers=1, hidden=32, vocab=64, heads=2, intermediate=64)
            for _ in range(2))
    assert all((p == q).all() for p, q in zip(a.parameters(), b.parameters(), strict=False))


@pytest.mark.parametrize("name, overrides, message", [
    ("gpt-5", {}, "unknown architecture 'gpt-5'"),
    ("./no-such-folder", {}, "does not exist or has no config.json"),
    ("tinystories-33m", dict(hidden=65), "not divisible by 16 heads"),
    ("tinystories-33m", dict(layers=0), "must be a positive integer"),
    ("tinystories-33m", dict(depth=2), "unknown override 'depth'"),
])
def test_bad_names_and_overrides_are_value_errors(name, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_config(name, **overrides)
    if not overrides:
        with pytest.raises(UnknownArchitecture):
            build_model(name)
