"""The activation-size calculator against what autograd really saves, byte for byte.

`measure_saved` runs the real training forward of a tiny model under `saved_tensors_hooks` and
sorts every saved storage (counted once) into the calculator's groups: activations, autocast
weight copies, referenced module buffers; parameters are skipped. Each storage belongs to the
decoder layer running when it is first saved, except tensors handed to every layer as arguments
(rotary cos/sin, the mask), which belong to none and count outside.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from architectures import build_model, make_config
from architectures.activation_size import PRECISIONS, residual_stream, saved_per_layer, saved_total

TINY = {
    "gpt_neo": ("tinystories-33m", dict(layers=2, hidden=64, heads=4, vocab=512)),
    "mistral": ("mistral-7b", dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=512)),
    "llama": ("llama-2-7b", dict(layers=2, hidden=64, heads=4, intermediate=128, vocab=512)),  # no GQA
}
BATCH = 2
SEQS = (24, 300)  # 300 > GPT-Neo's local window (256)
# precision -> (dtype the model is built in, autocast dtype or None)
DTYPES = {"fp32": (torch.float32, None), "amp-bf16": (torch.float32, torch.bfloat16),
          "amp-fp16": (torch.float32, torch.float16), "bf16": (torch.bfloat16, None),
          "fp16": (torch.float16, None)}


def _layers(model):
    return model.transformer.h if model.config.model_type == "gpt_neo" else model.model.layers


def _is_weight_copy(t: torch.Tensor, params: set[int]) -> bool:
    """A saved view of an autocast weight cast: ToCopyBackward0 fed by a parameter's AccumulateGrad."""
    base = t._base if t._base is not None else t
    fn = base.grad_fn
    return (type(fn).__name__ == "ToCopyBackward0"
            and any(id(getattr(nxt, "variable", None)) in params for nxt, _ in fn.next_functions))


def measure_saved(model, ids: torch.Tensor, autocast_dtype: torch.dtype | None = None) -> dict:
    """Bytes saved for backward by `model(input_ids=ids, labels=ids).loss`, by place and group.

    Returns {"layers": [Counter(group -> bytes), ...], "outside": Counter}; groups are
    "activations", "weight copies" and "buffers".
    """
    model.train()
    params = {id(p) for p in model.parameters()}
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    buffer_storages = {b.untyped_storage().data_ptr() for b in model.buffers()}
    layers = [Counter() for _ in _layers(model)]
    outside, shared, seen = Counter(), set(), {}
    where = [outside]

    def enter(i):
        def hook(module, args, kwargs):
            where[0] = layers[i]
            arguments = list(args[1:]) + [v for k, v in kwargs.items() if k != "hidden_states"]
            for value in arguments:
                for t in value if isinstance(value, (tuple, list)) else [value]:
                    if isinstance(t, torch.Tensor):
                        shared.add(t.untyped_storage().data_ptr())
        return hook

    def leave(module, args, output):
        where[0] = outside

    def pack(t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in seen or key in param_storages:
            return t
        seen[key] = None  # the graph keeps every saved storage alive: no address is reused
        group = ("buffers" if key in buffer_storages else
                 "weight copies" if _is_weight_copy(t, params) else "activations")
        (outside if key in shared else where[0])[group] += storage.nbytes()
        return t.detach()  # t itself would tie the graph into a cycle gc cannot free

    handles = [layer.register_forward_pre_hook(enter(i), with_kwargs=True)
               for i, layer in enumerate(_layers(model))]
    handles += [layer.register_forward_hook(leave) for layer in _layers(model)]
    autocast = torch.autocast("cpu", dtype=autocast_dtype, enabled=autocast_dtype is not None)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
            model(input_ids=ids, labels=ids)
    finally:
        for handle in handles:
            handle.remove()
    return {"layers": layers, "outside": outside}


@pytest.fixture(scope="module")
def models():
    """One tiny model per (family, precision), built on first use and shared by both lengths."""
    cache = {}

    def get(family, precision):
        if (family, precision) not in cache:
            name, overrides = TINY[family]
            cache[family, precision] = build_model(name, seed=0, dtype=DTYPES[precision][0], **overrides)
        return cache[family, precision]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield get
    torch.set_num_threads(threads)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("family", list(TINY))
def test_formula_matches_what_autograd_saves(models, family, precision):
    name, overrides = TINY[family]
    config = make_config(name, **overrides)
    model = models(family, precision)
    for seq in SEQS:
        ids = torch.randint(0, overrides["vocab"], (BATCH, seq), generator=torch.Generator().manual_seed(seq))
        measured = measure_saved(model, ids, DTYPES[precision][1])
        total = saved_total(config, BATCH, seq, precision)
        layer = total["per_layer"]
        for i, got in enumerate(measured["layers"]):
            assert got["activations"] == layer["total"], (family, precision, seq, i, got, layer["derivation"])
            assert got["weight copies"] == layer["weight_copies_total"], (family, precision, seq, i)
            assert got["buffers"] == layer["buffers_total"], (family, precision, seq, i)
        outside = measured["outside"]
        assert outside["activations"] == total["outside_total"], (family, precision, seq, outside)
        assert outside["weight copies"] == sum(t["bytes"] for t in total["outside_weight_copies"])
        assert outside["buffers"] == 0
        everything = sum((Counter(c) for c in [outside, *measured["layers"]]), Counter())
        assert everything["activations"] == total["total"]
        assert everything["weight copies"] == total["weight_copies_total"]


def test_autocast_weight_copies_are_reported_apart():
    config = make_config(*[TINY["mistral"][0]], **TINY["mistral"][1])
    amp = saved_per_layer(config, BATCH, 24, "amp-bf16")
    full = saved_per_layer(config, BATCH, 24, "fp32")
    # 2 bytes for each of the layer's weights, and none of it among the activations
    layer_weights = 64 * 64 * 2 + 2 * 32 * 64 + 3 * 64 * 128
    assert amp["weight_copies_total"] == 2 * layer_weights
    assert full["weight_copies"] == [] and full["weight_copies_total"] == 0
    assert not any("weight" in t["name"] for t in amp["terms"])
    assert "autocast weight copies (not activations)" in amp["derivation"]


def test_derivation_lists_every_term_and_the_sum():
    config = make_config(*[TINY["gpt_neo"][0]], **TINY["gpt_neo"][1])
    layer = saved_per_layer(config, BATCH, 24, "amp-bf16")
    for term in layer["terms"] + layer["weight_copies"] + layer["buffers"]:
        assert term["name"] in layer["derivation"]
    assert f"{layer['total']:,} B" in layer["derivation"]
    total = saved_total(config, BATCH, 24, "amp-bf16")
    assert f"2 x {layer['total']:,} B" in total["derivation"]
    assert f"activations {total['total']:,} B" in total["derivation"]


@pytest.mark.parametrize("precision, per", [("fp32", 4), ("amp-bf16", 4), ("amp-fp16", 4),
                                            ("bf16", 2), ("fp16", 2)])
def test_residual_stream_is_batch_seq_hidden_bytes(precision, per):
    config = make_config("tinystories-33m")
    got = residual_stream(config, 1, 128, precision)
    assert got["shape"] == [1, 128, 768] and got["bytes_per_element"] == per
    assert got["bytes"] == 1 * 128 * 768 * per
    if precision == "fp32":
        assert got["derivation"] == "1 x 128 x 768 x 4 B = 393,216 B (384.0 KiB)"


def test_unknown_family_or_precision_is_one_clear_error():
    from transformers import GPT2Config
    with pytest.raises(ValueError, match="unknown model family 'gpt2'"):
        saved_per_layer(GPT2Config(), 1, 8, "fp32")
    config = make_config("mistral-7b")
    with pytest.raises(ValueError, match="unknown precision 'int8'"):
        saved_total(config, 1, 8, "int8")
    assert set(PRECISIONS) == {"fp32", "amp-bf16", "amp-fp16", "bf16", "fp16"}
