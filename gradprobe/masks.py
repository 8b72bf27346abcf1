"""Pruning masks (name -> bool tensor, True = pruned): counting them, and a digest to compare runs."""
from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np
import torch


def count_true(masks: Mapping[str, torch.Tensor]) -> int:
    # count_nonzero makes no copy; bool_tensor.sum() would first widen the whole mask to int64.
    return sum(int(torch.count_nonzero(mask)) for mask in masks.values())


def mask_digest(masks: Mapping[str, torch.Tensor]) -> str:
    """sha256 over every mask's name, shape and bits (packed 8 to a byte), names in sorted order."""
    digest = hashlib.sha256()
    for name in sorted(masks):
        mask = masks[name].detach().to("cpu", torch.bool)
        digest.update(f"{name}{tuple(mask.shape)}".encode())
        digest.update(np.packbits(mask.numpy().reshape(-1)).tobytes())
    return digest.hexdigest()
