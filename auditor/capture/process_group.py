"""A job command's children, each in a process group of its own, ended with the command.

    with ending_signals():                      # SIGTERM, SIGHUP, Ctrl-C: each child's group gets the
        with child_group(command) as process:   # signal, then the command raises Stopped (a
            process.wait()                      # KeyboardInterrupt) where it is, as Ctrl-C does
    ...
    except KeyboardInterrupt as stop:
        return exit_status(stop)                # 128 + the signal, as a shell shows it: 143 for SIGTERM

Why a group of its own: a SIGTERM sent to the command's pid alone (a scheduler, `kill PID`)
used to end the command and leave its children running as orphans, and a launcher's child (the
command `auditor compare` measures) with them. Signalling the child's whole group reaches its
own children too, and `end` sends SIGKILL to what is left after a grace period.

Why PR_SET_PDEATHSIG: SIGKILL cannot be caught, so a command killed by it cannot end anything.
Linux sends the child a signal of our choosing when the thread that started it dies (so start
children from a thread that waits for them). Elsewhere children outlive a SIGKILLed command.
It is set between fork and exec, in the child: the child pays nothing for it (no import).
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

GRACE_S = 10  # for an interrupted child to write its record before SIGKILL
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1
_live: dict[int, subprocess.Popen] = {}  # pid (= its group's id) -> the children running now


class Stopped(KeyboardInterrupt):
    """A signal that ends the command (SIGTERM, SIGHUP, or Ctrl-C under `ending_signals`),
    raised where the command was, as Ctrl-C raises KeyboardInterrupt. `forwarded`: every
    running child's group got the signal already."""

    def __init__(self, signum: int, forwarded: bool = False):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.forwarded = signum, forwarded


def signal_of(error: BaseException) -> int:
    """The signal behind an interruption: its own, else SIGINT (a plain KeyboardInterrupt)."""
    return getattr(error, "signum", None) or signal.SIGINT


def exit_status(error: BaseException) -> int:
    """The command's exit status after `error` stopped it: 128 + the signal (130 for Ctrl-C)."""
    return 128 + signal_of(error)


def interruption(error: BaseException) -> str:
    """In words: "interrupted" (Ctrl-C), "interrupted (SIGTERM)"."""
    signum = signal_of(error)
    return "interrupted" if signum == signal.SIGINT else f"interrupted ({signal.Signals(signum).name})"


@contextlib.contextmanager
def ending_signals() -> Iterator[None]:
    """While inside: SIGTERM, SIGHUP and SIGINT are sent on to every running child's group,
    then raise `Stopped` here. A signal the command was started ignoring (nohup, a background
    job's SIGINT) stays ignored; outside the main thread nothing changes."""
    before: dict[int, object] = {}
    try:
        for signum in ENDING_SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                before[signum] = signal.signal(signum, _stop)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for restored, handler in before.items():
            signal.signal(restored, handler)  # type: ignore[arg-type]


def _stop(signum: int, frame) -> None:
    for pid in list(_live):
        _signal_group(pid, signum)
    # A child another thread waits for (validate-projection's traced run) gets no `end`: SIGKILL
    # whatever still runs after the grace period, from a thread that dies with the command.
    later = threading.Timer(GRACE_S, _kill_every_group)
    later.daemon = True
    later.start()
    raise Stopped(signum, forwarded=True)


@contextlib.contextmanager
def child_group(command: list[str], *, death_signal: int = signal.SIGKILL, **popen) -> Iterator[subprocess.Popen]:
    """`subprocess.Popen(command, **popen)` as the leader of a new process group, sent
    `death_signal` when the starting thread dies. An exception while it runs (Ctrl-C, SIGTERM,
    anything) ends its group (`end`) before going on."""
    process = subprocess.Popen(command, preexec_fn=_own_group(os.getpid(), death_signal), **popen)
    try:
        _live[process.pid] = process
        yield process
    except BaseException as error:
        if process.returncode is None:
            end(process, error)
        raise
    finally:
        _live.pop(process.pid, None)


def end(process: subprocess.Popen, error: BaseException | None = None, grace_s: float = GRACE_S) -> int:
    """End the child's group after `error` (a Stopped, KeyboardInterrupt, or anything else:
    SIGTERM): its signal, unless already forwarded; SIGKILL to whatever of the group is left
    after `grace_s` (at once on a second interruption). The child's exit status."""
    signum = signal_of(error) if isinstance(error, KeyboardInterrupt) else signal.SIGTERM
    if not getattr(error, "forwarded", False):
        _signal_group(process.pid, signum)
    deadline = time.monotonic() + grace_s
    try:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
        while _group_alive(process.pid) and time.monotonic() < deadline:  # a launcher's child, say
            time.sleep(0.05)
    except KeyboardInterrupt:  # asked again: now
        pass
    kill_group(process)
    return process.wait()


def _kill_every_group() -> None:
    for pid in list(_live):
        _signal_group(pid, signal.SIGKILL)


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL to the child's whole group (the child and what it started)."""
    _signal_group(process.pid, signal.SIGKILL)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # ended already
        os.killpg(pgid, signum)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _own_group(parent: int, death_signal: int):
    """The child's first act, between fork and exec: a group of its own, and `death_signal`
    when the starting thread dies (ended at once if we died before it was set)."""
    prctl = _prctl()

    def in_child() -> None:
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
            if os.getppid() != parent:
                os.kill(os.getpid(), death_signal)
    return in_child


@functools.lru_cache(maxsize=1)
def _prctl():
    """libc's prctl, looked up before the fork (nothing is loaded in the child); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
