"""A training loop shaped like a small GPT training script (nanoGPT / HF style), written here:
GPT-2 built from a GPT2Config whose sizes come from the command line, AdamW, and a few steps of
forward, backward, step and zero_grad on seeded random token batches.

    python examples/as_written/train_gpt2.py --n-embd 64 --n-layer 1 --block-size 512 --seq 256
"""
from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--n-layer", type=int, default=1)
    parser.add_argument("--n-head", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=512, help="positions the model has")
    parser.add_argument("--seq", type=int, default=256, help="tokens per training sequence")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def build_model(args: argparse.Namespace) -> GPT2LMHeadModel:
    torch.manual_seed(args.seed)
    config = GPT2Config(n_embd=args.n_embd, n_layer=args.n_layer, n_head=args.n_head,
                        vocab_size=args.vocab_size, n_positions=args.block_size,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def get_batch(args: argparse.Namespace, vocab: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, vocab, (args.batch_size, args.seq), generator=generator)


def train_step(model: GPT2LMHeadModel, optimizer: torch.optim.Optimizer, ids: torch.Tensor) -> torch.Tensor:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def main() -> None:
    args = parse_args()
    model = build_model(args)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    generator = torch.Generator().manual_seed(args.seed)
    for step in range(args.steps):
        loss = train_step(model, optimizer, get_batch(args, model.config.vocab_size, generator))
        print(f"step {step}: loss {float(loss):.3f}")


if __name__ == "__main__":
    main()
