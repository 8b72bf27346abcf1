"""Writing weights folders stage by stage: from a model in memory, from random numbers, or pruned.

Each stage's own parameters go to one safetensors file, written tensor by tensor; config.json and
`model.safetensors.index.json` come last, so a folder that has an index is complete. Random
weights for a big architecture are made one tensor at a time: no process ever holds the model.
"""
from __future__ import annotations

import copy
import os

import torch

from .safetensors_files import SafetensorsWriter
from .stages import Stage, StagedModel
from .weights_folder import write_index


class FolderWriter:
    """One output folder: `stage_file(stage)` opens the file for a stage's own tensors."""

    def __init__(self, folder: str, config, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, torch.dtype]):
        os.makedirs(folder, exist_ok=True)
        self.folder, self.config, self.shapes, self.dtypes = folder, config, shapes, dtypes
        self.files: dict[str, list[str]] = {}

    def stage_file(self, stage: Stage) -> SafetensorsWriter:
        self.files[stage.file] = list(stage.owns)
        layout = {name: (self.dtypes[name], self.shapes[name]) for name in stage.owns}
        return SafetensorsWriter(os.path.join(self.folder, stage.file), layout)

    def finish(self) -> None:
        total = sum(torch.Size(self.shapes[n]).numel() * self.dtypes[n].itemsize
                    for names in self.files.values() for n in names)
        self.config.save_pretrained(self.folder)
        write_index(self.folder, self.files, total)


def save_model(model: torch.nn.Module, folder: str) -> None:
    """An in-memory causal LM written as a streaming weights folder, one file per stage."""
    parameters = dict(model.named_parameters())
    staged = _structure(model.config)
    writer = FolderWriter(folder, model.config, staged.shapes, {n: p.dtype for n, p in parameters.items()})
    for stage in staged.stages:
        with writer.stage_file(stage) as file:
            for name in stage.owns:
                file.write(name, parameters[name])
    writer.finish()


def generate_random_weights(config, folder: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> None:
    """Seeded random weights for `config`, written tensor by tensor (never the whole model).

    Matrices ~ N(0, initializer_range) as transformers initialises them, norm weights 1, biases 0.
    Each stage has its own generator seeded from (seed, stage), so a stage's weights do not depend
    on the others.
    """
    staged = _structure(config)
    std = getattr(config, "initializer_range", 0.02)
    writer = FolderWriter(folder, config, staged.shapes, dict.fromkeys(staged.shapes, dtype))
    for number, stage in enumerate(staged.stages):
        generator = torch.Generator().manual_seed(seed * 100_003 + number)
        with writer.stage_file(stage) as file:
            for name in stage.owns:
                file.write(name, _random_tensor(name, staged.shapes[name], std, generator).to(dtype))
    writer.finish()


def _random_tensor(name: str, shape: tuple[int, ...], std: float, generator) -> torch.Tensor:
    if len(shape) >= 2:
        return torch.empty(shape).normal_(0.0, std, generator=generator)
    return torch.zeros(shape) if name.endswith("bias") else torch.ones(shape)


def _structure(config) -> StagedModel:
    """The stages of `config`'s model (a copy: building the structure must not change the caller's)."""
    return StagedModel(copy.deepcopy(config))
