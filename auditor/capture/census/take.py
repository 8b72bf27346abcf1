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
index and value storages. A wrapper subclass (a DTensor, any traceable subclass exposing
`__tensor_flatten__`) has no storage of its own: it counts its inner tensors' storages (a
DTensor its local shard), so FSDP2's sharded parameters, their gradients and the optimizer
state kept for them are owned as the plain tensors of a single process are. Storages are
keyed by `storage_key` (device and data pointer); empty storages are left out.

Meta-device tensors are shapes only and never counted. `FakeTensor` tensors hold no memory
but stand for some: by default they are left out of the totals and only their nominal storage
bytes are reported as `fake_tensor_bytes`. With `count_fake=True` (projection under
`FakeTensorMode`) they are counted like real ones at their nominal storage size, keyed by
storage identity since their data pointers mean nothing.

Who owns what: `auditor.capture.census.ownership` walks the roots in registration order and claims what
each reaches; each storage goes to its firmest claim, the first among equals. Storage
identity decides weights: a survey before the walk finds the storages of every live
`nn.Parameter`, and any tensor on one (an alias such as `W = layer.weight.data`, wherever
it is held) is weights. The parameters of modules, and their `.grad`, are owned only by a
module root whose tree contains them; a wrapper root (`SparseGPT` holding `self.layer`)
never owns them: with no such module root they are `unowned.parameters` (weights) and
`unowned.grad` (gradients). A live tensor no root reaches is `unowned` ("activations and
temporaries"), a free parameter `unowned.parameters`. With `find_cycles=True` the largest
unowned storages are checked (`auditor.capture.census.reference_cycles`): one kept alive only by an
unreachable reference cycle, which only the cycle collector would free, is
`unreachable.cycles` ("retained by a reference cycle"). A component with no category from
the ownership rules (or only the one an unowned storage gets) is "saved copies" when at least
half its bytes are copies of the weights (provenance below), "buffers" when all its storages
are module buffers', "masks" when all its tensors are bool, "weights" when all its storages are
parameters', otherwise "other" ("activations and temporaries" for the unowned).

Provenance: while a live-tensor meter counts (auditor.capture.census.provenance), it knows which storages were
made by copying the weights' values; the census adds to each component holding some
`copy_bytes` (its bytes that are copies), `weights_copied` (bytes of the weights they hold the
values of, at the weights' own precision) and `parameters_copied` (distinct parameter storages
copied). A storage that is a live parameter's is weights, never a copy (`model.to(dtype)` makes
the new weights by copying the old). Without a meter nothing says what a component was made
from, and no component is "saved copies" but by a root's hints.

What it cannot see: tensors that exist only inside C++ (saved for backward by an autograd
graph, kept by a kernel's workspace, the allocator's cache) have no Python object unless
something references them, so they are not here; they show as the gap between RSS (or
CUDA allocated) and `live_tensor_bytes`. The census keeps no reference to any tensor once
it returns.
"""
from __future__ import annotations

import functools
import gc
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import torch

try:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass
except ImportError:  # private API: absent in some torch versions (the protocol is tested instead)
    is_traceable_wrapper_subclass = None  # type: ignore[assignment]

from auditor.capture.census import provenance, reference_cycles
from auditor.capture.census.ownership import (  # noqa: F401
    ACTIVATIONS,
    BUFFERS,
    CATEGORIES,
    CONTAINED,
    GRADIENT_RECORDS,
    GRADIENTS,
    MASKS,
    OPTIMIZER_STATE,
    OTHER,
    RETAINED_BY_CYCLE,
    SAVED_COPIES,
    WEIGHTS,
    walk_roots,
)

UNOWNED = "unowned"
ALLOCATED_AT = "allocated at"  # an unowned storage named by the line that allocated it
UNOWNED_PARAMETERS = "unowned.parameters"
UNOWNED_GRAD = "unowned.grad"
UNREACHABLE_CYCLES = "unreachable.cycles"
_UNOWNED_CATEGORIES = {UNOWNED: ACTIVATIONS, UNOWNED_PARAMETERS: WEIGHTS, UNOWNED_GRAD: GRADIENTS,
                       UNREACHABLE_CYCLES: RETAINED_BY_CYCLE}
MOSTLY_COPIES = 0.5  # a component this share of whose bytes are copies of the weights is "saved copies"
SWEPT = 0  # a claim from the sweep of every live tensor: below any root's (ownership's firmnesses)
CYCLE_CANDIDATE_BYTES = 1 << 20  # unowned storages at least this large are checked for cycles,
CYCLE_CANDIDATES = 8             # the largest this many
MAX_WRAPPER_DEPTH = 8  # wrapper subclasses nested deeper than this count by their own storage


@dataclass
class Root:
    """Something the user registered by name: the object (or a `weakref.ref` to it) and
    category hints, attribute name or dotted path -> category."""
    obj: object
    categories: dict[str, str] | None = None


def storage_key(storage: torch.UntypedStorage, fake: bool) -> tuple:
    """The key the census counts a storage under (and lists its owner under): device and
    data pointer; for a fake or meta storage, whose pointer means nothing, its identity."""
    return ("fake", storage._cdata) if fake else (storage.device, storage.data_ptr())


def take_census(roots: dict[str, Root], *, count_fake: bool = False, with_owners: bool = False,
                find_cycles: bool = False, sites: dict | None = None, instances_of: tuple = (),
                name_instance=None) -> dict:
    """Count live tensor storages and attribute them to components of the named roots.

    Returns {"components": {name: {"category", "bytes", "tensors"}}, "live_tensor_bytes",
    "live_tensors", "by_device": {device: bytes}, "fake_tensor_bytes", "seconds"}; with
    `with_owners`, also "owners": {storage_key: component}; with `find_cycles`, also
    "cycle_check" (auditor.capture.census.reference_cycles: what was checked, found, left unknown).
    `sites`: storage_key -> the line that allocated it (auditor.facts.allocation_sites): an unowned
    storage with a site is counted under `allocated at <site>` instead of `unowned`.
    Roots whose weak reference is dead are skipped. `instances_of`: classes whose every live
    instance is a root too (found in the census's own pass over the heap), named by
    `name_instance(obj) -> str | None` (None: not a root) after the given roots: the other
    helpers of a staged method's class (`SparseGPT` objects not called yet, or whose state
    outlives the calls staged) then name their state like the receivers do.
    """
    started = time.perf_counter()
    ledger = _Ledger(count_fake)
    try:
        ledger.survey(instances_of)
        resolved = list(_resolved(roots))
        if name_instance is not None:
            known = {id(obj) for _, obj, _ in resolved}
            for obj in ledger.instances:
                name = None if id(obj) in known else name_instance(obj)
                if name is not None:
                    resolved.append((name, obj, {}))
                    known.add(id(obj))
        ledger.instances.clear()
        categories = walk_roots(resolved, ledger.claim)
        resolved.clear()
        ledger.sweep()
        extra = {"cycle_check": ledger.find_cycles()} if find_cycles else {}
        ledger.found.clear()
        by_site = ledger.name_by_site(sites or {})
        categories.update(by_site)
        if with_owners:
            extra["owners"] = {key: entry.owner for key, entry in ledger.storages.items()}
        # categories provenance may decide: none from the rules, or only an unowned storage's
        automatic = {name for name, category in categories.items() if category is None} | set(by_site) | {UNOWNED}
        summary = ledger.summary({**categories, **_UNOWNED_CATEGORIES}, time.perf_counter() - started,
                                 provenance.live_provenance(), automatic)
        return {**summary, **extra}
    finally:
        ledger.storages.clear()
        ledger.found.clear()
        ledger.instances.clear()


def _resolved(roots: dict[str, Root]) -> Iterator[tuple[str, object, dict[str, str]]]:
    for name, root in roots.items():
        obj = root.obj
        if isinstance(obj, weakref.ReferenceType):
            obj = obj()
            if obj is None:
                continue
        yield name, obj, dict(root.categories or {})
        del obj


class _Storage:
    __slots__ = ("nbytes", "owner", "firmness", "is_bool", "device", "fake")

    def __init__(self, nbytes: int, owner: str, firmness: int, is_bool: bool, device: str, fake: bool):
        self.nbytes, self.owner, self.firmness = nbytes, owner, firmness
        self.is_bool, self.device, self.fake = is_bool, device, fake


class _Ledger:
    """Storage key -> _Storage (bytes, owning component, ...); no tensor is kept after the sweep.

    `weights`: keys of every live parameter's storage. `reserved`: keys of module parameters
    and their gradients, with the component they fall to when no module root contains them;
    only a CONTAINED claim owns one of those."""

    def __init__(self, count_fake: bool):
        self.count_fake = count_fake
        self.storages: dict[tuple, _Storage] = {}
        self.found: list[torch.Tensor] = []
        self.weights: set[tuple] = set()
        self.buffers: set[tuple] = set()  # keys of every module buffer's storage
        self.reserved: dict[tuple, str] = {}
        self.instances: list = []  # live instances of the classes take_census was asked for

    def survey(self, instances_of: tuple = ()) -> None:
        """Every tensor the garbage collector tracks (kept until the sweep) and every module:
        which storages are parameters', and which are module parameters' or their gradients';
        every live instance of `instances_of` (and their subclasses) into `instances`."""
        tensor_types, module_types = subclasses(torch.Tensor), subclasses(torch.nn.Module)
        instance_types = set().union(*(subclasses(cls) for cls in instances_of)) - tensor_types - module_types
        wanted = tensor_types | module_types | instance_types
        objects = gc.get_objects()
        found = [o for o in objects if type(o) in wanted]  # one pass over the heap
        del objects
        if instance_types:
            self.instances = [o for o in found if type(o) in instance_types]
        modules = [o for o in found if type(o) in module_types]
        self.found = [o for o in found if type(o) in tensor_types]
        found.clear()
        for t in self.found:
            if isinstance(t, torch.nn.Parameter):
                self.weights.update(key for key, *_ in self._storages_of(t))
        for module in modules:
            try:
                parameters = list(vars(module).get("_parameters", {}).values())
                buffers = list(vars(module).get("_buffers", {}).values())
            except Exception:  # a half-built module
                continue
            for buffer in buffers:
                if isinstance(buffer, torch.Tensor):
                    self.buffers.update(key for key, *_ in self._storages_of(buffer))
            for param in parameters:
                if isinstance(param, torch.Tensor):
                    self._reserve(param, UNOWNED_PARAMETERS)
                    if param.grad is not None:
                        self._reserve(param.grad, UNOWNED_GRAD)
        modules.clear()

    def _reserve(self, t: torch.Tensor, fallback: str) -> None:
        for key, *_ in self._storages_of(t):
            self.reserved.setdefault(key, fallback)
            if fallback == UNOWNED_PARAMETERS:
                self.weights.add(key)

    def claim(self, t: torch.Tensor, component: str, firmness: int = SWEPT) -> None:
        is_bool = t.dtype is torch.bool
        for key, nbytes, device, fake in self._storages_of(t):
            owner, firm = component, firmness
            if firmness < CONTAINED and key in self.reserved:  # a model's weights: never a wrapper's
                owner, firm = self.reserved[key], SWEPT
            elif firmness == SWEPT and component == UNOWNED and key in self.weights:
                owner = UNOWNED_PARAMETERS  # an alias of a parameter, reached by no root
            entry = self.storages.get(key)
            if entry is None:
                self.storages[key] = _Storage(nbytes, owner, firm, is_bool, device, fake)
                continue
            entry.nbytes = max(entry.nbytes, nbytes)  # two storage objects over one allocation
            if firm > entry.firmness:
                entry.owner, entry.firmness = owner, firm

    def _storages_of(self, t: torch.Tensor, unwrap: bool = True) -> Iterator[tuple[tuple, int, str, bool]]:
        """(key, bytes, device, fake) of each non-empty storage holding `t`'s data (`unwrap`
        False: a wrapper subclass has none, its inner tensors being objects of their own)."""
        for part in _parts(t, unwrap):
            if part.is_meta:  # shapes only, real run or traced (a FakeTensor is on the device it stands for)
                continue
            fake = is_fake(part)
            try:
                storage = part.untyped_storage()
                nbytes = storage.nbytes()
                key = storage_key(storage, fake)
                device = str(part.device)
            except Exception:  # a wrapper subclass without storage of its own
                continue
            if nbytes:
                yield key, nbytes, device, fake

    def sweep(self) -> None:
        """Claim for the unowned components every tensor the survey found."""
        for t in self.found:
            try:
                self.claim(t, UNOWNED_PARAMETERS if isinstance(t, torch.nn.Parameter) else UNOWNED)
                if t.is_leaf and t.requires_grad and t.grad is not None:
                    self.claim(t.grad, UNOWNED_GRAD)
            except Exception:  # an exotic subclass whose metadata cannot be read
                continue

    def find_cycles(self) -> dict:
        """The largest unowned storages kept alive only by an unreachable reference cycle
        move to `unreachable.cycles`; returns what the check did (reference_cycles.check)."""
        candidates = sorted((key for key, entry in self.storages.items()
                             if entry.owner == UNOWNED and not entry.fake
                             and entry.nbytes >= CYCLE_CANDIDATE_BYTES),
                            key=lambda key: self.storages[key].nbytes, reverse=True)[:CYCLE_CANDIDATES]
        found, self.found = self.found, []
        check = reference_cycles.check(candidates, self._keys, found)  # it takes the survey over
        for key, verdict in check.pop("verdicts").items():
            if verdict == reference_cycles.CYCLE:
                self.storages[key].owner = UNREACHABLE_CYCLES
        return check

    def name_by_site(self, sites: dict) -> dict[str, str]:
        """Unowned storages whose allocating line is known take it as their component's name
        (a buffer in a local variable is then `allocated at pruning.py:22 capture`); returns
        the new components' categories."""
        named: dict[str, str] = {}
        for key, entry in self.storages.items():
            where = sites.get(key) if entry.owner == UNOWNED else None
            if where is not None:
                entry.owner = f"{ALLOCATED_AT} {where}"
                kind = BUFFERS if key in self.buffers else MASKS if entry.is_bool else ACTIVATIONS
                named[entry.owner] = kind if named.get(entry.owner, kind) == kind else ACTIVATIONS
        return named

    def _keys(self, t: torch.Tensor) -> list[tuple]:
        """The storages the cycle check groups `t` under: its own (a DTensor is not on its local
        shard's storage there; it holds the shard as a Python object, which the check follows)."""
        return [key for key, *_ in self._storages_of(t, unwrap=False)]

    def summary(self, categories: dict[str, str | None], seconds: float,
                made: provenance.Provenance | None = None, automatic: set[str] | None = None) -> dict:
        made = made or provenance.Provenance()
        components: dict[str, dict] = {}
        all_bool: dict[str, bool] = {}
        all_weights: dict[str, bool] = {}
        all_buffers: dict[str, bool] = {}
        copies: dict[str, list] = {}  # component -> [copy bytes, weights' bytes copied, parameter storages]
        by_device: dict[str, int] = {}
        total = fake_total = counted = 0
        for key, entry in self.storages.items():
            nbytes, owner = entry.nbytes, entry.owner
            if entry.fake:
                fake_total += nbytes
                if not self.count_fake:
                    continue
            component = components.setdefault(owner, {"category": None, "bytes": 0, "tensors": 0})
            component["bytes"] += nbytes
            component["tensors"] += 1
            all_bool[owner] = all_bool.get(owner, True) and entry.is_bool
            all_weights[owner] = all_weights.get(owner, True) and key in self.weights
            buffer = key in self.buffers or key in made.buffers
            all_buffers[owner] = all_buffers.get(owner, True) and buffer and key not in self.weights
            copy = made.copies.get(key) if key not in self.weights and not buffer else None
            if copy is not None:
                held = copies.setdefault(owner, [0, 0, set()])
                held[0] += nbytes
                held[1] += copy[0]
                held[2].add(copy[1])
            by_device[entry.device] = by_device.get(entry.device, 0) + nbytes
            total += nbytes
            counted += 1
        for name, component in components.items():
            copied = copies.get(name)
            if copied is not None:
                component.update(copy_bytes=copied[0], weights_copied=copied[1], parameters_copied=len(copied[2]))
            if name in (automatic or ()):
                if copied is not None and copied[0] >= MOSTLY_COPIES * component["bytes"]:
                    component["category"] = SAVED_COPIES  # made from the weights, whatever its name
                    continue
                if all_buffers[name]:
                    component["category"] = BUFFERS
                    continue
            component["category"] = (categories.get(name) or (MASKS if all_bool[name] else None)
                                     or (WEIGHTS if all_weights[name] else OTHER))
        return {"components": components, "live_tensor_bytes": total, "live_tensors": counted,
                "by_device": by_device, "fake_tensor_bytes": fake_total, "seconds": seconds}


def _parts(t: torch.Tensor, unwrap: bool = True, depth: int = 0) -> tuple[torch.Tensor, ...]:
    """The strided tensors whose storages hold `t`'s data. A wrapper subclass (DTensor,
    and any traceable one: `__tensor_flatten__`) holds its data in its inner tensors (a
    DTensor's local shard), never in a storage of its own: with `unwrap` its parts are
    theirs (its own storage has no data pointer, and is never counted)."""
    if unwrap and type(t) is not torch.Tensor and depth < MAX_WRAPPER_DEPTH:
        inner = _inner_tensors(t)
        if inner is not None:
            return tuple(part for i in inner for part in _parts(i, True, depth + 1))
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


def _inner_tensors(t: torch.Tensor) -> list[torch.Tensor] | None:
    """The inner tensors of a traceable wrapper subclass, or None for any other tensor (a
    FakeTensor, a Parameter, a subclass made with `_make_subclass` has storage of its own)."""
    if not _is_wrapper_subclass(t):
        return None
    try:
        names = t.__tensor_flatten__()[0]  # type: ignore[attr-defined]
    except Exception:  # a flatten that fails outside tracing: its own storage, if any
        return None
    inner = (getattr(t, name, None) for name in names)
    return [i for i in inner if isinstance(i, torch.Tensor) and i is not t]


def _is_wrapper_subclass(t: torch.Tensor) -> bool:
    if is_traceable_wrapper_subclass is not None:
        return is_traceable_wrapper_subclass(t)
    return hasattr(t, "__tensor_flatten__") and hasattr(type(t), "__tensor_unflatten__")


def subclasses(base: type) -> set[type]:
    """`base` and all its subclasses alive now (an exact-type test is far cheaper than
    `isinstance` over the hundreds of thousands of objects the collector tracks)."""
    found, stack = set(), [base]
    while stack:
        cls = stack.pop()
        if cls not in found:
            found.add(cls)
            stack.extend(cls.__subclasses__())
    return found


def is_fake(t: torch.Tensor) -> bool:
    """Meta and FakeTensor tensors hold no memory: their data pointers mean nothing."""
    fake_type = _fake_tensor_type()
    return t.is_meta or (fake_type is not None and isinstance(t, fake_type))


@functools.cache
def _fake_tensor_type() -> type | None:
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:  # private API: absent in some torch versions
        return None
    return FakeTensor
