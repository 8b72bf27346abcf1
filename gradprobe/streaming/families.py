"""How each transformers model family is run one piece at a time, as its own model forward runs it.

A causal LM is cut into stages: the embeddings, each decoder layer, and the head (final norm and
output projection). A family says which submodules make the embeddings and the head, where the
decoder layers are, and how to call them: what the model's own `forward` passes to each layer
(attention mask, position ids, rotary embeddings), computed the same way, so that a stage-by-stage
run gives the very numbers the whole model gives. Read against
transformers/models/{gpt_neo,mistral,llama}/modeling_*.py (`GPTNeoModel.forward`,
`MistralModel.forward`, `LlamaModel.forward`).
"""
from __future__ import annotations

import functools
import inspect

import torch


@functools.cache
def _no_cache(make_mask) -> dict:
    """No KV cache, in the keyword this transformers' mask function takes: `cache` from 5.24,
    `past_key_values` before (5.24 still takes it, with a deprecation warning each call)."""
    return {"cache" if "cache" in inspect.signature(make_mask).parameters else "past_key_values": None}


def _positions(hidden: torch.Tensor) -> torch.Tensor:
    """Position ids as the model makes them with no cache: 0..seq-1, one row shared by the batch."""
    return torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)


class GPTNeo:
    """GPT-Neo: token + learned position embeddings, alternating global/local attention, LayerNorm."""
    layers = "transformer.h"
    embeddings = ("transformer.wte", "transformer.wpe")
    head = ("transformer.ln_f", "lm_head")

    def __init__(self, config, meta_model):
        self.config = config

    def embed(self, modules: dict, ids: torch.Tensor) -> torch.Tensor:
        tokens = modules["transformer.wte"](ids)
        return tokens + modules["transformer.wpe"](_positions(tokens))

    def layer_inputs(self, hidden: torch.Tensor) -> dict:
        from transformers.masking_utils import create_causal_mask
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=None,
                                  position_ids=_positions(hidden), **_no_cache(create_causal_mask))
        return {"attention_mask": mask}

    def run_layer(self, layer: torch.nn.Module, hidden: torch.Tensor, inputs: dict) -> torch.Tensor:
        return layer(hidden, **inputs)[0]  # the block returns (hidden states, attention weights)

    def logits(self, modules: dict, hidden: torch.Tensor) -> torch.Tensor:
        return modules["lm_head"](modules["transformer.ln_f"](hidden))


class LlamaLike:
    """Mistral and Llama: token embeddings only, rotary positions, RMSNorm, optional sliding window."""
    layers = "model.layers"
    embeddings = ("model.embed_tokens",)
    head = ("model.norm", "lm_head")

    def __init__(self, config, meta_model):
        self.config = config
        with torch.device("cpu"):  # rotary frequencies are buffers computed at construction
            self.rotary = type(meta_model.model.rotary_emb)(config=config)

    def embed(self, modules: dict, ids: torch.Tensor) -> torch.Tensor:
        return modules["model.embed_tokens"](ids)

    def layer_inputs(self, hidden: torch.Tensor) -> dict:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
        sliding = getattr(self.config, "sliding_window", None) is not None
        make_mask = create_sliding_window_causal_mask if sliding else create_causal_mask
        positions = _positions(hidden)
        mask = make_mask(config=self.config, inputs_embeds=hidden, attention_mask=None,
                         position_ids=positions, **_no_cache(make_mask))
        return {"attention_mask": mask, "position_ids": positions,
                "position_embeddings": self.rotary(hidden, position_ids=positions)}

    def run_layer(self, layer: torch.nn.Module, hidden: torch.Tensor, inputs: dict) -> torch.Tensor:
        return layer(hidden, use_cache=False, **inputs)

    def logits(self, modules: dict, hidden: torch.Tensor) -> torch.Tensor:
        return modules["lm_head"](modules["model.norm"](hidden))


FAMILIES = {"gpt_neo": GPTNeo, "mistral": LlamaLike, "llama": LlamaLike}


def family_of(config, meta_model):
    if config.model_type not in FAMILIES:
        raise ValueError(f"streaming GradProbe does not know model type {config.model_type!r}; "
                         f"known: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[config.model_type](config, meta_model)
