"""A small training loop: a tiny Llama and AdamW, a few steps; only the loop is staged, nothing
tracked (the auditor must find the model and the optimizer itself)."""
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import auditor


def main(out):
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=32,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with auditor.Audit(out, census=True, live_tensors=True), auditor.stage("train"):
        for _ in range(3):
            optimizer.zero_grad()  # the tutorial's order: the last step's gradients stay
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main(sys.argv[1])
