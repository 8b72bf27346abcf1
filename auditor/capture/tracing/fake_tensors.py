"""Traced runs: real code on shapes only, so a 7B model's memory is measured on a small machine.

    with traced(observed_sizes=real_record.annotations["data_dependent_sizes"]) as trace:
        model = build_model("mistral-7b")          # fake tensors: nothing is allocated
        prune(model)
    trace.estimates.entries()                      # each data-dependent site: ratio, source

Inside, every tensor is a `FakeTensor` (torch's FakeTensorMode): operators compute output
shapes and dtypes without touching memory. Code that reads a value back (`.item()`, `int(t)`,
a comparison in Python) gets 0 / 0.0 / False, so value-driven control flow takes one fixed
path; a count (`count_nonzero`, a bool tensor's `sum`) reads back its estimate instead.

Operators whose output *size* depends on values (boolean indexing, `nonzero`,
`masked_select`, `unique`, `bincount`) are sized by `auditor.capture.tracing.data_dependent.SizeEstimates`: the real
run's calls at the same call site and relative position (auditor.capture.tracing.size_profiles), else its ratio
there, else a fraction the program declared, else empty (the site is then listed as unknown).
Every such call is also counted in `data_dependent`.

Estimated sizes can disagree with sizes the program computed another way (a slice bounded by
a cumulative sum of counts, whose values a fake tensor does not have). Outputs of estimated
sizes are marked (and what is made from them at another size, as their storages'); when an
operator fails on mismatched shapes and one of its inputs is marked, it is run again with
the marked inputs resized to the unmarked ones' (all marked: to the first one's, as when one
quantity was estimated twice), and the site's `conflicts` counts it. The program's own
arithmetic wins; the record says where that happened.
"""
from __future__ import annotations

import contextlib
from collections import Counter

import torch
from torch._subclasses import FakeTensorMode
from torch._subclasses.fake_tensor import DynamicOutputShapeException
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

from auditor.capture.tracing.data_dependent import (
    COUNTING,
    NO_SITE,
    UNIQUE,
    SizeEstimates,
    counts_elements,
    op_name,
    selection,
)
from auditor.capture.tracing.dispatch_mode import MeasuringMode
from auditor.facts.allocation_sites import caller_site

aten = torch.ops.aten


class ValueFreeMode(MeasuringMode):
    """Answers the questions a fake tensor cannot: its values and value-dependent sizes."""

    def __init__(self, estimates: SizeEstimates | None = None) -> None:
        super().__init__()
        self.data_dependent: Counter = Counter()
        self.estimates = estimates or SizeEstimates()
        self._counts = WeakIdKeyDictionary()     # a count's fake scalar -> its estimate
        self._estimated = WeakIdKeyDictionary()  # storages whose size rests on an estimate

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default:
            return self._value(args[0])
        if func is aten.bincount.default:  # its size is max(minlength, largest value + 1)
            self.data_dependent[str(func)] += 1
            minlength = kwargs.get("minlength", args[2] if len(args) > 2 else 0)
            return torch.zeros(self.estimates.bins(func, args[0], minlength), dtype=torch.int64)
        try:
            out = func(*args, **kwargs)
        except DynamicOutputShapeException:
            self.data_dependent[str(func)] += 1
            return self._estimated_result(func, args, kwargs)
        except RuntimeError as error:
            out = self._reconciled(func, args, kwargs, error)
        if func in COUNTING and counts_elements(func, args) and out.dim() == 0:
            self._counts[out] = self.estimates.count(func, args[0], args[0].numel())
        elif self._estimated:
            self._propagate(args, kwargs, out)
        return out

    def _value(self, scalar: torch.Tensor):
        count = self._counts.get(scalar)
        if count is not None:
            return count
        constant = getattr(scalar, "constant", None)  # fake tensors keep the values of scalars made
        if isinstance(constant, torch.Tensor) and constant.numel() == 1:  # from Python numbers only
            return constant.item()  # (an optimizer's step, torch.tensor(0.0) then += 1): known exactly
        dtype = scalar.dtype
        return False if dtype == torch.bool else (0.0 if dtype.is_floating_point else 0)

    def _estimated_result(self, func, args, kwargs):
        sized = selection(func, args, kwargs) if func in ESTIMATED else None
        along_dim = func is aten.unique_consecutive.default and _option(args, kwargs, 3, "dim") is not None
        if sized is None or along_dim:
            raise NotImplementedError(f"cannot trace {func}: its output size depends on tensor "
                                      "values, in a form auditor.capture.tracing.data_dependent does not estimate")
        mask, numel, dim = sized
        count = self.estimates.count(func, mask, numel)
        source = args[0]
        if func in UNIQUE:
            return self._unique(func, source, count, args, kwargs)
        if func is aten.nonzero.default:
            out = torch.empty((count, source.dim()), dtype=torch.long)
        elif func is aten.masked_select.default:
            out = torch.empty(count, dtype=source.dtype)
        else:  # a boolean index consumes as many dims as it has
            shape = (*source.shape[:dim], count, *source.shape[dim + mask.dim():])
            out = torch.empty(shape, dtype=source.dtype)
        if count:
            self._mark(out)
        return out

    def _unique(self, func, source: torch.Tensor, count: int, args, kwargs) -> tuple:
        """(values, inverse, counts) as `unique` returns them: `count` distinct values; the
        inverse, when asked for, the input's shape; counts, when asked for, one per value."""
        first = 2 if func is aten._unique2.default else 1  # _unique2 takes `sorted` first
        inverse = _option(args, kwargs, first, "return_inverse")
        counts = _option(args, kwargs, first + 1, "return_counts")
        out = (torch.empty(count, dtype=source.dtype),
               torch.empty(source.shape if inverse else 0, dtype=torch.long),
               torch.empty(count if counts else 0, dtype=torch.long))
        if count:
            self._mark(out[0])
            self._mark(out[2])
        return out

    # -- marks, and estimates that disagree with the program -------------------------------

    def _mark(self, tensor: torch.Tensor) -> None:
        self._estimated[tensor.untyped_storage()] = True

    def _is_marked(self, item) -> bool:
        return isinstance(item, torch.Tensor) and item.untyped_storage() in self._estimated

    def _propagate(self, args, kwargs, out) -> None:
        """A new output of another size than every unmarked input, made from a marked one,
        rests on the estimate too (in-place results and views keep their storage's mark)."""
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if not any(self._is_marked(t) for t in inputs):
            return
        shapes = {tuple(t.shape) for t in inputs if not self._is_marked(t)}
        storages = {t.untyped_storage() for t in inputs}
        for item in tree_flatten(out)[0]:
            if (isinstance(item, torch.Tensor) and tuple(item.shape) not in shapes
                    and item.untyped_storage() not in storages):
                self._mark(item)

    def _reconciled(self, func, args, kwargs, error: RuntimeError):
        """Run `func` again with its estimated inputs resized to the program's own size; `error`
        again when no size in this run was estimated or that does not help.

        Marked inputs take an unmarked input's leading size. With every input marked (one
        quantity estimated twice, sized a few elements apart) or none (sizes that came through
        Python ints: a count read back, a file header written from an estimated tensor, as
        streaming's G0 read back against its G1), the first input's size is taken."""
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.dim()]
        marked = [t for t in tensors if self._is_marked(t)]
        plain = [t for t in tensors if not self._is_marked(t)]
        if func is aten.expand.default and self._is_marked(args[0]):  # to a size the program computed
            self.estimates.conflict(caller_site() or NO_SITE, op_name(func))
            return args[0].new_empty_strided(args[1], [0] * len(args[1]))  # a view's bytes: none new
        if marked and plain:  # the program's own size wins
            reference, adjustable = plain, marked
        elif tensors and self.estimates.entries():  # all marked or none: the first input's size
            reference, adjustable = tensors[:1], tensors[1:]
        else:
            raise error

        def resized(item):
            if not any(item is t for t in adjustable):
                return item
            like = next((t for t in reference if t.dim() == item.dim()), reference[0])
            return item if item.shape[0] == like.shape[0] else item.new_empty((like.shape[0], *item.shape[1:]))
        try:
            out = func(*tree_map(resized, args), **tree_map(resized, kwargs))
        except RuntimeError:
            raise error from None
        self.estimates.conflict(caller_site() or NO_SITE, op_name(func))
        return out


@contextlib.contextmanager
def traced(observed_sizes: list[dict] | None = None, estimate_sizes: bool = True):
    """Run the body on fake tensors; yields the ValueFreeMode (`data_dependent` counts,
    `estimates`). `observed_sizes`: a real run's `data_dependent_sizes`; `estimate_sizes=False`
    makes every data-dependent size empty (the lower bound)."""
    value_free = ValueFreeMode(SizeEstimates(observed_sizes, estimate_sizes))
    with FakeTensorMode(allow_non_fake_inputs=True), value_free, _modules_convert_in_place():
        yield value_free


@contextlib.contextmanager
def _modules_convert_in_place():
    """`model.to(device)`, `.half()`, `.float()` on a model of fake tensors work as on a real one.

    torch converts a fake parameter by swapping it with its converted copy, which fails
    whenever anything holds a weak reference to it (fake tensor mode and the live-tensor meter
    both do): "Couldn't swap Embedding.weight". A real CPU parameter is converted in place
    (`param.data = converted`), keeping its identity (tied weights stay tied, an optimizer
    made before keeps its parameters); fake parameters are converted the same way here."""
    original = torch.nn.Module._apply

    def _apply(module, fn, recurse=True):
        if recurse:
            for child in module.children():
                child._apply(fn)
        own = [t for t in (*module._parameters.values(), *module._buffers.values()) if t is not None]
        if not any(is_fake(t) for t in own):
            return original(module, fn, recurse=False)
        with torch.no_grad():
            for parameter in module._parameters.values():
                if parameter is None:
                    continue
                parameter.data = fn(parameter)
                if parameter.grad is not None:
                    parameter.grad.data = fn(parameter.grad)
        for key, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[key] = fn(buffer)
        return module

    torch.nn.Module._apply = _apply  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module._apply = original  # type: ignore[method-assign]


ESTIMATED = (aten.nonzero.default, aten.masked_select.default, aten.index.Tensor, *UNIQUE)


def _option(args, kwargs, position: int, name: str):
    return kwargs[name] if name in kwargs else (args[position] if len(args) > position else None)


def is_fake(tensor: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(tensor, FakeTensor) or tensor.device.type == "meta"
