"""The default loss: causal language modelling, each position predicting the next token."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_lm_loss(output, labels: torch.Tensor) -> torch.Tensor:
    """Shifted cross-entropy; `output` is logits or anything with `.logits` (Hugging Face models)."""
    logits = getattr(output, "logits", output)
    if labels.shape[-1] < 2:
        raise ValueError("causal LM loss needs sequences of at least 2 tokens")
    predicted = logits[..., :-1, :].flatten(0, -2).float()
    return F.cross_entropy(predicted, labels[..., 1:].flatten().to(logits.device))
