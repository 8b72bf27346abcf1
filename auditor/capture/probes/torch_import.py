"""The moment the program's `import torch` finishes, for a live-tensor meter that waits for it.

The meter is a torch dispatch mode: starting it imports torch, which a program without torch
must not pay for (+200 MiB RSS, ~1 GB of address space). So a run whose program has not
imported torch yet waits for it; were the meter to start only at the next stage boundary,
tensors made between the import and that boundary (a model built outside any stage, a run with
no stage at all) would be missed at their peak. This finder sits on `sys.meta_path`, finds
`torch` through the finders after it, and calls `then()` once torch's module has run, inside
the program's own import statement. It never changes what is imported, and a `then` that
fails is its caller's to report: nothing is raised into the import.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import sys
import threading
from collections.abc import Callable
from typing import Any

WATCHED = "torch"


class _Loader(importlib.abc.Loader):
    """torch's own loader, with `then()` after its module ran."""

    def __init__(self, loader: Any, then: Callable[[], None]):
        self._loader, self._then = loader, then

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        with contextlib.suppress(Exception):  # the caller reports its own failures
            self._then()

    def __getattr__(self, name: str) -> Any:  # resources, source, ...: torch's loader answers
        return getattr(self._loader, name)


class TorchImportWatch(importlib.abc.MetaPathFinder):
    """`then()` once, right after the program first imports torch (`remove` when no longer wanted)."""

    def __init__(self, then: Callable[[], None]):
        self._then = then
        self._finding = threading.local()
        sys.meta_path.insert(0, self)

    def find_spec(self, fullname, path, target=None):
        if fullname != WATCHED or getattr(self._finding, "busy", False):
            return None
        self._finding.busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._finding.busy = False
        if spec is None or spec.loader is None:
            return None  # torch is not installed: the import fails as it would alone
        self.remove()
        spec.loader = _Loader(spec.loader, self._then)
        return spec

    def remove(self) -> None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
