"""The program's own model at the target's sizes: its builder runs as written, and every
`transformers` model it makes gets the target's sizes put into its own config.

A projection is worth what the model it runs on is worth. A stand-in architecture differs from
the program's model in what decides memory besides the sizes: the attention implementation
(eager attention's fp32 softmax of a heads x sequence x sequence score matrix is not sdpa's),
tied embeddings, dtype, cache, and what the builder does besides building (`.to(device)`,
`model.hf_device_map`, hooks, attributes). So the builder runs, and while it runs

- `PreTrainedModel.__init__` sets the target's sizes (hidden, layers, heads, key/value heads,
  intermediate, vocabulary, positions) on the config it is given, before the model's own
  `__init__` reads them; every other setting stays the program's;
- `from_pretrained` builds from the checkpoint's config (resized) with the call's own dtype,
  attention implementation and device map, without reading weights: the target's weights are
  random (fake under a traced run), in eval mode as `from_pretrained` leaves them.

    with AtTargetSizes(target_sizes(TargetModel("mistral-7b"))) as sizes:
        model = get_llm(args.model)        # the program's function, unchanged
    sizes.resized                          # the configs it resized: what the projection ran on

A model that is not a `transformers` model has no config to resize: `resized` stays empty and
the caller says so (auditor.capture.tracing.model_from builds a stand-in and says that it did).
"""
from __future__ import annotations

import functools
import itertools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import os

    from transformers import PreTrainedModel

# The sizes a config may carry, in transformers' standard names (each config maps them to its
# own fields through its attribute_map: GPT-2's n_embd, GPT-Neo's num_layers).
SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
         "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings")
WORDS = {"hidden_size": "hidden", "num_hidden_layers": "layers", "num_attention_heads": "heads",
         "num_key_value_heads": "key/value heads", "head_dim": "head dim",
         "intermediate_size": "intermediate", "vocab_size": "vocabulary",
         "max_position_embeddings": "positions"}


def target_sizes(target) -> dict[str, int]:
    """The target's sizes (a TargetModel: an architecture name or checkpoint folder with size
    overrides) in standard names; key/value heads, head dim and intermediate filled in where its
    family leaves them implicit."""
    import architectures
    config = architectures.make_config(target.architecture, **target.overrides)
    sizes = {name: value for name in SIZES
             if isinstance(value := getattr(config, name, None), int) and not isinstance(value, bool)}
    hidden, heads = sizes["hidden_size"], sizes["num_attention_heads"]
    sizes.setdefault("num_key_value_heads", heads)
    sizes.setdefault("head_dim", hidden // heads)
    sizes.setdefault("intermediate_size", 4 * hidden)  # GPT-Neo's and GPT-2's default
    return sizes


def describe_sizes(sizes: dict[str, int]) -> str:
    return ", ".join(f"{WORDS[name]} {value:,}" for name, value in sizes.items())


def resize(config, sizes: dict[str, int]) -> dict[str, int]:
    """Puts `sizes` into `config` in place (only the sizes it has); returns what it set."""
    layers_before = getattr(config, "num_hidden_layers", None)
    applied: dict[str, int] = {}
    for name, value in sizes.items():
        if not _has(config, name):
            continue
        setattr(config, name, value)
        applied[name] = value
    layers = applied.get("num_hidden_layers")
    if isinstance(layers, int) and isinstance(layers_before, int) and layers != layers_before:
        _relength_per_layer_lists(config, layers_before, layers)
    return applied


def _has(config, name: str) -> bool:
    """Whether the config has the size at all: a field of its own, or one its attribute_map
    names. head_dim and intermediate_size are only set where the config already had them."""
    mapped = getattr(config, "attribute_map", {}).get(name, name)
    return mapped in vars(config)


def _relength_per_layer_lists(config, before: int, after: int) -> None:
    """Per-layer settings (GPT-Neo's attention_layers, newer configs' layer_types) follow the
    number of layers, their pattern repeated; GPT-Neo's compact attention_types with them."""
    for key, value in list(vars(config).items()):
        if isinstance(value, list) and len(value) == before and key != "attention_types":
            setattr(config, key, list(itertools.islice(itertools.cycle(value), after)))
    if isinstance(getattr(config, "attention_layers", None), list) and hasattr(config, "attention_types"):
        config.attention_types = [[[kind], 1] for kind in config.attention_layers]


class AtTargetSizes:
    """While open, each transformers model built gets `sizes` in its config, and
    `from_pretrained` builds from the resized config without reading weights."""

    def __init__(self, sizes: dict[str, int]):
        self.sizes = sizes
        self.resized: list[dict[str, Any]] = []  # per config resized: its class and what was set
        self._done: set[int] = set()
        self._restore: list = []

    def __enter__(self) -> AtTargetSizes:
        from transformers import PreTrainedModel
        init = PreTrainedModel.__dict__["__init__"]
        from_pretrained = PreTrainedModel.__dict__["from_pretrained"]
        self._restore = [(PreTrainedModel, "__init__", init),
                         (PreTrainedModel, "from_pretrained", from_pretrained)]
        PreTrainedModel.__init__ = self._init(init)  # type: ignore[method-assign]
        PreTrainedModel.from_pretrained = classmethod(self.from_pretrained)  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore = []

    def _init(self, init):
        @functools.wraps(init)
        def resized_init(model, config, *args, **kwargs):
            if id(config) not in self._done and hasattr(config, "to_dict"):
                self._done.add(id(config))
                applied = resize(config, self.sizes)
                self.resized.append({"class": type(model).__qualname__,
                                     "config": type(config).__qualname__, "sizes": applied})
            init(model, config, *args, **kwargs)
        return resized_init

    def from_pretrained(self, cls: type[PreTrainedModel], name_or_path: str | os.PathLike[str] | None = None,
                        *model_args: object, **kwargs: Any) -> PreTrainedModel:
        """The checkpoint's model class built from its config at the target's sizes, as
        from_pretrained would return it (dtype, attention, device map, eval mode), weights
        random: a 7B checkpoint's weights are neither needed nor read."""
        import torch
        from transformers import AutoConfig, PretrainedConfig
        config = kwargs.get("config")
        if not isinstance(config, PretrainedConfig):
            source = config or name_or_path
            if source is None:  # transformers would look for a checkpoint named "None" on the hub
                raise ValueError("from_pretrained needs a checkpoint name or folder, or config=")
            options = {k: kwargs[k] for k in ("revision", "trust_remote_code", "cache_dir",
                                              "local_files_only", "token") if k in kwargs}
            config = AutoConfig.from_pretrained(source, **options)
        dtype = kwargs.get("dtype", kwargs.get("torch_dtype", "auto"))
        if dtype in (None, "auto"):
            dtype = getattr(config, "dtype", None) or torch.float32
        build: dict[str, Any] = {"dtype": getattr(torch, dtype) if isinstance(dtype, str) else dtype}
        if kwargs.get("attn_implementation") is not None:
            build["attn_implementation"] = kwargs["attn_implementation"]
        model = cls._from_config(config, **build)
        device_map = kwargs.get("device_map")
        if device_map is not None:
            model.hf_device_map = _placed(model, device_map)
        return model.eval()


def _placed(model, device_map) -> dict:
    """Where from_pretrained would have put the model, as its `hf_device_map` says: one device
    for all of it (a dict of several is kept as given; an "auto" map is the first device)."""
    import torch
    if isinstance(device_map, dict):
        return dict(device_map)
    device = device_map
    if device_map in ("auto", "balanced", "sequential", "balanced_low_0"):
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    elif isinstance(device_map, int):
        device = f"cuda:{device_map}"
    model.to(device)
    return {"": str(device)}
