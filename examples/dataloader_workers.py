"""A training script in the usual third-party shape whose DataLoader reads its samples in two
worker processes, forked from the training process with the dataset (Python lists of token
ids, as many preprocessing scripts leave them). It knows nothing of the auditor; audit it
unchanged:

    auditor run --live-tensors --run-dir runs/dataloader \
        --stage dataloader_workers:train_step examples/dataloader_workers.py
    auditor report runs/dataloader

The workers are not audited: the record's figures are the training process's own, and the
report's banner says what the largest worker held beside them (its peak RSS, which for a
forked worker includes the pages it still shares with the training process).
"""
import argparse

import torch
from torch.utils.data import DataLoader, Dataset


class TokenizedText(Dataset):
    """Samples kept as Python lists of token ids, as many preprocessing scripts leave them."""

    def __init__(self, samples: int, length: int, vocab: int):
        generator = torch.Generator().manual_seed(0)
        self.samples = [torch.randint(vocab, (length,), generator=generator).tolist() for _ in range(samples)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(self.samples[index])


class NextToken(torch.nn.Module):
    """The last token from the mean embedding of the others: a small model, so that the data
    is most of the memory."""

    def __init__(self, vocab: int, width: int = 64):
        super().__init__()
        self.embed, self.out = torch.nn.Embedding(vocab, width), torch.nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(tokens).mean(dim=1))


def train_step(model, optimizer, batch) -> float:
    loss = torch.nn.functional.cross_entropy(model(batch[:, :-1]), batch[:, -1])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    data = TokenizedText(args.samples, args.length, args.vocab)
    torch.manual_seed(0)
    model = NextToken(args.vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                        generator=torch.Generator().manual_seed(0))
    for batch in loader:
        loss = train_step(model, optimizer, batch)
    print(f"last loss {loss:.4f}")


if __name__ == "__main__":
    main()
