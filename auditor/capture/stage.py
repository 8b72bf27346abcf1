"""Stages: named intervals of a run, marked in any code.

    with auditor.stage("gradients/original"):   # or @auditor.stage("select") on a function
        ...
    auditor.mark("after load")                  # a point reading, listed in the record's `marks`
    auditor.track("masks", masks)               # a census root (see auditor.capture.census.take)

`track` is optional for models and optimizers: each census also finds the top-level modules,
the optimizers and the program's own objects in the staged frames (auditor.capture.census.discovered_roots),
after the tracked roots, whose names come first. With the live-tensor meter, censuses are also
taken inside a stage near its live-tensor high (auditor.capture.census.census_at_highs), so one stage around
the work names what many staged calls would.

Without an active audit each call is a module-level check and one read of torch's profiler
flag, so library code can keep its stages in production. With one, the active `Audit` does
the measuring; a stage only tells it where an interval opens and closes.

While a torch profiler records (`torch.profiler.profile`, with or without an audit), every
stage also opens a `torch.profiler.record_function` range of its name, so the stages show in
the profiler's trace and in TensorBoard. This module never imports torch: until the program
has imported it, no profiler can be recording.

The auditor's own code runs inside `AUDITOR_CODE` (a per-thread depth): a staged callable
that the auditor itself calls while measuring (`builtins:len`, `time:perf_counter`...) is then
a plain call, never a stage, so staging it cannot recurse through the auditor.

A name is any object: a str is kept as it is, bytes are decoded as UTF-8 (a byte that is not
kept as `\\xNN`), anything else becomes `str(name)` (its repr if that fails). The record keeps
the text as given; reports and the terminal show its control characters escaped (`\\n`, `\\x1b`).

A decorated function that recurses is one stage: its inner calls run inside the outer call's
stage, whose record says how deep it went (auditor.capture.recursion). A decorated `async def`
is staged where it is awaited, in its asyncio task (each task keeps its own stack of stages, as a
thread does: auditor.capture.stage_book); a decorated generator function's stage covers only the
call that creates the generator, which the record's warnings say.
"""
from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Literal

from auditor.capture.recursion import (
    DECORATED_FRAMES,
    awaited_call,
    current_task,
    end_room,
    inside,
    open_call,
    room,
    staged_call,
)

_active = None  # the Audit in progress, or None; set only by Audit.__enter__/__exit__

_PROFILER = "torch.autograd.profiler"
_modules = sys.modules
# torch.autograd.profiler once the program has loaded it. Its `_is_profiler_enabled` is the
# flag torch keeps "for fast python checks" (set by torch.profiler.profile, emit_nvtx and
# emit_itt): one attribute read, where the C query costs a call. Any: a module looked up at
# run time (or _WithoutFlag), whose attributes torch types nowhere this module can see.
_profiler: Any = None
_ranges = threading.local()  # per thread, `stack`: [(stage, record_function)] still open
_open_ranges = 0  # in all threads: while 0, a closing stage skips the thread-local lookup
_ranges_lock = threading.Lock()


class _WithoutFlag:
    """Stands for a torch that lacks the flag: its profiler sees no stages."""
    _is_profiler_enabled = False


def _load_profiler():
    global _profiler
    module = _modules.get(_PROFILER)
    if module is not None and hasattr(module, "record_function"):  # not half-imported
        _profiler = module if hasattr(module, "_is_profiler_enabled") else _WithoutFlag
    return _profiler


def profiler_recording() -> bool:
    """True while a torch profiler records (always False before the program imports torch)."""
    profiler = _profiler
    if profiler is None and _PROFILER in _modules:
        profiler = _load_profiler()
    return profiler is not None and profiler._is_profiler_enabled


class _OwnCalls(threading.local):
    depth = 0  # > 0 while this thread runs the auditor's own code


_own = _OwnCalls()


class _AuditorCode:
    """`with AUDITOR_CODE:` around the auditor's own work. Built from attribute reads and
    integer arithmetic only: no call a user could have staged."""
    __slots__ = ()

    def __enter__(self):
        _own.depth += 1

    def __exit__(self, exc_type, exc, tb):
        _own.depth -= 1


AUDITOR_CODE = _AuditorCode()


def in_auditor_code() -> bool:
    """True while this thread runs the auditor's own code (staged calls pass straight through)."""
    return _own.depth > 0


def active_audit():
    """The audit in progress, or None."""
    return _active


def _set_active(audit) -> None:
    global _active
    _active = audit


class stage:
    """A named stage: a context manager, or a decorator that stages every call.

    The stage object keeps no per-entry state (the audit's and the profiler ranges'
    per-thread stacks do), so one object may be entered from several threads or re-entered
    recursively.
    """

    __slots__ = ("name",)
    call: dict[str, object] | None = None  # what a staged callable's stage adds to its entry (CallStage)

    def __init__(self, name: str):
        self.name = name if type(name) is str else as_text(name)

    def __enter__(self) -> stage:
        # profiler_recording(), inlined: a stage with nothing to do stays one call cheap.
        # The range encloses the audit's stage, so its own cost stays out of the stage's
        # measurement.
        profiler = _profiler
        if profiler is None and _PROFILER in _modules:
            with AUDITOR_CODE:
                profiler = _load_profiler()
        recording = profiler is not None and profiler._is_profiler_enabled
        audit = _active
        if audit is None and not recording:
            return self
        if _own.depth:  # opened by a signal handler or a finalizer that ran inside the auditor's own work
            _skipped(self.name)
            return self
        with AUDITOR_CODE:
            try:
                room()  # the bookkeeping's frames on top of the program's (auditor.capture.recursion)
            except RecursionError:  # not even the room to count: this stage goes unrecorded
                return self
            try:
                if recording:
                    _open_range(self)
                if audit is not None:
                    try:
                        audit.open_stage(self.name, self, self.call)
                    except BaseException:
                        _close_range(self)
                        raise
            finally:
                end_room()
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        audit = _active
        if audit is None and not _open_ranges:
            return False
        with AUDITOR_CODE:
            try:
                room()
            except RecursionError:
                return False
            try:
                if audit is not None:
                    audit.close_stage(self, exc)
            finally:
                if _open_ranges:
                    _close_range(self)
                end_room()
        return False

    def __call__(self, function):
        name = self.name
        kind = _function_kind(function)
        if kind == "coroutine function":  # the stage is the awaited call's, in the task that awaits it
            @functools.wraps(function)
            async def staged_coroutine(*args, **kwargs):  # recursing in its task: one stage, as a function's
                return await awaited_call((staged_coroutine, current_task()), stage(name), function, args, kwargs,
                                          recursed)
            return staged_coroutine
        unsaid = [kind is not None]

        @functools.wraps(function)
        def staged(*args, **kwargs):
            if unsaid[0] and _active is not None:
                unsaid[0] = False
                _say_generator(name, kind)
            if _active is None:
                profiler = _profiler  # profiler_recording(), inlined as in __enter__
                if profiler is None and _PROFILER in _modules:
                    profiler = _load_profiler()
                if profiler is None or not profiler._is_profiler_enabled:
                    return function(*args, **kwargs)
            depth = open_call(staged)
            if depth is not None:  # recursing: inside the outer call's stage
                return inside(depth, function, args, kwargs, DECORATED_FRAMES)
            return staged_call(staged, stage(name), function, args, kwargs, recursed, DECORATED_FRAMES)
        return staged

    def __repr__(self) -> str:
        return f"auditor.stage({self.name!r})"


class CallStage(stage):
    """The stage of one call of a staged callable (auditor.capture.staging.targets): its entry's `call` is
    {"target": "SparseGPT.add_batch", "index": 113, "label": "model.layers.3.mlp.down_proj"}."""

    __slots__ = ("call",)

    def __init__(self, name: str, call: dict[str, object]):
        self.name, self.call = name, call


def _open_range(opener: stage) -> None:
    global _open_ranges
    span = _profiler.record_function(opener.name)
    span.__enter__()
    stack = getattr(_ranges, "stack", None)
    if stack is None:
        stack = _ranges.stack = []
    stack.append((opener, span))
    with _ranges_lock:
        _open_ranges += 1


def _close_range(opener: stage) -> None:
    """Close `opener`'s range if it is this thread's innermost one (a stage entered before
    the profiler started has none). Ranges are per thread, so they nest as stages do. (One
    stage object re-entered inside itself just as a profiler stops may close its outer
    range at the inner exit: the profiler has stopped by then.)"""
    global _open_ranges
    stack = getattr(_ranges, "stack", None)
    if not stack or stack[-1][0] is not opener:
        return
    _, span = stack.pop()
    with _ranges_lock:
        _open_ranges -= 1
    span.__exit__(None, None, None)


def _function_kind(function) -> str | None:
    """"coroutine function", "generator function" or "async generator function" (their calls
    only create what runs later), or None for a callable that runs when called."""
    import inspect  # at decoration only
    if inspect.iscoroutinefunction(function):
        return "coroutine function"
    if inspect.isasyncgenfunction(function):
        return "async generator function"
    return "generator function" if inspect.isgeneratorfunction(function) else None


def _say_generator(name: str, kind: str) -> None:
    """A decorated generator's stage covers the call that creates it, not its iteration: said once."""
    audit = _active
    if audit is not None:
        with AUDITOR_CODE:
            article = "an" if kind[0] == "a" else "a"
            audit._warn(f"stage {name!r} decorates {article} {kind}: its stage covers only the call that "
                        "creates the generator, not the iteration that runs its body; put `with auditor.stage(...)` "
                        "around the loop that consumes it")


def recursed(opener: stage, deepest: int) -> None:
    """A staged callable re-entered while its call `opener` was open, `deepest` calls deep."""
    audit = _active
    if audit is not None:
        with AUDITOR_CODE:
            audit.recursed(opener, deepest)


def as_text(name: object) -> str:
    """A stage or mark name as text (see the module's docstring)."""
    if isinstance(name, str):
        return str(name)
    if isinstance(name, (bytes, bytearray, memoryview)):
        return bytes(name).decode("utf-8", "backslashreplace")
    for show in (str, repr):
        try:
            return show(name)
        except Exception:  # a __str__ that fails: try the next way
            continue
    return f"<{type(name).__name__}>"


class _Unrecorded:
    """Stages and marks a signal handler or a finalizer opened while its thread ran the auditor's
    own work (a stage's bookkeeping): they are not recorded, since measuring each inside another's
    measurement lets a frequent signal nest handlers without end (a timer every 5 ms overflowed
    the C stack); the audit says how many at its end (`said`)."""
    count = 0
    first: str | None = None


def _skipped(name: str) -> None:
    if _Unrecorded.first is None:
        _Unrecorded.first = name
    _Unrecorded.count += 1


def unrecorded_said() -> str | None:
    """The warning for the stages and marks not recorded since the last call, or None."""
    count, first = _Unrecorded.count, _Unrecorded.first
    _Unrecorded.count, _Unrecorded.first = 0, None
    if not count:
        return None
    return (f"{count:,} stage(s) or mark(s) opened while the auditor was measuring (in a signal handler or a "
            f"finalizer that ran inside a stage's bookkeeping; the first {first!r}) are not recorded: their time "
            "and memory are in the stage around them")


def mark(name: str) -> None:
    """Record a point reading (RSS, and the opt-in probes) under the current stage."""
    audit = _active
    if audit is not None and _own.depth:
        _skipped(name if type(name) is str else as_text(name))
        return
    if audit is not None:
        with AUDITOR_CODE:
            try:
                room()
            except RecursionError:
                return
            try:
                audit.mark(name if type(name) is str else as_text(name))
            finally:
                end_room()


def track(name: str, obj, categories: dict[str, str] | None = None) -> None:
    """Register `obj` as a census root called `name` (held weakly where the object allows)."""
    audit = _active
    if audit is not None:
        with AUDITOR_CODE:
            text = name if type(name) is str else as_text(name)  # a key of the roots: hashable, shown
            try:
                if categories is not None and not _is_text_map(categories):
                    audit._warn(f"auditor.track({text!r}): categories should map attribute names to category "
                                f"names, both text; what is not, in the {type(categories).__name__} given, is ignored")
                    categories = _text_pairs(categories)
                audit.track(text, obj, categories)
            except Exception as error:  # the audit's own failure never reaches the program
                audit._fault(f"tracking {text!r}", error)


def _is_text_map(categories: object) -> bool:
    return type(categories) is dict and all(type(k) is str and type(v) is str for k, v in categories.items())


def _text_pairs(categories: object) -> dict[str, str] | None:
    """The text pairs of what was given as categories, or None."""
    try:
        pairs = {k: v for k, v in dict(categories).items()  # type: ignore[call-overload]
                 if type(k) is str and type(v) is str}
    except Exception:  # not a mapping at all
        return None
    return pairs or None
