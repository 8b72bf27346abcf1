"""Traced runs: real code on shapes only, so a 7B model's memory is measured on a small machine.

    with traced() as trace:
        model = build_model("mistral-7b")          # fake tensors: nothing is allocated
        prune(model)
    trace.data_dependent                           # outputs whose size depended on values

Inside, every tensor is a `FakeTensor` (torch's FakeTensorMode): operators compute output
shapes and dtypes without touching memory. Code that reads a value back (`.item()`, `int(t)`,
a comparison in Python) gets 0 / 0.0 / False, so value-driven control flow takes one fixed
path. Operators whose output *size* depends on values (boolean indexing, `nonzero`,
`masked_select`) return empty results: their bytes are a lower bound, and each is counted
in `data_dependent` so a report can say so.
"""
from __future__ import annotations

import contextlib
from collections import Counter

import torch
from torch._subclasses import FakeTensorMode
from torch._subclasses.fake_tensor import DynamicOutputShapeException
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


class ValueFreeMode(TorchDispatchMode):
    """Answers the questions a fake tensor cannot: its values and value-dependent sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.data_dependent: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default:
            dtype = args[0].dtype
            return False if dtype == torch.bool else (0.0 if dtype.is_floating_point else 0)
        if func is aten.bincount.default:  # its size is max(minlength, largest value + 1)
            self.data_dependent[str(func)] += 1
            return torch.zeros(kwargs.get("minlength", args[2] if len(args) > 2 else 0),
                               dtype=torch.int64)
        try:
            return func(*args, **kwargs)
        except DynamicOutputShapeException:
            self.data_dependent[str(func)] += 1
            return _empty_result(func, args)


def _empty_result(func, args) -> torch.Tensor:
    source = args[0]
    if func is aten.nonzero.default:
        return torch.empty((0, source.dim()), dtype=torch.long)
    if func is aten.index.Tensor:  # boolean masks consume as many dims as they have
        consumed = sum(i.dim() if i is not None and i.dtype == torch.bool else 1 for i in args[1])
        return torch.empty((0, *source.shape[consumed:]), dtype=source.dtype)
    if func is aten.masked_select.default:
        return torch.empty(0, dtype=source.dtype)
    raise NotImplementedError(f"cannot trace {func}: its output size depends on tensor values")


@contextlib.contextmanager
def traced():
    """Run the body on fake tensors; yields the ValueFreeMode (its `data_dependent` counts)."""
    value_free = ValueFreeMode()
    with FakeTensorMode(allow_non_fake_inputs=True), value_free:
        yield value_free


def is_fake(tensor: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(tensor, FakeTensor) or tensor.device.type == "meta"
