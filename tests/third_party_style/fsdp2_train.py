"""A training script in the style of third-party FSDP2 examples: no auditor import, the model
built in the script itself, sizes from the command line. Run under torchrun (gloo on CPU)."""
import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import LlamaConfig, LlamaForCausalLM


def build_model(args):
    config = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.heads, vocab_size=args.vocab,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         attn_implementation="eager")
    return LlamaForCausalLM(config)


def train_step(model, optimizer, batch):
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach()


def main():
    parser = argparse.ArgumentParser()
    for name, default in (("hidden", 64), ("intermediate", 172), ("layers", 2), ("heads", 4),
                          ("vocab", 512), ("seq", 32), ("steps", 2)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = build_model(args)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = torch.randint(0, args.vocab, (1, args.seq))
    for _ in range(args.steps):
        loss = train_step(model, optimizer, batch)
    if dist.get_rank() == 0:
        print(f"loss {float(loss):.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
