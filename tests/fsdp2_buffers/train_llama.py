"""Fine-tune a small Llama with FSDP2 on CPU (gloo): shard each decoder layer, then the model.

    torchrun --nproc-per-node 2 train_llama.py --steps 3
"""
import argparse
import json

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import LlamaConfig, LlamaForCausalLM


def build(hidden: int, layers: int, vocab: int) -> torch.nn.Module:
    config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=4, vocab_size=vocab,
                         max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def forward_loss(model, batch):
    return model(input_ids=batch, labels=batch).loss


def train_step(model, optimizer, batch):
    loss = forward_loss(model, batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def tracked_step(model, optimizer, batch, steps_seen):
    """train_step under FSDPMemTracker; its peak breakdown (bytes by kind) kept in steps_seen."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    tracker = FSDPMemTracker(model, optimizer)
    tracker.track_inputs((batch,))
    with tracker:
        loss = train_step(model, optimizer, batch)
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    steps_seen.append({str(kind): size for kind, size in peak.items()})
    return loss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--check-memory", metavar="JSON", help="also measure each step with PyTorch's "
                        "FSDPMemTracker: its peak breakdown per step, rank r's in JSON.r")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    model = build(args.hidden, args.layers, args.vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(dist.get_rank())
    steps_seen = []
    for step in range(args.steps):
        batch = torch.randint(0, args.vocab, (2, args.seq_len), generator=generator)
        if args.check_memory:
            loss = tracked_step(model, optimizer, batch, steps_seen)
        else:
            loss = train_step(model, optimizer, batch)
        if dist.get_rank() == 0:
            print(f"step {step}: loss {loss.item():.4f}")
    if args.check_memory:
        with open(f"{args.check_memory}.{dist.get_rank()}", "w") as out:
            json.dump(steps_seen, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
