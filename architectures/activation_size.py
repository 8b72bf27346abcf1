"""Activation size: what one training step saves for backward, from the `transformers` config alone.

Pure arithmetic (no torch, no model): each decoder layer of GPT-Neo, Mistral and Llama (transformers
5.x, eager attention, no dropout) is written out tensor by tensor as autograd saves it for
`loss = model(input_ids=ids, labels=ids).loss`, and `tests/test_activation_size.py` checks every
total byte for byte against a `saved_tensors_hooks` measurement of the real model.

    residual_stream(config, batch, seq, precision)    one b x s x h tensor of the residual stream
    saved_per_layer(config, batch, seq, precision)    one decoder layer, term by term
    saved_total(config, batch, seq, precision)        layers x per layer + what is saved outside them

Precisions: `fp32`; `amp-bf16`/`amp-fp16` (fp32 weights, forward under torch.autocast);
`bf16`/`fp16` (the whole model in that dtype, no autocast). What is saved, and in which dtype:

    compute dtype   linear/matmul outputs: fp32, the autocast dtype, or the model dtype
    residual dtype  the residual stream and norm outputs: the weights' dtype (fp32 under autocast,
                    where an fp32 residual plus a half-precision branch promotes to fp32)
    autocast        casts each fp32 input again for every linear that reads it (q, k and v save three
                    copies of one norm output), and saves half-precision copies of the weights

Three groups, kept apart because only the first is new memory per token:

    terms           activations: grow with batch x seq, freed by backward
    weight_copies   autocast's cached half-precision copies of the weights (per layer, and lm_head):
                    grow with parameters, not tokens, and exist only under amp-*
    buffers         module buffers autograd keeps a reference to (GPT-Neo's max_positions^2 bool
                    causal mask, per layer): resident with the model anyway, so never counted

`device_type="cuda"` applies the two CUDA rules that change a dtype here (LayerNorm keeps its
statistics in float32; autocast runs `pow` in float32, which reshapes GPT-Neo's GELU under amp-*);
they come from PyTorch's CUDA kernels and autocast op lists and are not measured by the CPU tests.

Rotary cos/sin are computed once and saved by every layer: they are counted once, outside. The
float logits returned in the model's output are not saved for backward, so they are not here.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from auditor.facts.units import size

# Every precision a training step can run in: (the weights' dtype, the autocast dtype or None),
# by torch's dtype names. The one list: the train-step job and its command line read it here.
PRECISIONS = {
    "fp32": ("float32", None),
    "amp-bf16": ("float32", "bfloat16"),
    "amp-fp16": ("float32", "float16"),
    "bf16": ("bfloat16", None),
    "fp16": ("float16", None),
}
FAMILIES = ("gpt_neo", "mistral", "llama")
DEVICE_TYPES = ("cpu", "cuda")
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "bool": 1}
_HALF = {"bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class _Run:
    """The shapes and dtypes that decide every saved tensor."""
    family: str
    b: int
    s: int
    h: int
    heads: int
    kv_heads: int
    head_dim: int
    inner: int
    vocab: int
    layers: int
    max_positions: int
    compute: str
    residual: str
    amp: bool
    device_type: str


def _run(config, batch: int, seq: int, precision: str, device_type: str) -> _Run:
    family = getattr(config, "model_type", None)
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(FAMILIES)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    if device_type not in DEVICE_TYPES:
        raise ValueError(f"unknown device type {device_type!r}; known: {', '.join(DEVICE_TYPES)}")
    _check_modelled(config, family)
    amp = precision.startswith("amp-")
    half = _HALF.get(precision.removeprefix("amp-"), "float32")
    h = config.hidden_size
    if family == "gpt_neo":
        heads, kv_heads, layers = config.num_heads, config.num_heads, config.num_layers
        head_dim, inner = h // heads, config.intermediate_size or 4 * h
    else:
        heads, kv_heads, layers = (config.num_attention_heads, config.num_key_value_heads,
                                   config.num_hidden_layers)
        head_dim, inner = getattr(config, "head_dim", None) or h // heads, config.intermediate_size
    return _Run(family, batch, seq, h, heads, kv_heads, head_dim, inner, config.vocab_size, layers,
                config.max_position_embeddings, compute=half,
                residual="float32" if amp else half, amp=amp, device_type=device_type)


def _check_modelled(config, family: str) -> None:
    """Refuse configs whose saved tensors differ from the ones written out below."""
    act, expected = ((config.activation_function, "gelu_new") if family == "gpt_neo"
                     else (config.hidden_act, "silu"))
    if act != expected:
        raise ValueError(f"{family} activation {act!r} is not modelled (only {expected!r})")
    dropouts = ("embed_dropout", "attention_dropout", "resid_dropout")
    if any(getattr(config, name, 0) for name in dropouts):
        raise ValueError(f"{family} config has dropout > 0 (dropout masks are not modelled); set "
                         f"{', '.join(dropouts)} to 0")


def _term(name: str, shape: list[int], dtype: str) -> dict:
    return {"name": name, "shape": list(shape), "dtype": dtype, "bytes": prod(shape) * BYTES[dtype]}


# ---- pieces shared by the families ------------------------------------------------------------

def _linear_inputs(r: _Run, names: list[str], shape: list[int]) -> list[dict]:
    """An fp32 tensor read by several linears: once without autocast, one cast per linear with it."""
    if r.amp and r.residual != r.compute:
        return [_term(f"{n} input (autocast copy)", shape, r.compute) for n in names]
    return [_term(f"{'/'.join(names)} input", shape, r.residual)]


def _layer_norm(r: _Run, name: str) -> list[dict]:
    # LayerNorm keeps mean and rstd in its input dtype on CPU, in float32 on CUDA (accumulate type).
    stats = r.residual if r.device_type == "cpu" else "float32"
    bs = [r.b, r.s, 1]
    return [_term(f"{name} input", [r.b, r.s, r.h], r.residual),
            _term(f"{name} mean", bs, stats), _term(f"{name} rstd", bs, stats)]


def _rms_norm(r: _Run, name: str) -> list[dict]:
    # RMSNorm upcasts to float32 first: its input is saved in float32 whatever the model dtype,
    # and the normalised tensor is saved again after the cast back (before the weight multiply).
    return [_term(f"{name} input (float32)", [r.b, r.s, r.h], "float32"),
            _term(f"{name} rsqrt", [r.b, r.s, 1], "float32"),
            _term(f"{name} normalised", [r.b, r.s, r.h], r.residual)]


def _attention(r: _Run, qk_dtype: str, qk_note: str) -> list[dict]:
    heads = [r.b, r.heads, r.s, r.head_dim]
    scores = [r.b, r.heads, r.s, r.s]
    terms = [_term(f"query {qk_note}", heads, qk_dtype), _term(f"key {qk_note}", heads, qk_dtype),
             _term("attention probabilities (softmax, float32)", scores, "float32")]
    if r.compute != "float32":  # P @ V runs in the compute dtype: a second copy of the probabilities
        terms.append(_term(f"attention probabilities ({r.compute} copy for P @ V)", scores, r.compute))
    return terms + [_term("value (contiguous copy for P @ V)", heads, r.compute)]


def _loss(r: _Run) -> list[dict]:
    # ForCausalLMLoss upcasts the logits to float32; log_softmax saves its float32 result.
    tokens = r.b * r.s
    return [_term("log-probabilities (float32)", [tokens, r.vocab], "float32"),
            _term("loss targets", [tokens], "int64"),
            _term("loss total weight", [], "float32")]


def _weight_copies(r: _Run, weights: list[tuple[str, list[int]]]) -> list[dict]:
    return [_term(f"{name} weight", shape, r.compute) for name, shape in weights] if r.amp else []


# ---- the families -----------------------------------------------------------------------------

def _gpt_neo_layer(r: _Run) -> tuple[list[dict], list[tuple], list[dict]]:
    hs, fs = [r.b, r.s, r.h], [r.b, r.s, r.inner]
    # _attn upcasts query and key to float32; under autocast the matmul casts them back down.
    qk = r.compute if r.amp else "float32"
    # NewGELU: 0.5*x*(1+tanh(c*(x+0.044715*x^3))). CUDA autocast runs pow in float32, so on CUDA
    # x, tanh and 1+tanh are float32 tensors (the product is cast down again for c_proj).
    gelu = "float32" if r.amp and r.device_type == "cuda" else r.compute
    terms = [*_layer_norm(r, "ln_1"), *_linear_inputs(r, ["q_proj", "k_proj", "v_proj"], hs),
             *_attention(r, qk, "(upcast for QK^T)" if qk == "float32" else "(for QK^T)"),
             _term("out_proj input", hs, r.compute),
             *_layer_norm(r, "ln_2"), *_linear_inputs(r, ["c_fc"], hs),
             _term("gelu input (c_fc output)", fs, gelu), _term("gelu 0.5*x", fs, r.compute),
             _term("gelu tanh", fs, gelu), _term("gelu 1+tanh", fs, gelu),
             _term("c_proj input", fs, r.compute)]
    weights = [(n, [r.h, r.h]) for n in ("q_proj", "k_proj", "v_proj", "out_proj")]
    weights += [("c_fc", [r.inner, r.h]), ("c_proj", [r.h, r.inner])]
    # torch.where keeps a view of the layer's causal-mask buffer: the whole buffer, already resident.
    buffers = [_term("attn.bias causal-mask buffer", [1, 1, r.max_positions, r.max_positions], "bool")]
    return terms, weights, buffers


def _rope_layer(r: _Run) -> tuple[list[dict], list[tuple], list[dict]]:
    """Mistral and Llama: the same decoder layer (Mistral's sliding window is only a mask)."""
    hs, fs = [r.b, r.s, r.h], [r.b, r.s, r.inner]
    q_out, kv_out = r.heads * r.head_dim, r.kv_heads * r.head_dim
    terms = [*_rms_norm(r, "input_layernorm"), *_linear_inputs(r, ["q_proj", "k_proj", "v_proj"], hs),
             # key and value are repeated to every query head (GQA) before the matmuls save them
             *_attention(r, r.compute, "(rotated, all heads)"),
             _term("o_proj input", [r.b, r.s, q_out], r.compute),
             *_rms_norm(r, "post_attention_layernorm"), *_linear_inputs(r, ["gate_proj", "up_proj"], hs),
             _term("gate_proj output (SiLU input)", fs, r.compute), _term("SiLU output", fs, r.compute),
             _term("up_proj output", fs, r.compute), _term("down_proj input", fs, r.compute)]
    weights = [("q_proj", [q_out, r.h]), ("k_proj", [kv_out, r.h]), ("v_proj", [kv_out, r.h]),
               ("o_proj", [r.h, q_out]), ("gate_proj", [r.inner, r.h]), ("up_proj", [r.inner, r.h]),
               ("down_proj", [r.h, r.inner])]
    return terms, weights, []


def _outside(r: _Run) -> list[dict]:
    ids = [_term("input ids (embedding)", [r.b, r.s], "int64")]
    if r.family == "gpt_neo":
        ids.append(_term("position ids (wpe)", [1, r.s], "int64"))
        norm = _layer_norm(r, "ln_f")
    else:
        rope = [1, r.s, r.head_dim]  # computed once in the residual dtype, saved by every layer
        ids += [_term("rotary cos (shared by every layer)", rope, r.residual),
                _term("rotary sin (shared by every layer)", rope, r.residual)]
        norm = _rms_norm(r, "norm")
    return ids + norm + _linear_inputs(r, ["lm_head"], [r.b, r.s, r.h]) + _loss(r)


# ---- the API ----------------------------------------------------------------------------------

def residual_stream(config, batch: int, seq: int, precision: str) -> dict:
    """One residual-stream activation tensor: batch x seq x hidden x bytes."""
    r = _run(config, batch, seq, precision, "cpu")
    shape, per = [r.b, r.s, r.h], BYTES[r.residual]
    n = prod(shape) * per
    return {"shape": shape, "bytes_per_element": per, "bytes": n,
            "derivation": f"{' x '.join(map(str, shape))} x {per} B = {n:,} B ({size(n)})"}


def saved_per_layer(config, batch: int, seq: int, precision: str, device_type: str = "cpu") -> dict:
    """What one decoder layer saves for backward, term by term."""
    r = _run(config, batch, seq, precision, device_type)
    terms, weights, buffers = (_gpt_neo_layer if r.family == "gpt_neo" else _rope_layer)(r)
    copies = _weight_copies(r, weights)
    result = {"family": r.family, "precision": precision, "device_type": device_type,
              "terms": terms, "total": _sum(terms),
              "weight_copies": copies, "weight_copies_total": _sum(copies),
              "buffers": buffers, "buffers_total": _sum(buffers)}
    title = (f"{r.family} decoder layer, batch {r.b} x seq {r.s}, {precision} on {device_type}: "
             "saved for backward")
    result["derivation"] = "\n".join([title, *_block("activations", terms),
                                      *_block("autocast weight copies (not activations)", copies),
                                      *_block("module buffers referenced (resident already, "
                                              "not counted)", buffers)])
    return result


def saved_total(config, batch: int, seq: int, precision: str, device_type: str = "cpu") -> dict:
    """layers x per-layer + what is saved outside the layers (embeddings, final norm, lm_head, the loss)."""
    r = _run(config, batch, seq, precision, device_type)
    layer = saved_per_layer(config, batch, seq, precision, device_type)
    outside = _outside(r)
    outside_copies = _weight_copies(r, [("lm_head", [r.vocab, r.h])])
    total = r.layers * layer["total"] + _sum(outside)
    copies = r.layers * layer["weight_copies_total"] + _sum(outside_copies)
    in_layers = r.layers * layer["total"]
    lines = [f"{r.family} training step, batch {r.b} x seq {r.s}, {precision} on {device_type}: "
             "saved for backward",
             f"  layers      {r.layers} x {layer['total']:,} B = {in_layers:,} B ({size(in_layers)})",
             *_block("outside the layers", outside),
             f"  activations {total:,} B ({size(total)})"]
    if layer["buffers_total"]:
        lines.append(f"  module buffers referenced (resident already, not counted) {r.layers} x "
                     f"{size(layer['buffers_total'])}")
    if copies:
        lines.append(f"  autocast weight copies (not activations) {r.layers} x "
                     f"{layer['weight_copies_total']:,} B + lm_head {_sum(outside_copies):,} B "
                     f"= {copies:,} B ({size(copies)})")
    return {"per_layer": layer, "layers": r.layers, "outside": outside, "outside_total": _sum(outside),
            "outside_weight_copies": outside_copies, "total": total, "weight_copies_total": copies,
            "buffers_total": r.layers * layer["buffers_total"], "derivation": "\n".join(lines)}


def _sum(terms: list[dict]) -> int:
    return sum(t["bytes"] for t in terms)


def _block(title: str, terms: list[dict]) -> list[str]:
    if not terms:
        return []
    rows = [f"    {t['name']:<50} {' x '.join(map(str, t['shape'])) or 'scalar':>18} "
            f"{t['dtype']:<8} {t['bytes']:>14,} B" for t in terms]
    total = _sum(terms)
    return [f"  {title}:", *rows, f"    {'= sum':<50} {'':>18} {'':<8} {total:>14,} B ({size(total)})"]
