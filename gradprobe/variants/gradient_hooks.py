"""Gradients consumed in backward: each parameter's gradient handed over once complete, then dropped.

`Tensor.register_post_accumulate_grad_hook` runs when backward has finished accumulating a
leaf's `.grad`: a weight used twice (a head tied to the token embedding) has both contributions
by then. Setting `.grad = None` there frees it before later tensors' gradients are made, so a
dense gradient buffer for the whole model never exists, only the gradients in flight.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import contextmanager
from functools import partial

import torch

# (parameter name, its complete gradient): `.grad` as the hook finds it, typed as `.grad` is
Consumer = Callable[[str, torch.Tensor | None], None]


@contextmanager
def gradients_consumed_in_backward(parameters: Mapping[str, torch.Tensor], consume: Consumer):
    """While active, every backward hands each parameter's gradient to `consume` and drops it."""
    handles = [p.register_post_accumulate_grad_hook(partial(_hand_over, name, consume))
               for name, p in parameters.items() if p.requires_grad]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for p in parameters.values():  # a backward that failed midway may have left some
            p.grad = None


def _hand_over(name: str, consume: Consumer, parameter: torch.Tensor) -> None:
    consume(name, parameter.grad)
    parameter.grad = None
