"""Tensor census: every live torch tensor, counted by storage and attributed to a component.

    census = take_census({"model": Root(model),
                          "pruner": Root(pruner, {"saved_state": "saved copies"})})
    census["components"]["pruner.saved_state"]  # {"category": "saved copies", "bytes": ..., "tensors": ...}
    census["live_tensor_bytes"]

What is counted: every tensor object the garbage collector tracks (`gc.get_objects()`),
the `.grad` of every leaf that requires grad, and every tensor reachable from the roots.
Each is counted by its **storage**, once: a view counts its whole base storage, a storage
shared by several tensors (tied embedding and head, a view and its base) counts once, and
`tensors` in a component is its number of distinct storages. Sparse tensors count their
index and value storages. Storages are keyed by device and data pointer; empty storages
and wrapper subclasses without a storage of their own (their inner tensors are counted)
are left out.

Meta-device and `FakeTensor` tensors hold no memory: by default they are left out of the
totals and only their nominal storage bytes are reported as `fake_tensor_bytes`. With
`count_fake=True` (projection under `FakeTensorMode`) they are counted like real ones at
their nominal storage size, keyed by storage identity since their data pointers mean
nothing.

Who owns what: `auditor.ownership` walks the roots in registration order; the first root
to reach a storage owns it. A live tensor no root reaches is `unowned` ("activations and
temporaries"), except unreached `nn.Parameter`s (`unowned.parameters`, weights) and their
`.grad` (`unowned.grad`, gradients). A component with no category from the ownership
rules is "masks" when all its tensors are bool, otherwise "other".

What it cannot see: tensors that exist only inside C++ (saved for backward by an autograd
graph, kept by a kernel's workspace, the allocator's cache) have no Python object unless
something references them, so they are not here; they show as the gap between RSS (or
CUDA allocated) and `live_tensor_bytes`. The census keeps no reference to any tensor once
it returns.
"""
from __future__ import annotations

import gc
import time
import weakref
from dataclasses import dataclass
from typing import Iterator

import torch

from auditor.ownership import (ACTIVATIONS, CATEGORIES, GRADIENT_RECORDS, GRADIENTS, MASKS,  # noqa: F401
                               OPTIMIZER_STATE, OTHER, SAVED_COPIES, WEIGHTS, walk_roots)

UNOWNED = "unowned"
UNOWNED_PARAMETERS = "unowned.parameters"
UNOWNED_GRAD = "unowned.grad"
_UNOWNED_CATEGORIES = {UNOWNED: ACTIVATIONS, UNOWNED_PARAMETERS: WEIGHTS, UNOWNED_GRAD: GRADIENTS}


@dataclass
class Root:
    """Something the user registered by name: the object (or a `weakref.ref` to it) and
    category hints, attribute name or dotted path -> category."""
    obj: object
    categories: dict[str, str] | None = None


def take_census(roots: dict[str, Root], *, count_fake: bool = False) -> dict:
    """Count live tensor storages and attribute them to components of the named roots.

    Returns {"components": {name: {"category", "bytes", "tensors"}}, "live_tensor_bytes",
    "live_tensors", "by_device": {device: bytes}, "fake_tensor_bytes", "seconds"}.
    Roots whose weak reference is dead are skipped.
    """
    started = time.perf_counter()
    ledger = _Ledger(count_fake)
    try:
        categories = walk_roots(_resolved(roots), ledger.claim)
        ledger.sweep()
        return ledger.summary({**categories, **_UNOWNED_CATEGORIES}, time.perf_counter() - started)
    finally:
        ledger.storages.clear()


def _resolved(roots: dict[str, Root]) -> Iterator[tuple[str, object, dict[str, str]]]:
    for name, root in roots.items():
        obj = root.obj
        if isinstance(obj, weakref.ReferenceType):
            obj = obj()
            if obj is None:
                continue
        yield name, obj, dict(root.categories or {})
        del obj


class _Ledger:
    """Storage key -> [bytes, owning component, is bool, device, fake]; no tensor is kept."""

    def __init__(self, count_fake: bool):
        self.count_fake = count_fake
        self.storages: dict[tuple, list] = {}
        self.fake_type = _fake_tensor_type()

    def claim(self, t: torch.Tensor, component: str) -> None:
        is_bool = t.dtype is torch.bool
        for part in _parts(t):
            fake = part.is_meta or (self.fake_type is not None and isinstance(part, self.fake_type))
            try:
                storage = part.untyped_storage()
                nbytes = storage.nbytes()
                key = ("fake", storage._cdata) if fake else (storage.device, storage.data_ptr())
                device = str(part.device)
            except Exception:  # a wrapper subclass without storage of its own
                continue
            if nbytes == 0:
                continue
            entry = self.storages.get(key)
            if entry is None:
                self.storages[key] = [nbytes, component, is_bool, device, fake]
            elif nbytes > entry[0]:  # two storage objects over one allocation
                entry[0] = nbytes

    def sweep(self) -> None:
        """Claim for the unowned components every tensor the garbage collector tracks."""
        tensor_types = _tensor_types()
        objects = gc.get_objects()
        found = [o for o in objects if type(o) in tensor_types]
        del objects
        try:
            for t in found:
                try:
                    self.claim(t, UNOWNED_PARAMETERS if isinstance(t, torch.nn.Parameter) else UNOWNED)
                    if t.is_leaf and t.requires_grad and t.grad is not None:
                        self.claim(t.grad, UNOWNED_GRAD)
                except Exception:  # an exotic subclass whose metadata cannot be read
                    continue
        finally:
            found.clear()

    def summary(self, categories: dict[str, str | None], seconds: float) -> dict:
        components: dict[str, dict] = {}
        all_bool: dict[str, bool] = {}
        by_device: dict[str, int] = {}
        total = fake_total = counted = 0
        for nbytes, owner, is_bool, device, fake in self.storages.values():
            if fake:
                fake_total += nbytes
                if not self.count_fake:
                    continue
            component = components.setdefault(owner, {"category": None, "bytes": 0, "tensors": 0})
            component["bytes"] += nbytes
            component["tensors"] += 1
            all_bool[owner] = all_bool.get(owner, True) and is_bool
            by_device[device] = by_device.get(device, 0) + nbytes
            total += nbytes
            counted += 1
        for name, component in components.items():
            component["category"] = categories.get(name) or (MASKS if all_bool[name] else OTHER)
        return {"components": components, "live_tensor_bytes": total, "live_tensors": counted,
                "by_device": by_device, "fake_tensor_bytes": fake_total, "seconds": seconds}


def _parts(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The strided tensors whose storages hold `t`'s data."""
    layout = t.layout
    if layout is torch.strided:
        return (t,)
    if layout is torch.sparse_coo:
        return (t._indices(), t._values())
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        return (t.crow_indices(), t.col_indices(), t.values())
    if layout in (torch.sparse_csc, torch.sparse_bsc):
        return (t.ccol_indices(), t.row_indices(), t.values())
    return ()


def _tensor_types() -> set[type]:
    """`torch.Tensor` and all its subclasses alive now (an exact-type test is far cheaper
    than `isinstance` over the hundreds of thousands of objects the collector tracks)."""
    found, stack = set(), [torch.Tensor]
    while stack:
        cls = stack.pop()
        if cls not in found:
            found.add(cls)
            stack.extend(cls.__subclasses__())
    return found


def _fake_tensor_type() -> type | None:
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:  # private API: absent in some torch versions
        return None
    return FakeTensor
