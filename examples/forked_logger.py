"""A training script whose logger process is forked after the model is built, as upstream
GradProbe's is: every page of the weights the optimizer writes later stays with the logger as
its own (copy on write). It knows nothing of the auditor; audit it unchanged:

    auditor run --census --run-dir runs/logger \
        --stage forked_logger:train_step examples/forked_logger.py --hidden 512 --layers 8
    auditor report runs/logger

The report's child-memory finding says what the logger held of its own (USS) against the
training process's peak and the weights. `--fork before` starts the logger before the model
is built (the remedy): it then owns none of the weights.
"""
import argparse
import multiprocessing

import torch
from transformers import GPTNeoConfig, GPTNeoForCausalLM

VOCAB = 8000


def log_forever(lines) -> None:
    """The logger: prints what it is sent until told to stop (None)."""
    for line in iter(lines.get, None):
        print(line, flush=True)


def train_step(model, optimizer, batch) -> float:
    loss = model(batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fork", choices=("before", "after"), default="after",
                        help="start the logger before or after the model is built")
    args = parser.parse_args()
    context = multiprocessing.get_context("fork")
    lines = context.Queue()
    logger = context.Process(target=log_forever, args=(lines,), daemon=True)
    if args.fork == "before":
        logger.start()
    model = GPTNeoForCausalLM(GPTNeoConfig(vocab_size=VOCAB, hidden_size=args.hidden, num_layers=args.layers,
                                           num_heads=8, attention_types=[[["global"], args.layers]],
                                           max_position_embeddings=256))
    if args.fork == "after":
        logger.start()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    torch.manual_seed(0)
    for step in range(args.steps):
        loss = train_step(model, optimizer, torch.randint(0, VOCAB, (2, 128)))
        lines.put(f"step {step}: loss {loss:.3f}")
    lines.put(None)
    logger.join(60)


if __name__ == "__main__":
    main()
