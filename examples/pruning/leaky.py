"""A calibration step that leaks: the features it collects stay alive after it returns, held by
a reference cycle (a closure that refers to itself through the object it is stored on), so
only Python's cycle collector frees them, whenever it next runs a full collection.

State: `features`, samples x length x hidden fp32, retained after `collect_features` returns.
"""
from __future__ import annotations

import torch

from pruning.layer_inputs import capture_layer_inputs


class _Callbacks:
    pass


def collect_features(model, samples: list[torch.Tensor]) -> float:
    """Returns the features' mean norm; the features themselves are meant to be dropped."""
    features, _ = capture_layer_inputs(model, samples)
    callbacks = _Callbacks()

    def on_done():  # refers to `features` and, through `callbacks`, to itself: a cycle
        return callbacks, features
    callbacks.on_done = on_done
    return float(features.norm(dim=-1).mean())
