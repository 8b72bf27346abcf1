"""Stages: named intervals of a run, marked in any code.

    with auditor.stage("gradients/original"):   # or @auditor.stage("select") on a function
        ...
    auditor.mark("after load")                  # a point reading, listed in the record's `marks`
    auditor.track("masks", masks)               # a census root (see auditor.census)

Without an active audit each call is a single module-level check, so library code can keep
its stages in production. With one, the active `Audit` does the measuring; a stage only
tells it where an interval opens and closes.
"""
from __future__ import annotations

import functools

_active = None  # the Audit in progress, or None; set only by Audit.__enter__/__exit__


def active_audit():
    """The audit in progress, or None."""
    return _active


def _set_active(audit) -> None:
    global _active
    _active = audit


class stage:
    """A named stage: a context manager, or a decorator that stages every call.

    The stage object keeps no per-entry state (the audit's per-thread stack does), so one
    object may be entered from several threads or re-entered recursively.
    """

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __enter__(self) -> "stage":
        audit = _active
        if audit is not None:
            audit.open_stage(self.name, self)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        audit = _active
        if audit is not None:
            audit.close_stage(self, exc)
        return False

    def __call__(self, function):
        name = self.name

        @functools.wraps(function)
        def staged(*args, **kwargs):
            if _active is None:
                return function(*args, **kwargs)
            with stage(name):
                return function(*args, **kwargs)
        return staged

    def __repr__(self) -> str:
        return f"auditor.stage({self.name!r})"


def mark(name: str) -> None:
    """Record a point reading (RSS, and the opt-in probes) under the current stage."""
    audit = _active
    if audit is not None:
        audit.mark(name)


def track(name: str, obj, categories: dict[str, str] | None = None) -> None:
    """Register `obj` as a census root called `name` (held weakly where the object allows)."""
    audit = _active
    if audit is not None:
        audit.track(name, obj, categories)
