"""Candidate strategies: which weights GradProbe tentatively reduces.

A strategy scores every prunable weight and marks the lowest-scoring fraction `sparsity` as
candidates, over all tensors at once (one global threshold, the default) or tensor by tensor
(`per_layer=True`). Scores are computed block by block (`blocks`), never stored whole.

    strategy.select(model, prunable, sparsity, batches) -> {name: bool tensor, True = candidate}
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from itertools import chain

import torch

from .blocks import row_blocks
from .threshold import candidate_threshold


class TensorScores:
    """One tensor's scores: |w|, times a per-input-feature scale where the strategy has one."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor | None = None):
        self.weight, self.scale = weight.detach(), scale  # scale broadcasts to weight rows

    def blocks(self) -> Iterator[torch.Tensor]:
        for rows in row_blocks(self.weight):
            yield self.block(rows)

    def block(self, rows: slice) -> torch.Tensor:
        score = self.weight[rows].abs().float()
        if self.scale is not None:
            score.mul_(self.scale if self.scale.shape[0] == 1 else self.scale[rows])
        return score

    def below(self, threshold: float) -> torch.Tensor:
        mask = torch.empty(self.weight.shape, dtype=torch.bool, device=self.weight.device)
        for rows in row_blocks(self.weight):
            torch.lt(self.block(rows), threshold, out=mask[rows])
        return mask


class Strategy:
    name = "strategy"

    def __init__(self, per_layer: bool = False):
        self.per_layer = per_layer

    def scales(self, model, prunable, batches) -> dict[str, torch.Tensor]:
        """Per-input-feature scales of |w| by tensor name; tensors left out are scored by |w|."""
        return {}

    def select(self, model: torch.nn.Module, prunable: Mapping[str, torch.Tensor], sparsity: float,
               batches: Iterable) -> dict[str, torch.Tensor]:
        scales = self.scales(model, prunable, batches)
        scores = {name: TensorScores(w, scales.get(name)) for name, w in prunable.items()}
        if self.per_layer:
            return {name: s.below(candidate_threshold(s.blocks, s.weight.numel(), sparsity))
                    for name, s in scores.items()}
        total = sum(s.weight.numel() for s in scores.values())
        every_block = lambda: chain.from_iterable(s.blocks() for s in scores.values())  # noqa: E731
        threshold = candidate_threshold(every_block, total, sparsity)
        return {name: s.below(threshold) for name, s in scores.items()}


class Magnitude(Strategy):
    """Candidates are the weights smallest in |w|."""
    name = "magnitude"


class Wanda(Strategy):
    """Candidates are the weights smallest in |W_ij| * ||X_j||_2 (Sun et al., 2023).

    ||X_j|| is the L2 norm of input feature j over a batch's tokens, read by forward hooks on
    every Linear (and transformers' Conv1D); batches combine by element-wise maximum, as upstream
    does. Embeddings have no input features and are scored by |w|. A head tied to the embedding
    is a Linear reading the final hidden states, so the shared tensor is scored as that head.
    """
    name = "wanda"

    def scales(self, model, prunable, batches) -> dict[str, torch.Tensor]:
        norms: dict[str, torch.Tensor] = {}
        handles = _hook_input_norms(model, prunable, norms)
        try:
            with torch.no_grad():
                for x, _ in batches:
                    model(x)
        finally:
            for handle in handles:
                handle.remove()
        return norms


def _hook_input_norms(model, prunable, norms: dict) -> list:
    names = {id(w): name for name, w in prunable.items()}
    handles = []
    for module in model.modules():
        axis = _feature_axis(module)
        if axis is not None and id(module.weight) in names:
            hook = partial(_keep_max_norm, norms, names[id(module.weight)], axis)
            handles.append(module.register_forward_hook(hook))
    return handles


def _feature_axis(module: torch.nn.Module) -> int | None:
    """The weight axis indexed by input feature: 1 for Linear ([out, in]), 0 for Conv1D ([in, out])."""
    if isinstance(module, torch.nn.Linear):
        return 1
    if _is_conv1d(module):
        return 0
    return None


def _is_conv1d(module: torch.nn.Module) -> bool:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return False
    return isinstance(module, Conv1D)


def _keep_max_norm(norms: dict, name: str, axis: int, module, inputs, output) -> None:
    x = inputs[0].detach()
    norm = torch.linalg.vector_norm(x.reshape(-1, x.shape[-1]).float(), dim=0)
    norm = norm.view(1, -1) if axis == 1 else norm.view(-1, 1)  # broadcast over the weight's rows
    norms[name] = norm if name not in norms else torch.maximum(norms[name], norm)


STRATEGIES = {cls.name: cls for cls in (Magnitude, Wanda)}


def make_strategy(name: str, per_layer: bool = False) -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(sorted(STRATEGIES))}")
    return STRATEGIES[name](per_layer=per_layer)
