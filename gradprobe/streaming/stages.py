"""A model cut into stages (embeddings, each decoder layer, head), each loaded from disk on its own.

The structure comes from the model built on the `meta` device (shapes only, no memory): which
parameters exist, which are prunable, which decoder layer owns each, and which tensors are tied (a
head sharing the token embedding uses that tensor, under the embedding's name). A loaded stage is
a set of real modules: prunable weights kept as stored and computed with in fp32 a block at a time
(`streamed_weights`), the rest fp32 Parameters; `release` drops them.

Every parameter is *owned* by exactly one stage, the one that writes it out. A tied head *uses*
the embedding's tensor without owning it.
"""
from __future__ import annotations

import copy
import weakref
from collections.abc import Collection
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..prunable import model_parameters, prunable_tensors
from .families import family_of
from .streamed_weights import StreamedWeight, streamed_forward
from .weights_folder import WeightsFolder


@dataclass(frozen=True)
class Stage:
    name: str                  # "embeddings", "layer 3", "head"
    file: str                  # the output file holding what it owns
    modules: tuple[str, ...]   # submodule paths in the model
    owns: tuple[str, ...]      # parameter names it writes
    layer: int | None = None   # decoder layer index


class LoadedStage:
    """A stage's modules with real weights; `parameters` maps parameter names to the tensors used."""

    def __init__(self, stage: Stage, modules: dict[str, torch.nn.Module], parameters: dict,
                 weights: dict[str, StreamedWeight], on_release=None):
        self.weights = weights  # first: who walks this object's attributes finds the weights as such
        self.stage, self.modules, self.parameters = stage, modules, parameters
        self._on_release = on_release

    @property
    def layer(self) -> torch.nn.Module:
        return self.modules[self.stage.modules[0]]

    def release(self) -> None:
        if self._on_release is not None:
            self._on_release(self.weights)
        self.modules, self.parameters, self.weights = {}, {}, {}

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor the stage computes with, by parameter name: streamed ones as stored."""
        return {**self.parameters, **{name: w.stored for name, w in self.weights.items()}}


class StagedModel:
    """The stages of `config`'s model; with a weights folder (checked against it), stages load."""

    def __init__(self, config, folder: WeightsFolder | None = None):
        from transformers import AutoModelForCausalLM
        self.folder, self.config = folder, config
        # Shapes only, on meta whatever mode is active: built under a traced run's FakeTensorMode its
        # parameters are fake tensors on meta, and freeing them crashed the process (torch 2.13).
        with unset_fake_temporarily(), torch.device("meta"):
            self.meta = AutoModelForCausalLM.from_config(self.config)
        self.family = family_of(self.config, self.meta)
        parameters = model_parameters(self.meta)
        self.shapes = {name: tuple(p.shape) for name, p in parameters.items()}
        self.prunable = list(prunable_tensors(self.meta))
        self._names = {id(p): name for name, p in parameters.items()}  # tied tensors: one name
        if folder is not None:
            folder.check_matches(self.shapes)
        self.stages = self._cut_into_stages()
        self.layers_loaded, self.most_layers_resident = 0, 0
        self._resident_layers: weakref.WeakSet = weakref.WeakSet()
        self._released: dict[tuple, list[torch.Tensor]] = {}

    @property
    def embeddings(self) -> Stage:
        return self.stages[0]

    @property
    def decoder_layers(self) -> list[Stage]:
        return self.stages[1:-1]

    @property
    def head(self) -> Stage:
        return self.stages[-1]

    def uses(self, stage: Stage) -> list[str]:
        """Every parameter name the stage computes with, tied tensors included."""
        return [self._names[id(p)] for path in stage.modules
                for p in self.meta.get_submodule(path).parameters()]

    def load(self, stage: Stage, streamed: Collection[str] = frozenset()) -> LoadedStage:
        """The stage's modules with the folder's weights: fp32 Parameters, except the `streamed`
        names, kept as stored and computed with a block at a time (`streamed_weights`)."""
        folder = self._folder()
        modules: dict[str, torch.nn.Module] = {}
        parameters: dict[str, torch.Tensor] = {}
        weights: dict[str, StreamedWeight] = {}
        reusable, self._released = self._released, {}  # the last stage's weight tensors, by shape
        for path in stage.modules:
            module = self._build_layer(stage.layer) if stage.layer is not None else \
                copy.deepcopy(self.meta.get_submodule(path))
            names = {local: self._names[id(p)] for local, p in self.meta.get_submodule(path).named_parameters()}
            streaming = []
            for local, name in names.items():  # one at a time: each placeholder goes as its tensor comes
                owner_path, _, attribute = local.rpartition(".")
                owner = module.get_submodule(owner_path)
                if name in streamed:
                    del owner._parameters[attribute]
                    weights[name] = StreamedWeight(folder.load(name, into=self._reused(name, reusable)))
                    setattr(owner, attribute, weights[name].stored)
                    streaming.append((owner, weights[name]))
                else:
                    placeholder = getattr(owner, attribute)
                    setattr(owner, attribute, torch.nn.Parameter(
                        folder.load(name, torch.float32), requires_grad=placeholder.requires_grad))
            for owner, weight in streaming:  # after every tensor is in: a Linear's forward takes its bias
                owner.forward = streamed_forward(owner, weight)
            del streaming
            module.eval()  # dropout off: these modules are ours, no user mode to keep
            parameters.update({names[local]: p for local, p in module.named_parameters()})
            modules[path] = module
        del reusable  # what this stage did not reuse is freed now
        return LoadedStage(stage, modules, parameters, weights, self._release)

    def _reused(self, name: str, reusable: dict) -> torch.Tensor | None:
        stored = self._folder().stored_tensor(name)
        tensors = reusable.get((stored.dtype, tuple(stored.shape)))
        return tensors.pop() if tensors else None

    def _release(self, weights: dict[str, StreamedWeight]) -> None:
        """A released stage's stored weights, kept for the next load of the same shapes: reading
        into tensors whose pages are already in memory saves faulting in 416 MiB per 7B layer."""
        for weight in weights.values():
            self._released.setdefault((weight.stored.dtype, tuple(weight.stored.shape)), []).append(weight.stored)

    def drop_released(self) -> None:
        """Free the last released stage's weight tensors (kept for the next load otherwise)."""
        self._released = {}

    def following(self, stage: Stage, backward: bool) -> Stage | None:
        """The stage a pass loads after `stage`: embeddings, layers up, head; then layers down, embeddings."""
        index = self.stages.index(stage) + (-1 if backward else 1)
        return self.stages[index] if 0 <= index < len(self.stages) else None

    def prefetch(self, stage: Stage | None) -> None:
        if stage is not None:
            self._folder().prefetch(self.uses(stage))

    def _folder(self) -> WeightsFolder:
        if self.folder is None:
            raise ValueError("this staged model was built without a weights folder: its stages cannot load")
        return self.folder

    def _build_layer(self, index: int) -> torch.nn.Module:
        """A fresh decoder layer whose parameters are placeholders on meta (the folder's weights
        replace them one by one), or, for a layer with buffers (GPT-Neo's causal mask), built on
        CPU with its parameters left uninitialised.

        Uninitialised parameters are never written, so their pages never became resident, but
        they were allocated: the auditor's live-tensor meter counted a 7B layer's 832 MiB of them
        on top of the layer, 40% over the measured peak RSS.
        """
        from transformers.initialization import no_init_weights
        layer_class = type(self.meta.get_submodule(f"{self.family.layers}.{index}"))
        with unset_fake_temporarily(), no_init_weights(), torch.device("meta"):
            layer = layer_class(self.config, index)
        if any(True for _ in layer.buffers()):  # buffers need their values
            with no_init_weights(), torch.device("cpu"):
                layer = layer_class(self.config, index)
        self.layers_loaded += 1
        self._resident_layers.add(layer)
        self.most_layers_resident = max(self.most_layers_resident, len(self._resident_layers))
        return layer

    def _cut_into_stages(self) -> list[Stage]:
        family = self.family
        count = len(self.meta.get_submodule(family.layers))
        embeddings = Stage("embeddings", "embeddings.safetensors", family.embeddings, ())
        layers = [Stage(f"layer {i}", f"layer-{i:03d}.safetensors", (f"{family.layers}.{i}",), (), i)
                  for i in range(count)]
        head = Stage("head", "head.safetensors", family.head, ())
        stages: list[Stage] = []
        owned: set[str] = set()
        for stage in [embeddings, *layers, head]:
            owns = tuple(name for name in self.uses(stage) if name not in owned)
            owned.update(owns)
            stages.append(Stage(stage.name, stage.file, stage.modules, owns, stage.layer))
        left = [name for name in self.shapes if name not in owned]
        if left:
            raise ValueError(f"{self.config.model_type}: parameter {left[0]!r} is in no stage "
                             "(embeddings, decoder layers, head); streaming cannot run this model")
        return stages
