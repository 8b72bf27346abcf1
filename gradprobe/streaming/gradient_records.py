"""The gradient records G0 and G1 kept at the candidates only, and G0 parked on disk between passes.

The decision reads G only where a weight is a candidate, so only those elements are kept: one
fp32 value per candidate (10% of the weights at s = 0.1). G0 of a whole 7B model is still 2.9 GB
at that rate, so each stage's G0 goes to a scratch file when its stage is done and comes back when
the same stage is done in the reduced pass.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial

import torch

from .safetensors_files import SafetensorsWriter, read_header, read_tensor


class CandidateGradients:
    """One tensor's G at its candidates: per candidate, the max over batches of |grad|.

    Values come in gathered at the candidates (`Candidates.gather`), in their row-major order.
    A tensor that two stages use (a head tied to the token embedding) receives each batch's
    gradient in two parts, the head's first: the parts are summed before |.| and the maximum, as
    autograd sums them on the whole model. The max is over batches of the full gradient.
    """

    def __init__(self, candidates: int):
        self.maximum = torch.zeros(candidates)      # 0 never raises a max: as a batch with no gradient
        self.partial: dict[int, torch.Tensor] = {}  # batch -> the parts received so far

    def add(self, batch: int, values: torch.Tensor, complete: bool) -> None:
        if batch in self.partial:
            values = self.partial.pop(batch) + values
        if not complete:
            self.partial[batch] = values
            return
        torch.maximum(self.maximum, values.abs_(), out=self.maximum)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [self.maximum, *self.partial.values()])


class ScratchRecords:
    """G0 per stage in a scratch folder: `save` when a stage's G0 is complete, `load` to decide."""

    def __init__(self, folder: str):
        os.makedirs(folder, exist_ok=True)
        self.folder = folder

    def save(self, stage_file: str, maxima: dict[str, torch.Tensor]) -> None:
        layout = {name: (m.dtype, tuple(m.shape)) for name, m in maxima.items()}
        with SafetensorsWriter(self._path(stage_file), layout) as file:
            for name, maximum in maxima.items():
                file.write(name, maximum)

    def load(self, stage_file: str) -> dict[str, torch.Tensor]:
        path = self._path(stage_file)
        maxima = {name: read_tensor(stored, once=True) for name, stored in read_header(path).items()}
        os.remove(path)  # read once: the scratch folder shrinks as the reduced pass goes
        return maxima

    def open(self, stage_file: str) -> dict[str, Callable[[], torch.Tensor]]:
        """Like `load`, but each tensor is read when its reader is called; `remove` when done."""
        return {name: partial(read_tensor, stored, once=True)
                for name, stored in read_header(self._path(stage_file)).items()}

    def remove(self, stage_file: str) -> None:
        os.remove(self._path(stage_file))

    def _path(self, stage_file: str) -> str:
        return os.path.join(self.folder, "G0-" + stage_file)
