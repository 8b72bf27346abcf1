"""The auditor's dispatch modes (the live-tensor meter, the size recorder, the traced run's value-
free mode), made so that they never load torch._dynamo on the program's behalf.

torch wraps every TorchDispatchMode subclass's `__torch_dispatch__` in `torch._disable_dynamo`,
which imports torch._dynamo at the first operator: inductor, sympy and numpy with it, about 800
modules and 75 MiB of RSS that the audited program never asked for, measured as its own (a
one-line program: 1,124 modules loaded plain, 2,047 under the meter). Dynamo only has to stay out
of a mode's frames while it can compile, which it cannot before the program loads it; so a
`MeasuringMode` calls its `__torch_dispatch__` directly until torch._dynamo is loaded, and
through `torch._dynamo.disable` from then on, as torch would.
"""
from __future__ import annotations

import functools
import os
import sys

from torch.utils._python_dispatch import TorchDispatchMode


class _Forked:
    """Whether this process is a fork of the one the modes were entered in: a forked child
    (a DataLoader worker) inherits the dispatch mode stack with the rest of its memory."""
    child = False


os.register_at_fork(after_in_child=lambda: setattr(_Forked, "child", True))


class MeasuringMode(TorchDispatchMode):
    """A TorchDispatchMode that keeps dynamo out of its frames without loading dynamo.

    A mode that only observes (`observes_only`) lets a forked child's operators pass straight
    through: the child is not audited, and its copy of the mode's lock may be held by a thread
    the fork did not copy."""

    observes_only = False

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # torch's wrapper would load dynamo; __init_subclass__ wraps lazily instead

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        raw = cls.__dict__.get("__torch_dispatch__")
        if raw is not None and not isinstance(raw, classmethod):
            cls.__torch_dispatch__ = _skipped_by_dynamo_once_loaded(raw)


def _skipped_by_dynamo_once_loaded(raw):
    disabled = None

    @functools.wraps(raw)
    def dispatch(self, func, types, args=(), kwargs=None):
        nonlocal disabled
        if _Forked.child and self.observes_only:
            return func(*args, **(kwargs or {}))
        if disabled is None:
            dynamo = sys.modules.get("torch._dynamo")
            if getattr(dynamo, "disable", None) is None:  # not loaded (or still loading)
                return raw(self, func, types, args, kwargs)
            disabled = dynamo.disable(raw, recursive=True)
        return disabled(self, func, types, args, kwargs)
    return dispatch
