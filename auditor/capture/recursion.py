"""Recursion under audit: the program may recurse as deep as it could without the auditor.

Python stops a thread at `sys.getrecursionlimit()` frames (1,000 by default). The auditor adds
frames of its own: each open staged call has its wrapper's frames under the program's, and
every stage boundary runs the audit's bookkeeping on top of the program's frames. So that a
program that fits under the limit alone also fits under audit, and the bookkeeping never
raises RecursionError into it:

- each open staged call lends its wrapper frames to the limit (`lend`, `take_back`), so the
  program's own frames have the room they have alone;
- the bookkeeping at a boundary runs with `ROOM` frames more (`room`, `end_room`);
- a staged callable re-entered on a thread while a call of it is open there (a recursive
  function) is no new stage: it runs inside the outer call's stage, whose record says how deep
  it recursed (`call.recursed`). A thousand-deep recursion is one stage, not a thousand nested.

The limit is the process's: while a thread's staged calls are open, other threads have that
room too (a program recursing without end then stops a few frames deeper than alone). A limit
the program sets while the auditor lends frames is kept, the loan on top of it; what
`sys.getrecursionlimit` tells the program is its own limit, the loan not counted (the first loan
puts `program_limit` and `set_program_limit` in `sys`'s two functions' place).
"""
from __future__ import annotations

import contextlib
import re
import sys
import threading

ROOM = 250  # frames for the bookkeeping at a stage boundary (a census's walks included)
WRAPPER_FRAMES = 2  # a staged call's wrapper and the function that runs the call inside its stage
DECORATED_FRAMES = 1  # a function decorated with auditor.stage has its wrapper alone too: one more under audit
SLACK = 5  # once per open staged call: the frames that lending itself takes at the deepest call

_lock = threading.RLock()  # re-entrant: a signal handler may stage calls while its thread is in here
_lent = 0  # frames added to the program's limit now, in all threads
_set = 0  # the limit last set here (0: none): another value means the program set its own
_base = 0  # the program's own limit, the loan not counted
_getlimit, _setlimit = sys.getrecursionlimit, sys.setrecursionlimit


def _change(frames: int) -> int:
    """Lend `frames` more (negative: take them back); returns the limit before."""
    global _lent, _set, _base
    with _lock:
        if sys.getrecursionlimit is _getlimit:  # the program reads and sets its own limit, never the loan
            sys.getrecursionlimit, sys.setrecursionlimit = program_limit, set_program_limit
        current = _getlimit()
        if current != _set:  # the program set its own limit (or none was set here yet)
            _base = current
        _lent += frames
        # Too low for the frames open now (a loan taken back deep in a recursion): the higher
        # limit stays until a later change can set it; `_base` keeps the program's own.
        with contextlib.suppress(RecursionError, ValueError):
            _setlimit(_base + _lent)
        _set = _getlimit()
        return current


def program_limit() -> int:
    """`sys.getrecursionlimit` as the program sees it: its own limit, not the frames lent on top."""
    current = _getlimit()
    return _base if _lent and current == _set else current


def set_program_limit(limit: int) -> None:
    """`sys.setrecursionlimit` as the program calls it: its limit, the frames lent now on top."""
    global _base, _set
    with _lock:
        if _lent and type(limit) is int and limit > 0:
            try:
                _setlimit(limit + _lent)  # too low where alone it is: the frames lent are below the program's too
            except RecursionError as error:  # python's words, in the program's numbers
                depth = re.findall(r"depth (\d+)", str(error))
                if not depth:
                    raise
                at = int(depth[0]) - _lent - 1  # neither the frames lent nor this function's own
                raise RecursionError(f"cannot set the recursion limit to {limit} at the recursion depth {at}: "
                                     "the limit is too low") from None
            _base, _set = limit, _getlimit()
            return
    _setlimit(limit)  # nothing lent, or a value python refuses: as python does


def lend(frames: int = WRAPPER_FRAMES) -> None:
    _change(frames)


def take_back(frames: int = WRAPPER_FRAMES) -> None:
    _change(-frames)


def room() -> None:
    """`ROOM` frames more for the auditor's bookkeeping, until `end_room`."""
    _change(ROOM)


def end_room() -> None:
    _change(-ROOM)


def current_task():
    """The asyncio task running on this thread, or None (asyncio never imported: None)."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None or asyncio.events._get_running_loop() is None:
        return None
    return asyncio.current_task()


class Depth:
    """How deep one open staged call has recursed on its thread (1: not re-entered)."""
    __slots__ = ("now", "deepest")

    def __init__(self) -> None:
        self.now = self.deepest = 1


class _OpenCalls(threading.local):
    def __init__(self) -> None:
        self.calls: dict[object, Depth] = {}  # a staged callable -> its open call on this thread


_open = _OpenCalls()


def open_call(key: object) -> Depth | None:
    """This thread's open call of the staged callable `key`, or None."""
    return _open.calls.get(key)


def inside(depth: Depth, function, args: tuple, kwargs: dict, frames: int = WRAPPER_FRAMES):
    """A re-entered staged callable: a plain call, counted in its outer call's `depth`. `frames`:
    the auditor's frames each call adds to what the program has alone."""
    depth.now += 1
    try:
        if depth.now > depth.deepest:
            depth.deepest = depth.now
        lend(frames)
        try:
            return function(*args, **kwargs)
        finally:
            take_back(frames)
    finally:
        depth.now -= 1


def staged_call(key: object, opened, function, args: tuple, kwargs: dict, recursed, frames: int = WRAPPER_FRAMES):
    """`function` called inside stage `opened` (entered here), as the open call of `key` on this
    thread; `recursed(opened, deepest)` says how deep it recursed before the stage closes."""
    calls = _open.calls
    depth = calls[key] = Depth()
    loan = frames + SLACK - (WRAPPER_FRAMES - frames)  # measured: as deep as alone, to the call
    lend(loan)
    try:
        with opened:
            try:
                return function(*args, **kwargs)
            finally:
                if depth.deepest > 1:
                    recursed(opened, depth.deepest)
    finally:
        del calls[key]
        take_back(loan)


async def awaited_call(key: object, opened, function, args: tuple, kwargs: dict, recursed):
    """A staged coroutine function's call awaited inside stage `opened`, or, when `key` (the
    function and its asyncio task) has a call open already, inside that call's stage, counted
    in its depth. No frames lent: the awaiting wrapper is there without the auditor too."""
    calls = _open.calls
    depth = calls.get(key)
    if depth is not None:
        depth.now += 1
        depth.deepest = max(depth.deepest, depth.now)
        try:
            return await function(*args, **kwargs)
        finally:
            depth.now -= 1
    depth = calls[key] = Depth()
    try:
        with opened:
            try:
                return await function(*args, **kwargs)
            finally:
                if depth.deepest > 1:
                    recursed(opened, depth.deepest)
    finally:
        del calls[key]
