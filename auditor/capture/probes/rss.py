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
        try:
            read_status()
            self._fd = os.open(_CLEAR_REFS, os.O_WRONLY)
            self._identity = os.fstat(self._fd).st_ino
            os.write(self._fd, b"5")
        except (OSError, ValueError) as error:
            self.fall_back(f"cannot reset VmHWM through {_CLEAR_REFS} ({error})")

    def fall_back(self, why: str) -> None:
        """Sample from now on (clear_refs unavailable, or failing mid-run)."""
        self.close()
        self.method = "sampler"
        self.reason = (f"{why}; peaks come from sampling every {SAMPLE_INTERVAL_S * 1000:g} ms "
                       "and may miss short spikes")
        self._sampler = _Sampler(SAMPLE_INTERVAL_S)

    def read(self) -> tuple[int, int, int]:
        if self._sampler is not None:
            rss = self._sampler.rss()
            return rss, rss, self._sampler.high_water(rss)
        rss, hwm = read_status()
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
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):  # already closed under us: nothing left to release
                os.close(fd)
        if self._sampler is not None:
            sampler, self._sampler = self._sampler, None
            sampler.stop()


class _Sampler:
    """Fallback: a daemon thread that keeps the highest RSS seen since the last reset."""

    def __init__(self, interval_s: float):
        import psutil
        self._process = psutil.Process()
        self._interval_s = interval_s
        self._max = self.rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="auditor-rss-sampler", daemon=True)
        self._thread.start()

    def rss(self) -> int:
        return self._process.memory_info().rss

    def _run(self) -> None:
        with AUDITOR_CODE:  # the auditor's thread: what it calls is never a stage
            while not self._stop.wait(self._interval_s):
                rss = self.rss()
                if rss > self._max:
                    self._max = rss

    def high_water(self, rss: int) -> int:
        return max(self._max, rss)

    def reset(self) -> None:
        self._max = self.rss()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
