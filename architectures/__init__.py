"""Named model architectures built from `transformers` config classes, with random weights.

Nothing is downloaded: the architecture (not the weights) decides memory, so each name maps
to a config with the published shapes, and weights come from a seeded random init. A local
checkpoint folder (anything `from_pretrained` accepts on a path) works wherever a name does.

    config = make_config("mistral-7b")                  # published shapes
    config = make_config("mistral-7b", layers=2, hidden=256, vocab=1000)   # scaled-down member
    model = build_model("tinystories-33m", seed=0)
    n = count_parameters("mistral-7b")                  # meta device: allocates nothing
    max_positions("tinystories-33m")                    # 2048, read without torch or transformers

Checking a name, a folder or an override (`config_fields`, `max_positions`) imports neither torch
nor transformers, so a command line answers a mistake in milliseconds.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class UnknownArchitecture(ValueError):
    """An architecture that cannot be used: an unknown name, or a folder without a readable
    checkpoint config.json."""


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
    fields = config_fields(name_or_path, **overrides)  # every mistake found here, without torch
    if not is_checkpoint_folder(name_or_path):
        family = _lookup(name_or_path).family
        _keep_special_tokens_in_vocab(family, fields)
        return _config_class(family)(**fields)
    config = _load_checkpoint_config(name_or_path)
    for key, value in overrides.items():
        setattr(config, _override_field(config.model_type, key), value)
    return config


def config_fields(name_or_path: str, **overrides: int) -> dict[str, Any]:
    """The config's fields with the overrides applied, checked without torch or transformers: a
    named architecture's published shapes, or a checkpoint folder's config.json. ValueError (one
    line) for an unknown name, a folder without a usable config.json, or a wrong override."""
    if not is_checkpoint_folder(name_or_path):
        return _apply_overrides(_lookup(name_or_path), overrides)
    fields = _read_checkpoint_config(name_or_path)
    for key, value in overrides.items():
        if value is None:
            continue
        _check_override(key, value)
        fields[_override_field(fields["model_type"], key)] = value
    if fields["model_type"] in _OVERRIDE_FIELDS:
        _check_heads(fields)
    return fields


def max_positions(name_or_path: str, **overrides: int) -> int | None:
    """The longest sequence the model has positions for (None if its config does not say)."""
    fields = config_fields(name_or_path, **overrides)
    # GPT-2-style configs name it n_positions (or n_ctx); transformers maps both to this field.
    limits = [fields.get(key) for key in ("max_position_embeddings", "n_positions", "n_ctx")]
    return next((n for n in limits if isinstance(n, int) and not isinstance(n, bool)), None)


def _read_checkpoint_config(folder: str) -> dict[str, Any]:
    where = f"checkpoint folder {folder!r}"
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as file:
            fields = json.load(file)
    except json.JSONDecodeError as error:
        raise UnknownArchitecture(f"{where}: config.json is not JSON ({error.msg} at line {error.lineno}, "
                                  f"column {error.colno})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UnknownArchitecture(f"{where}: cannot read config.json "
                                  f"({getattr(error, 'strerror', None) or error})") from None
    if not isinstance(fields, dict):
        raise UnknownArchitecture(f"{where}: config.json holds no JSON object")
    model_type = fields.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise UnknownArchitecture(f"{where}: config.json names no model_type (e.g. \"gpt_neo\", \"llama\")")
    known = _transformers_model_types()
    if known is not None and model_type not in known:
        raise UnknownArchitecture(f"{where}: config.json's model_type {model_type!r} is not a model "
                                  "the installed transformers knows")
    for key in _OVERRIDE_FIELDS.get(model_type, {}).values():  # the sizes the memory follows
        value = fields.get(key)  # null: the family's default (GPT-Neo's intermediate_size: 4 x hidden)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UnknownArchitecture(f"{where}: config.json's {key} must be a positive integer, got {value!r}")
    return fields


def _load_checkpoint_config(folder: str):
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(folder)
    except Exception as error:  # what config_fields could not see; transformers has its own error types
        reason = " ".join(str(error).split())[:300]
        raise UnknownArchitecture(f"checkpoint folder {folder!r}: transformers cannot load its "
                                  f"config.json ({reason})") from None


@functools.cache
def _transformers_model_types() -> frozenset[str] | None:
    """The model types the installed transformers knows, read from its files without importing it
    (its config classes import torch: seconds). None when it keeps no generated table (older
    versions): then loading the config decides, later and slower, still before any work."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    models = os.path.join(spec.submodule_search_locations[0], "models")
    try:
        with open(os.path.join(models, "auto", "auto_mappings.py"), encoding="utf-8") as file:
            tree = ast.parse(file.read())
        table = next(node.value.args[0] for node in tree.body
                     if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                     and any(getattr(t, "id", None) == "CONFIG_MAPPING_NAMES" for t in node.targets))
        names = {name for name, _ in ast.literal_eval(table)}
    except (OSError, SyntaxError, ValueError, StopIteration, AttributeError, IndexError, TypeError):
        return None
    # A few types are added in code rather than in the table; each lives in its model's folder.
    folders = {entry.name for entry in os.scandir(models) if entry.is_dir()}
    return frozenset(names) | frozenset(folders) | frozenset(f.replace("_", "-") for f in folders)


def _lookup(name: str) -> Architecture:
    if name in ARCHITECTURES:
        return ARCHITECTURES[name]
    if os.path.isdir(name):
        raise UnknownArchitecture(f"folder {name!r} has no config.json; a checkpoint folder holds one "
                                  "(save_pretrained writes it)")
    if os.path.sep in name or name.startswith("."):
        raise UnknownArchitecture(f"checkpoint folder {name!r} does not exist or has no config.json")
    raise UnknownArchitecture(f"unknown architecture {name!r}; known: {', '.join(known_names())} "
                              "(or a local checkpoint folder)")


def _override_field(family: str, key: str) -> str:
    fields = _OVERRIDE_FIELDS.get(family, _OVERRIDE_FIELDS["mistral"])
    if key not in fields:
        raise ValueError(f"unknown override {key!r} for {family}; known: {', '.join(sorted(fields))}")
    return fields[key]


def _check_override(key: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"override {key}={value!r} must be a positive integer")


def _apply_overrides(arch: Architecture, overrides: dict[str, int]) -> dict[str, Any]:
    settings = dict(arch.settings)
    for key, value in overrides.items():
        if value is None:
            continue
        _check_override(key, value)
        settings[_override_field(arch.family, key)] = value
    if arch.family == "gpt_neo":
        settings["attention_types"] = _alternating(settings["num_layers"])
    else:
        settings["num_key_value_heads"] = min(settings["num_key_value_heads"], settings["num_attention_heads"])
    _check_heads(settings)
    return settings


def _check_heads(settings: dict[str, Any]) -> None:
    """Heads that divide the hidden size, key/value heads that divide the heads (where named)."""
    heads = settings.get("num_heads", settings.get("num_attention_heads"))
    kv_heads, hidden = settings.get("num_key_value_heads"), settings.get("hidden_size")
    if not isinstance(heads, int) or heads < 1:
        return
    if isinstance(kv_heads, int) and kv_heads >= 1 and heads % kv_heads:
        raise ValueError(f"{heads} attention heads are not a multiple of {kv_heads} key/value heads")
    if isinstance(hidden, int) and hidden % heads:
        raise ValueError(f"hidden size {hidden} is not divisible by {heads} heads")


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


def build_model(name_or_path: str, *, seed: int = 0, dtype: torch.dtype | None = None,
                device: str | torch.device = "cpu", attn_implementation: str = "eager",
                **overrides: int) -> torch.nn.Module:
    """A causal LM: random weights from `seed` for a name, real weights for a checkpoint folder.
    `dtype` defaults to float32.

    Eager attention by default: its saved activations are what the memory figures describe,
    and its results are deterministic on CPU.
    """
    import torch
    from transformers import AutoModelForCausalLM
    dtype = torch.float32 if dtype is None else dtype
    if is_checkpoint_folder(name_or_path) and _has_weights(name_or_path) and not overrides:
        model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
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
    import torch
    from transformers import AutoModelForCausalLM
    config = make_config(name_or_path, **overrides)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return [p.numel() for p in model.parameters()]
