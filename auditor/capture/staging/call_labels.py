"""Labels for staged calls: which part of the model each call worked on, in the model's names.

    SparseGPT.add_batch#113  ->  "call": {"target": "SparseGPT.add_batch", "index": 113,
                                          "label": "model.layers.3.mlp.down_proj"}

The default label, the first that applies: the receiver is an nn.Module -> its qualified name;
the receiver holds an nn.Module attribute (`self.layer`) -> that module's; the first nn.Module
positional argument -> its; else None. A user hook, `Audit(stage_label=fn)` or `auditor run
--label module:function`, comes first: `fn(target_name, args, kwargs) -> str | None` with
the call's own arguments (a method's `self` first), None keeping the default. A hook that
raises or returns anything else is switched off with a warning; the program goes on.

Qualified names are those of `named_modules()` of the module's root (the module that is no
other module's child), without a prefix for the root itself (the root's own label is its
class name). Modules seen in a staged call (receiver, its module attribute, module arguments)
seed an index of trees, provisionally: a module passed to a call may be part of a larger
model. A scan of every object (`gc.get_objects()`) finds the true roots and settles every
name; it runs when a name is needed that is only provisional, at most once a second and at
most 1/20 of the time since the previous one (~70 ms with transformers loaded), its time and
transient memory kept out of the stages (Audit.own_work). The index holds modules weakly: it
never keeps one alive.

torch is never imported here (nn.Module is looked up in sys.modules): no module can exist
before the program imports torch.
"""
from __future__ import annotations

import gc
import sys
import threading
import time
import weakref
from typing import Any

from auditor.capture.staging.user_imports import import_named

_MISSING = object()
MIN_SCAN_INTERVAL_S = 1.0
SCAN_SHARE = 0.05  # a scan of cost c waits c / SCAN_SHARE before the next one


def _module_class():
    """torch.nn.Module once the program has imported torch, else None."""
    return getattr(sys.modules.get("torch.nn.modules.module"), "Module", None)


_Entry = tuple[weakref.ref[Any], str, bool]  # (the module, its qualified name, settled)


class ModuleNames:
    """Qualified module names, from an index of module trees held by weak references."""

    def __init__(self) -> None:
        self._names: dict[int, _Entry] = {}  # id(module) -> (weakref, name, settled)
        self._lock = threading.RLock()
        self._next_scan = 0.0  # perf_counter time before which no scan runs
        self.scans = 0

    def seed(self, module) -> None:
        """Index `module`'s tree provisionally, unless the module is already known."""
        with self._lock:
            if self._entry(module) is None:
                self._index(module, settled=False)

    def needs_scan(self, module) -> bool:
        """True when `module`'s name is unknown or provisional and a scan is allowed now."""
        entry = self._entry(module)
        return (entry is None or not entry[2]) and time.perf_counter() >= self._next_scan

    def scan(self) -> None:
        """Index every tree from its true root, found among all live objects."""
        Module = _module_class()
        if Module is None:
            return
        with self._lock:
            began = time.perf_counter()
            modules = [obj for obj in gc.get_objects() if issubclass(type(obj), Module)]
            children = set()
            for module in modules:  # a child is any module held in another's _modules
                for child in (getattr(module, "__dict__", {}).get("_modules") or {}).values():
                    children.add(id(child))
            roots = [module for module in modules if id(module) not in children]
            del modules
            self._names.clear()
            for root in roots:
                self._index(root, settled=True)
            del roots
            self.scans += 1
            cost = time.perf_counter() - began
            self._next_scan = time.perf_counter() + max(MIN_SCAN_INTERVAL_S, cost / SCAN_SHARE)

    def name(self, module) -> str | None:
        """The qualified name (the class name for a root), or None if unknown."""
        entry = self._entry(module)
        if entry is None:
            return None
        return entry[1] or type(module).__name__

    def _entry(self, module):
        entry = self._names.get(id(module))
        return entry if entry is not None and entry[0]() is module else None

    def _index(self, root, settled: bool) -> None:
        try:
            named = list(root.named_modules())
        except Exception:  # a module half-built, or one that refuses: left unnamed
            return
        for name, module in named:
            self._put(module, name, settled)

    def _put(self, module, name: str, settled: bool) -> None:
        key = id(module)
        entry = self._names.get(key)
        ref = entry[0] if entry is not None and entry[0]() is module else None
        if ref is None:
            def forget(dead: weakref.ref[Any], key: int = key, names: dict[int, _Entry] = self._names) -> None:
                entry = names.get(key)
                if entry is not None and entry[0] is dead:  # not a newer module given the same id
                    names.pop(key, None)
            try:
                ref = weakref.ref(module, forget)
            except TypeError:
                return
        self._names[key] = (ref, name, settled)


class CallLabels:
    """The labels of one audit's staged calls. Holds no reference to the audit (it is the
    audit's own, see auditor.capture.staging.targets) nor, beyond a call, to any module."""

    def __init__(self, hook=None):
        self.hook = hook
        self.names = ModuleNames()
        self._failed = False

    def label(self, audit, target_name: str, args: tuple, kwargs: dict, receiver: bool) -> str | None:
        """The call's label; never raises (labels that fail are switched off, with a warning)."""
        if self._failed:
            return None
        try:
            with audit.own_work("labels_s"):
                hooked = self._from_hook(audit, target_name, args, kwargs)
                if hooked is not None:
                    return hooked
                module = self._subject(args, kwargs, receiver)
                if module is None:
                    return None
                scan = self.names.needs_scan(module)
            if scan:
                with audit.own_work("labels_s", transient_memory=True):
                    self.names.scan()
            return self.names.name(module)
        except Exception as error:  # the auditor's own failure never reaches the program
            self._failed = True
            audit._warn(f"call labels failed, switched off: {type(error).__name__}: {error}")
            return None

    def instance_label(self, obj) -> tuple[bool, str | None]:
        """(ready, label) for an object of a staged class met outside any call (the census
        found it alive): the default rule on it as a receiver, never the user's hook (it
        expects a call's arguments). Not ready while its module's name is provisional and no
        scan is allowed now: the caller asks again later rather than keep a wrong name."""
        if self._failed:
            return False, None
        try:
            module = self._subject((obj,), {}, True)
            if module is None:
                return True, None
            if self.names.needs_scan(module):
                self.names.scan()
            entry = self.names._entry(module)
            if entry is None or not entry[2]:
                return False, None
            return True, self.names.name(module)
        except Exception:  # the auditor's own failure never reaches the program
            return False, None

    def _from_hook(self, audit, target_name: str, args: tuple, kwargs: dict) -> str | None:
        if self.hook is None:
            return None
        hook = self.hook
        try:
            label = hook(target_name, args, kwargs)
        except Exception as error:
            problem = f"raised {type(error).__name__}: {error}"
        else:
            if label is None or isinstance(label, str):
                return label
            problem = f"returned a {type(label).__name__}, not a str or None"
        self.hook = None
        audit._warn(f"stage_label {_describe(hook)} {problem}; switched off, default labels "
                    "from here on")
        return None

    def _subject(self, args: tuple, kwargs: dict, receiver: bool):
        """The module the call worked on (see the module's docstring), every module seen in
        the call seeding the index."""
        Module = _module_class()
        if Module is None:
            return None
        subject = None
        if receiver and args:
            owner, args = args[0], args[1:]
            if isinstance(owner, Module):
                subject = owner
            else:
                subject = next((value for value in getattr(owner, "__dict__", {}).values()
                                if isinstance(value, Module)), None)
            if subject is not None:
                self.names.seed(subject)
        for value in args:
            if isinstance(value, Module):
                self.names.seed(value)
                subject = value if subject is None else subject
        for value in kwargs.values():
            if isinstance(value, Module):
                self.names.seed(value)
        return subject


def _describe(hook) -> str:
    module, name = getattr(hook, "__module__", None), getattr(hook, "__qualname__", None)
    return f"{module}:{name}" if module and name else repr(hook)


def resolve_hook(spec: str):
    """The function named by "module:function" (--label), imported as a stage target is.
    Raises ValueError with a one-line message."""
    module_name, _, qualname = spec.partition(":")
    if not module_name or not qualname:
        raise ValueError(f"--label {spec!r} should look like module:function")
    obj: object = import_named(module_name, "--label")
    for depth, part in enumerate(qualname.split(".")):
        found = getattr(obj, part, _MISSING)
        if found is _MISSING:
            where = ".".join([module_name, *qualname.split(".")[:depth]])
            raise ValueError(f"--label {spec!r}: {where} has no attribute {part!r}")
        obj = found
    if not callable(obj) or isinstance(obj, type):
        raise ValueError(f"--label {spec!r} is not a function (it is a {type(obj).__name__}); "
                         "give fn(target_name, args, kwargs) -> str | None")
    return obj

