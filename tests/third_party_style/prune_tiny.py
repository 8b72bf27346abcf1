"""Driver, as a third-party repository's main.py would be: a random tiny Llama, seeded
synthetic calibration data, SparseGPT-style pruning (tp_pruners.sparsegpt)."""
import argparse

import torch
from tp_pruners.sparsegpt import prune_sparsegpt
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nsamples", type=int, default=4)
    p.add_argument("--seqlen", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=344)
    p.add_argument("--layers", type=int, default=2)
    a = p.parse_args()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=a.hidden, intermediate_size=a.intermediate,
                      num_hidden_layers=a.layers, num_attention_heads=4, num_key_value_heads=4,
                      use_cache=False, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(0)
    dataloader = [(torch.randint(0, cfg.vocab_size, (1, a.seqlen), generator=g),) for _ in range(a.nsamples)]
    prune_sparsegpt(model, dataloader, a.nsamples, a.seqlen)


if __name__ == "__main__":
    main()
