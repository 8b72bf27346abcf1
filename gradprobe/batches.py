"""The calibration batches a pruner reads: the first `count` of a loader, restarted every pass.

A batch is `(x, y)`, or a single tensor `x` (or `(x,)`) standing for `(x, x)` (causal LM: the
labels are the inputs). Batches move to the model's device as they are read.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


class CalibrationBatches:
    def __init__(self, loader: Iterable, count: int, device: torch.device | str = "cpu"):
        if isinstance(loader, Iterator):  # not iter(loader): on a DataLoader that starts its workers
            raise ValueError("the loader is a one-shot iterator, but GradProbe reads it from the start on "
                             "every pass: pass a list of batches or a DataLoader")
        known = _known_length(loader)
        if known < count:  # so known, not infinite
            raise ValueError(_too_few(int(known), count))
        self.loader, self.count, self.device = loader, count, device

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        read = 0
        for _, batch in zip(range(self.count), self.loader, strict=False):  # range first: never reads a batch too many
            read += 1
            yield _as_pair(batch, self.device)
        if read < self.count:
            raise ValueError(_too_few(read, self.count))


def _known_length(loader) -> float:
    try:
        return len(loader)
    except TypeError:  # no length (an iterable-style DataLoader): a short loader shows when read
        return float("inf")


def _too_few(available: int, count: int) -> str:
    if available == 0:
        return "the calibration loader is empty"
    return (f"the calibration loader gave {available} batch(es) but num_batches={count}: "
            f"give at least {count} batches or lower num_batches")


def _as_pair(batch, device) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        x = batch.to(device)
        return x, x
    if isinstance(batch, (tuple, list)) and len(batch) == 1:  # DataLoader over TensorDataset(ids)
        return _as_pair(batch[0], device)
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0].to(device), batch[1].to(device)
    raise ValueError(f"a calibration batch must be a tensor x or a pair (x, y), got {type(batch).__name__}")
