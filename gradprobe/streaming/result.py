"""What a streaming prune returns: counts, where the outputs are, and the masks read back lazily."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from .safetensors_files import read_header, read_tensor


class StoredMasks(Mapping[str, torch.Tensor]):
    """A masks file as name -> bool tensor (True = pruned), each read from disk when asked for.

    `gradprobe.mask_digest(StoredMasks(path))` digests a 7B model's masks one tensor at a time.
    """

    def __init__(self, path: str):
        self.path, self.stored = path, read_header(path)

    def __getitem__(self, name: str) -> torch.Tensor:
        return read_tensor(self.stored[name]).bool()

    def __iter__(self) -> Iterator[str]:
        return iter(self.stored)

    def __len__(self) -> int:
        return len(self.stored)


@dataclass(frozen=True)
class StreamingResult:
    out: str              # folder of pruned weights (config.json, index, one file per stage)
    masks_path: str       # safetensors, one uint8 0/1 tensor per parameter (1 = pruned)
    sparsity: float       # pruned / prunable elements
    candidates: int
    pruned: int
    prunable: int
    seconds: float        # wall time of `prune`
    threshold: float      # the global candidate threshold t

    @property
    def masks(self) -> StoredMasks:
        return StoredMasks(self.masks_path)
