"""Resident set size, with an exact peak inside each stage.

On Linux, writing "5" to /proc/self/clear_refs resets the kernel's high-water mark VmHWM,
so VmHWM read at a stage's end is the highest RSS since its start: no sampler, no missed
spikes. (This also resets ru_maxrss: `/usr/bin/time` under-reports on an audited process.)
Where clear_refs is unavailable, or a write to it fails mid-run, a sampling thread keeps the
maximum instead and the record says so.
"""
from __future__ import annotations

import contextlib
import errno
import os
import threading

from auditor.capture.stage import AUDITOR_CODE
from auditor.record.schema import Readings

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"
SAMPLE_INTERVAL_S = 0.002


def _status_kib(data: bytes, field: bytes) -> int:
    start = data.index(field) + len(field)
    return int(data[start:data.index(b"kB", start)])


class StatusFile:
    """/proc/self/status held open and read again from its start: a reading needs no new file
    descriptor, so a program that holds every one its RLIMIT_NOFILE allows (EMFILE) is still
    measured (opening it at each reading failed there, and the run lost its RSS). Opened
    again in a forked child, whose /proc/self is another process."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._pid = -1
        self._identity = (-1, -1)
        self._lock = threading.Lock()  # the sampler's thread reads it too

    def read(self) -> tuple[int, int]:
        """(VmRSS, VmHWM) in bytes."""
        with self._lock:
            fd = self._fd
            if fd is None or not self._ours():
                fd = os.open(_STATUS, os.O_RDONLY | os.O_CLOEXEC)
                self._fd, self._pid = fd, os.getpid()
                self._identity = _identity(fd)
            data = os.pread(fd, 1 << 16, 0)
        return _status_kib(data, b"VmRSS:") * 1024, _status_kib(data, b"VmHWM:") * 1024

    def _ours(self) -> bool:
        """Whether our descriptor is still ours: the program may have closed it (a daemon's
        closerange) and its number may name one of the program's files now, never to be read
        or closed by us."""
        if self._fd is None or self._pid != os.getpid():
            return False
        try:
            return _identity(self._fd) == self._identity
        except OSError:
            return False

    def close(self) -> None:
        with self._lock:
            if self._ours() and self._fd is not None:
                os.close(self._fd)
            self._fd = None


def _identity(fd: int) -> tuple[int, int]:
    stat = os.fstat(fd)
    return stat.st_dev, stat.st_ino


def read_status() -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes, from one read of /proc/self/status."""
    with open(_STATUS, "rb") as f:
        data = f.read()
    return _status_kib(data, b"VmRSS:") * 1024, _status_kib(data, b"VmHWM:") * 1024


def current_rss() -> int:
    try:
        return read_status()[0]
    except (OSError, ValueError):
        import psutil
        return psutil.Process().memory_info().rss


class RssProbe:
    key = "rss"

    def __init__(self):
        self.method = "clear_refs"
        self.reason = None
        self._fd = None
        self._sampler = None
        self._status = StatusFile()
        try:
            self._status.read()
            self._fd = os.open(_CLEAR_REFS, os.O_WRONLY)
            self._identity = os.fstat(self._fd).st_ino
            os.write(self._fd, b"5")
        except (OSError, ValueError) as error:
            self.fall_back(f"cannot reset VmHWM through {_CLEAR_REFS} ({error})")

    def fall_back(self, why: str) -> None:
        """Sample from now on (clear_refs unavailable, or failing mid-run)."""
        self._close_clear_refs()
        self.method = "sampler"
        self.reason = (f"{why}; peaks come from sampling every {SAMPLE_INTERVAL_S * 1000:g} ms "
                       "and may miss short spikes")
        self._sampler = _Sampler(SAMPLE_INTERVAL_S, self._status)

    def read(self) -> tuple[int, int, int]:
        if self._sampler is not None:
            rss = self._sampler.rss()
            return rss, rss, self._sampler.high_water(rss)
        rss, hwm = self._status.read()
        return rss, rss, max(hwm, rss)

    def reset(self) -> None:
        if self._sampler is not None:
            self._sampler.reset()
        else:
            try:
                ours = os.fstat(self._fd).st_ino == self._identity
            except OSError:
                ours = False
            if not ours:  # the program closed it: its number may name the program's file now
                self._fd = None
                raise OSError(errno.EBADF, "the program closed the clear_refs file descriptor")
            os.write(self._fd, b"5")

    @staticmethod
    def entry(start: int, end: int, peak: int) -> Readings:
        return Readings(start=start, end=end, peak=peak)

    def describe(self) -> dict:
        info = {"state": "on", "method": self.method}
        if self.reason:
            info["reason"] = self.reason
        return info

    def close(self) -> None:
        self._close_clear_refs()
        self._status.close()

    def _close_clear_refs(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):  # already closed under us: nothing left to release
                os.close(fd)
        if self._sampler is not None:
            sampler, self._sampler = self._sampler, None
            sampler.stop()


class _Sampler:
    """Fallback: a daemon thread that keeps the highest RSS seen since the last reset."""

    def __init__(self, interval_s: float, status: StatusFile):
        self._status = status
        self._interval_s = interval_s
        self._max = self.rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="auditor-rss-sampler", daemon=True)
        self._thread.start()

    def rss(self) -> int:
        try:
            return self._status.read()[0]
        except (OSError, ValueError):  # no /proc/self/status at all
            import psutil
            return psutil.Process().memory_info().rss

    def _run(self) -> None:
        with AUDITOR_CODE:  # the auditor's thread: what it calls is never a stage
            while not self._stop.wait(self._interval_s):
                try:
                    rss = self.rss()
                except (OSError, ValueError):  # no reading this time (psutil out of descriptors too)
                    continue
                if rss > self._max:
                    self._max = rss

    def high_water(self, rss: int) -> int:
        return max(self._max, rss)

    def reset(self) -> None:
        self._max = self.rss()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
