"""The gradient record G: per element, the running maximum of |grad| over the calibration batches."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

import torch

from .blocks import row_blocks


def gradient_passes(model: torch.nn.Module, batches: Iterable, loss_fn: Callable) -> Iterator[None]:
    """One forward and backward per batch, yielding after each backward, when `.grad` is this batch's.

    The loop every gradient record shares; what is read from the gradients, and when, is the
    reader's: after the backward (below), or during it (`gradprobe.variants.gradient_hooks`).
    """
    for x, y in batches:
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        yield


def record_gradients(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor], batches: Iterable,
                     loss_fn: Callable, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Dense G; the model's `.grad` is left as the last backward left it."""
    record: dict[str, torch.Tensor] = {}
    for _ in gradient_passes(model, batches, loss_fn):
        for name, tensor in tensors.items():
            keep_running_max(record, name, tensor, dtype)
    return record


def keep_running_max(record: dict[str, torch.Tensor], name: str, tensor: torch.Tensor,
                     dtype: torch.dtype) -> None:
    grad = tensor.grad
    if name not in record:
        # copy_ then abs_ in place: the record is the only new tensor (|x| commutes with rounding).
        record[name] = torch.zeros(tensor.shape, dtype=dtype, device=tensor.device)
        if grad is not None:
            record[name].copy_(grad).abs_()
        return
    if grad is None:  # unused this batch: its gradient is 0, which never raises a maximum
        return
    kept = record[name]
    for rows in row_blocks(grad):
        torch.maximum(kept[rows], grad[rows].abs().to(dtype), out=kept[rows])
