"""A causal LM on disk: config.json and safetensors files, read one tensor at a time.

Any Hugging Face safetensors checkpoint folder works (one file or many); the folders this package
writes hold one file per stage (`embeddings.safetensors`, `layer-000.safetensors`, ...,
`head.safetensors`) and the usual `model.safetensors.index.json`, so `from_pretrained` loads them.
"""
from __future__ import annotations

import glob
import json
import os

import torch

from .safetensors_files import StoredTensor, read_header, read_tensor

INDEX_FILE = "model.safetensors.index.json"


class WeightsFolder:
    def __init__(self, path: str):
        if not os.path.isdir(path):
            raise ValueError(f"weights folder {path!r} does not exist")
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"weights folder {path!r} has no config.json")
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise ValueError(f"weights folder {path!r} has no .safetensors files")
        self.path = path
        self.stored: dict[str, StoredTensor] = {}
        for file in files:
            for name, stored in read_header(file).items():
                if name in self.stored:
                    raise ValueError(f"tensor {name!r} is in both {self.stored[name].path!r} and {file!r}")
                self.stored[name] = stored

    def config(self):
        from transformers import AutoConfig
        try:
            config = AutoConfig.from_pretrained(self.path)
        except Exception as error:  # transformers raises its own validation errors, not ValueError
            raise ValueError(f"config.json in {self.path!r} cannot be read as a model config: "
                             f"{' '.join(str(error).split())}") from None
        config._attn_implementation = "eager"  # as `architectures.build_model`: deterministic on CPU
        return config

    def load(self, name: str, dtype: torch.dtype | None = None, into: torch.Tensor | None = None) -> torch.Tensor:
        """One tensor, in its stored dtype or converted (the stored copy is freed at once);
        `into`: a tensor of the stored dtype and shape to read it into (no new pages to fault in)."""
        tensor = read_tensor(self.stored[name], into)
        return tensor if dtype is None else tensor.to(dtype)

    def prefetch(self, names: list[str]) -> None:
        """Ask the kernel to read these tensors into the page cache now, in the background."""
        if not hasattr(os, "posix_fadvise"):
            return
        for name in names:
            stored = self.stored[name]
            with open(stored.path, "rb") as file:
                os.posix_fadvise(file.fileno(), stored.offset, stored.nbytes, os.POSIX_FADV_WILLNEED)

    def check_matches(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Every parameter the config implies is here, with its shape; ValueError says which is not."""
        missing = [name for name in shapes if name not in self.stored]
        if missing:
            raise ValueError(f"weights folder {self.path!r} does not match its config: {len(missing)} "
                             f"parameter(s) missing, e.g. {missing[0]!r}")
        for name, shape in shapes.items():
            stored = self.stored[name]
            if tuple(stored.shape) != tuple(shape):
                raise ValueError(f"weights folder {self.path!r} does not match its config: {name!r} is "
                                 f"{tuple(stored.shape)} on disk, the config implies {tuple(shape)}")
            if not stored.dtype.is_floating_point:
                raise ValueError(f"{name!r} is stored as {stored.dtype}; weights must be floating point")

    def stored_tensor(self, name: str) -> StoredTensor:
        return self.stored[name]


def write_index(folder: str, files: dict[str, list[str]], total_bytes: int) -> None:
    """`model.safetensors.index.json`: which file holds each tensor, as `from_pretrained` reads it."""
    weight_map = {name: file for file, names in files.items() for name in names}
    with open(os.path.join(folder, INDEX_FILE), "w") as index:
        json.dump({"metadata": {"total_size": total_bytes}, "weight_map": weight_map}, index, indent=1)
