"""How well the pruned model still predicts: perplexity over the calibration samples, in one
batch (as quick checks in pruning scripts often do: simple, and it holds every sample's logits,
samples x length x vocab fp32, at once)."""
from __future__ import annotations

import torch


def perplexity(model, samples: list[torch.Tensor]) -> float:
    tokens = torch.cat(samples)
    with torch.no_grad():
        logits = model(tokens, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             tokens[:, 1:].reshape(-1))
    return float(loss.exp())
