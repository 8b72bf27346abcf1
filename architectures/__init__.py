"""Named model architectures built from `transformers` config classes, with random weights.

Nothing is downloaded: the architecture (not the weights) decides memory, so each name maps
to a config with the published shapes, and weights come from a seeded random init. A local
checkpoint folder (anything `from_pretrained` accepts on a path) works wherever a name does.

    config = make_config("mistral-7b")                  # published shapes
    config = make_config("mistral-7b", layers=2, hidden=256, vocab=1000)   # scaled-down member
    model = build_model("tinystories-33m", seed=0)
    n = count_parameters("mistral-7b")                  # meta device: allocates nothing
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch


class UnknownArchitecture(ValueError):
    """An architecture name that is neither known nor an existing checkpoint folder."""


@dataclass(frozen=True)
class Architecture:
    name: str
    family: str  # "gpt_neo" | "mistral" | "llama"
    settings: dict[str, Any] = field(default_factory=dict)
    note: str = ""


def _gpt_neo(name: str, hidden: int, layers: int, heads: int, note: str) -> Architecture:
    return Architecture(name, "gpt_neo", dict(
        vocab_size=50257, max_position_embeddings=2048, hidden_size=hidden, num_layers=layers,
        num_heads=heads, window_size=256, attention_types=_alternating(layers),
    ), note)


def _alternating(layers: int) -> list:
    """GPT-Neo's alternating global/local attention pattern for any number of layers."""
    types: list = [[["global", "local"], layers // 2]] if layers >= 2 else []
    if layers % 2:
        types.append([["global"], 1])
    return types


ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in [
    _gpt_neo("tinystories-33m", 768, 4, 16, "TinyStories-33M (GPT-Neo), 68,514,048 parameters"),
    _gpt_neo("gpt-neo-125m", 768, 12, 12, "GPT-Neo 125M"),
    _gpt_neo("gpt-neo-1.3b", 2048, 24, 16, "GPT-Neo 1.3B"),
    Architecture("mistral-7b", "mistral", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
        sliding_window=4096, rope_theta=10000.0, tie_word_embeddings=False,
    ), "Mistral-7B-v0.1, 7,241,732,096 parameters"),
    Architecture("llama-2-7b", "llama", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
        tie_word_embeddings=False,
    ), "Llama-2-7B, 6,738,415,616 parameters"),
]}

# Scaled-down members: override names in the user's words -> each family's config field.
_OVERRIDE_FIELDS = {
    "gpt_neo": dict(layers="num_layers", hidden="hidden_size", vocab="vocab_size", heads="num_heads",
                    intermediate="intermediate_size", max_positions="max_position_embeddings"),
    "mistral": dict(layers="num_hidden_layers", hidden="hidden_size", vocab="vocab_size",
                    heads="num_attention_heads", kv_heads="num_key_value_heads",
                    intermediate="intermediate_size", max_positions="max_position_embeddings"),
}
_OVERRIDE_FIELDS["llama"] = _OVERRIDE_FIELDS["mistral"]


def known_names() -> list[str]:
    return sorted(ARCHITECTURES)


def is_checkpoint_folder(name_or_path: str) -> bool:
    return os.path.isdir(name_or_path) and os.path.isfile(os.path.join(name_or_path, "config.json"))


def make_config(name_or_path: str, **overrides: int):
    """The `transformers` config for a named architecture or a local checkpoint folder."""
    if is_checkpoint_folder(name_or_path):
        from transformers import AutoConfig
        config = AutoConfig.from_pretrained(name_or_path)
        family = config.model_type
    else:
        arch = _lookup(name_or_path)
        family = arch.family
        config = _config_class(family)(**_apply_overrides(arch, overrides))
        overrides = {}
    if overrides:
        for key, value in overrides.items():
            setattr(config, _override_field(family, key), value)
    return config


def _lookup(name: str) -> Architecture:
    if name in ARCHITECTURES:
        return ARCHITECTURES[name]
    if os.path.sep in name or name.startswith("."):
        raise UnknownArchitecture(f"checkpoint folder {name!r} does not exist or has no config.json")
    raise UnknownArchitecture(f"unknown architecture {name!r}; known: {', '.join(known_names())} "
                              "(or a local checkpoint folder)")


def _override_field(family: str, key: str) -> str:
    fields = _OVERRIDE_FIELDS.get(family, _OVERRIDE_FIELDS["mistral"])
    if key not in fields:
        raise ValueError(f"unknown override {key!r} for {family}; known: {', '.join(sorted(fields))}")
    return fields[key]


def _apply_overrides(arch: Architecture, overrides: dict[str, int]) -> dict[str, Any]:
    settings = dict(arch.settings)
    for key, value in overrides.items():
        if value is None:
            continue
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"override {key}={value!r} must be a positive integer")
        settings[_override_field(arch.family, key)] = value
    if arch.family == "gpt_neo":
        settings["attention_types"] = _alternating(settings["num_layers"])
        heads = settings["num_heads"]
    else:
        heads = settings["num_attention_heads"]
        settings["num_key_value_heads"] = min(settings["num_key_value_heads"], heads)
        if heads % settings["num_key_value_heads"]:
            raise ValueError(f"{heads} attention heads are not a multiple of "
                             f"{settings['num_key_value_heads']} key/value heads")
    if settings["hidden_size"] % heads:
        raise ValueError(f"hidden size {settings['hidden_size']} is not divisible by {heads} heads")
    _keep_special_tokens_in_vocab(arch.family, settings)
    return settings


def _keep_special_tokens_in_vocab(family: str, settings: dict[str, Any]) -> None:
    """A shrunk vocabulary must still hold the special token ids (GPT-Neo's are 50256).

    Without this, transformers warns that the config is invalid and generation would index out
    of range; the last id of the smaller vocabulary stands in for them.
    """
    defaults = _config_class(family)()
    last = settings["vocab_size"] - 1
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        token = settings.get(key, getattr(defaults, key, None))
        if isinstance(token, int) and token > last:
            settings[key] = last


def _config_class(family: str):
    from transformers import GPTNeoConfig, LlamaConfig, MistralConfig
    return {"gpt_neo": GPTNeoConfig, "mistral": MistralConfig, "llama": LlamaConfig}[family]


def build_model(name_or_path: str, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu", attn_implementation: str = "eager",
                **overrides: int) -> torch.nn.Module:
    """A causal LM: random weights from `seed` for a name, real weights for a checkpoint folder.

    Eager attention by default: its saved activations are what the memory figures describe,
    and its results are deterministic on CPU.
    """
    from transformers import AutoModelForCausalLM
    if is_checkpoint_folder(name_or_path) and _has_weights(name_or_path) and not overrides:
        model = AutoModelForCausalLM.from_pretrained(
            name_or_path, dtype=dtype, attn_implementation=attn_implementation)
        return model.to(device)
    config = make_config(name_or_path, **overrides)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def _has_weights(folder: str) -> bool:
    return any(f.endswith((".safetensors", ".bin")) for f in os.listdir(folder))


def count_parameters(name_or_path: str, **overrides: int) -> int:
    """Parameter count (tied weights once) without allocating: the model is built on `meta`."""
    return sum(parameter_sizes(name_or_path, **overrides))


def parameter_sizes(name_or_path: str, **overrides: int) -> list[int]:
    """Elements of each parameter tensor (tied weights once), from the config on `meta`."""
    from transformers import AutoModelForCausalLM
    config = make_config(name_or_path, **overrides)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return [p.numel() for p in model.parameters()]
