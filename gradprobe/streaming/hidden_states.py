"""The hidden states between decoder layers, on disk but for the ones in use.

The backward pass needs every layer's input again, from the top layer down: at Mistral-7B's size
with 2 batches of 128 tokens that is 32 x 2 x 2 MiB = 128 MiB, held through the whole backward.
Pushed lists go to a scratch file each (a few MiB, written once and read once, so the page cache
serves them), and only the top list stays in memory, for the next layer's forward.
"""
from __future__ import annotations

import os
import shutil

import torch

from .safetensors_files import holds_values


class SpilledStack:
    """A stack of lists of tensors: `push`, `top` (in memory), `pop` (read back from disk)."""

    def __init__(self, folder: str):
        self.folder = folder
        self.files: list[tuple[str, list[tuple[torch.dtype, torch.Size]]]] = []
        self._top: list[torch.Tensor] | None = None

    def push(self, tensors: list[torch.Tensor]) -> None:
        if self._top is not None:
            self._spill(self._top)
        self._top = [t.detach() for t in tensors]

    def top(self) -> list[torch.Tensor]:
        if self._top is None:
            raise RuntimeError("the stack's top is on disk (popped, or nothing pushed): pop it instead")
        return self._top

    def pop(self) -> list[torch.Tensor]:
        if self._top is not None:
            top, self._top = self._top, None
            return top
        path, layout = self.files.pop()
        tensors = []
        with open(path, "rb") as file:
            for dtype, shape in layout:
                tensor = torch.empty(shape, dtype=dtype)
                if holds_values(tensor):  # a traced run's fake tensor: nothing was written
                    file.readinto(tensor.view(-1).view(torch.uint8).numpy().data)
                tensors.append(tensor)
        os.remove(path)
        return tensors

    def _spill(self, tensors: list[torch.Tensor]) -> None:
        path = os.path.join(self.folder, f"{len(self.files):04d}.bin")
        with open(path, "wb") as file:
            for t in tensors:
                if holds_values(t):
                    file.write(t.contiguous().view(-1).view(torch.uint8).numpy().data)
        self.files.append((path, [(t.dtype, t.shape) for t in tensors]))

    @property
    def nbytes(self) -> int:
        """Bytes in memory (the top list only)."""
        return sum(t.numel() * t.element_size() for t in self._top or [])

    def close(self) -> None:
        self.files, self._top = [], None
        shutil.rmtree(self.folder, ignore_errors=True)
