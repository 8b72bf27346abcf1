"""A random Llama built from a transformers config, and seeded synthetic calibration samples."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build_llama(layers: int = 2, hidden: int = 128, intermediate: int = 344, heads: int = 4,
                vocab: int = 512, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(num_hidden_layers=layers, hidden_size=hidden,
                         intermediate_size=intermediate, num_attention_heads=heads,
                         num_key_value_heads=heads, vocab_size=vocab, max_position_embeddings=2048)
    return LlamaForCausalLM(config).eval()


def calibration_samples(count: int, length: int, vocab: int, seed: int = 0) -> list[torch.Tensor]:
    """`count` samples of shape (1, length), token ids drawn uniformly (no dataset needed)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (1, length), generator=generator) for _ in range(count)]
