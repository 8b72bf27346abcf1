"""Live tensor bytes and their true peak, counted storage by storage as torch creates and frees them.

RSS and live tensors are different quantities: RSS also holds the interpreter, libraries and
memory the allocator keeps after a free. This probe counts only tensor storages, exactly,
including the ones autograd saves for backward (which no Python object references, so a
census of Python objects cannot see them). It is a `TorchDispatchMode`: every operator's
outputs pass through it, each new storage is counted once and uncounted by a finalizer when
it dies. It works the same on real and fake tensors, which is what lets a traced run of a 7B
model on this machine be compared byte for byte with a real run of a small one.

Tensors created before the meter starts are seeded from a scan of live objects.
"""
from __future__ import annotations

import gc
import threading
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from auditor.stage import AUDITOR_CODE


class LiveTensorMeter(TorchDispatchMode):
    """Counts live storage bytes; `peak` is the highest count since the last `reset_peak`."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._sizes: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._lock = threading.Lock()

    def seed_existing(self) -> None:
        """Count the tensors already alive (model weights built before the audit began)."""
        gc.collect()  # unreachable cycles still holding tensors are not alive: don't count them
        for obj in gc.get_objects():
            if issubclass(type(obj), torch.Tensor):  # type(): some modules warn on isinstance
                self._track(obj)
                if obj.is_leaf and obj.grad is not None:
                    self._track(obj.grad)

    def reset_peak(self) -> int:
        """Start a new peak interval; returns the peak of the interval that ends."""
        with self._lock:
            ended, self.peak = self.peak, self.live
        return ended

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        with AUDITOR_CODE:  # the meter's bookkeeping inside the program's op: never a stage
            for item in tree_flatten(out)[0]:
                if isinstance(item, torch.Tensor):
                    self._track(item)
        return out

    def _track(self, tensor: torch.Tensor) -> None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
            return
        with self._lock:
            if storage in self._sizes:
                return
            size = storage.nbytes()
            self._sizes[storage] = size
            self.live += size
            self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._release, size)

    def _release(self, size: int) -> None:
        with self._lock:
            self.live -= size


class LiveTensorProbe:
    """The meter as an audit probe: start, end and true peak of live tensor bytes per stage.

    A dispatch mode is thread-local: it counts tensors made on the thread that started the
    audit (on CPU, autograd's backward runs there too).
    """
    key = "live_tensors"

    def __init__(self) -> None:
        self._meter = LiveTensorMeter()
        self._meter.seed_existing()
        self._meter.__enter__()

    def read(self) -> tuple[int, int, int]:
        live = self._meter.live
        return live, live, max(self._meter.peak, live)

    def reset(self) -> None:
        self._meter.reset_peak()

    @staticmethod
    def entry(start: int, end: int, peak: int) -> dict:
        return {"start": start, "end": end, "peak": peak}

    @staticmethod
    def describe() -> dict:
        return {"state": "on", "method": "torch dispatch mode, storages counted once"}

    def close(self) -> None:
        if self._meter is not None:
            self._meter.__exit__(None, None, None)
            self._meter = None
