"""Positioned writes (and reads of files read once) whose bulk bypasses the page cache (`O_DIRECT`).

A 7B prune writes about 25 GB (pruned weights, masks, G0 scratch). Through the page cache each
written page is first a freshly allocated cache page: on this project's 2-core VM one 7B layer's
654 MB of outputs took 1.43 s buffered, 1.42 s of it system CPU, against 0.29 s and 0.02 s with
`O_DIRECT` (`benchmarks/gradprobe_streaming.py --part writes`, medians of 3, in
reports/gradprobe-streaming.md). The cache pages would also push the input weights out of the cache, which the next
pass reads again.

Each write's 4 KiB-aligned middle goes through a reused aligned buffer to an `O_DIRECT` descriptor;
the unaligned head and tail (under 4 KiB each) through an ordinary one. A page is therefore only
ever written one way: a head or tail page lies outside every aligned middle. Where `O_DIRECT` is
refused (tmpfs, some network filesystems), every write is an ordinary one.

A file written this way is not in the page cache; one that is read once (G0 on scratch) is read
back the same way, `read_at`, so no cache page is made for it either.
"""
from __future__ import annotations

import errno
import mmap
import os

ALIGN = 4096  # offsets, lengths and the buffer's address: the strictest usual O_DIRECT requirement
BUFFER_BYTES = 8 << 20  # the aligned bounce buffer, reused for every write of the process


class _Bounce:
    """One page-aligned anonymous buffer (mmap is page aligned), made on first use and kept: its
    pages stay resident, so copying into it costs no page faults after the first write."""

    buffer: mmap.mmap | None = None

    @classmethod
    def get(cls, size: int) -> mmap.mmap:
        """The buffer, at least `size` bytes (made again, larger, if it is smaller)."""
        if cls.buffer is None or len(cls.buffer) < size:
            cls.buffer = mmap.mmap(-1, size)
        return cls.buffer


class PositionedFile:
    """A new file (created or truncated) written at any offsets: `write_at(offset, bytes_view)`."""

    def __init__(self, path: str):
        self.path = path
        self.plain = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.direct: int | None = _open_direct(path)

    def truncate(self, size: int) -> None:
        os.ftruncate(self.plain, size)

    def write_at(self, offset: int, data: memoryview) -> None:
        data = data.cast("B")
        middle_start, middle_end = _aligned_middle(offset, len(data))
        if self.direct is None or middle_end <= middle_start:
            self._plain(offset, data)
            return
        self._plain(offset, data[:middle_start - offset])
        self._direct(self.direct, middle_start, data[middle_start - offset:middle_end - offset])
        self._plain(middle_end, data[middle_end - offset:])

    def close(self) -> None:
        if self.direct is not None:
            os.close(self.direct)
            self.direct = None
        os.close(self.plain)

    def _plain(self, offset: int, data: memoryview) -> None:
        while len(data):
            written = os.pwrite(self.plain, data, offset)
            data, offset = data[written:], offset + written

    def _direct(self, direct: int, offset: int, data: memoryview) -> None:
        """Aligned writes through the O_DIRECT descriptor `direct` (self.direct, checked open)."""
        with memoryview(_Bounce.get(BUFFER_BYTES)) as view:
            for start in range(0, len(data), BUFFER_BYTES):
                chunk = data[start:start + BUFFER_BYTES]
                view[:len(chunk)] = chunk
                try:
                    written = os.pwrite(direct, view[:len(chunk)], offset + start)
                except OSError as error:
                    if error.errno != errno.EINVAL:
                        raise
                    written = 0  # this filesystem takes no O_DIRECT after all
                if written != len(chunk):  # the rest as plain writes, and every later write too
                    os.close(direct)
                    self.direct = None
                    self._plain(offset + start + written, data[start + written:])
                    return


def _aligned_middle(offset: int, length: int) -> tuple[int, int]:
    """The ALIGN-aligned span inside [offset, offset + length); empty where start >= end."""
    return -(-offset // ALIGN) * ALIGN, (offset + length) // ALIGN * ALIGN


def _open_direct(path: str, mode: int = os.O_WRONLY) -> int | None:
    flag = getattr(os, "O_DIRECT", None)
    if flag is None:
        return None
    try:
        return os.open(path, mode | flag)
    except OSError:
        return None


def read_at(path: str, offset: int, into: memoryview) -> int:
    """Read `len(into)` bytes of `path` from `offset` into `into`, the aligned bulk with `O_DIRECT`.

    Returns the number of bytes read (fewer at the end of the file)."""
    into = into.cast("B")
    direct = _open_direct(path, os.O_RDONLY)
    plain = os.open(path, os.O_RDONLY)
    try:
        start, end = _aligned_middle(offset, len(into))
        if direct is None or end <= start:
            return _read_plain(plain, offset, into)
        done = _read_plain(plain, offset, into[:start - offset])
        with memoryview(_Bounce.get(BUFFER_BYTES)) as view:
            for at in range(start, end, BUFFER_BYTES):
                length = min(BUFFER_BYTES, end - at)
                try:
                    got = os.preadv(direct, [view[:length]], at)
                except OSError as error:
                    if error.errno != errno.EINVAL:
                        raise
                    # opened with O_DIRECT but refused to read that way: the rest as plain reads
                    return done + _read_plain(plain, at, into[at - offset:])
                into[at - offset:at - offset + got] = view[:got]
                done += got
                if got < length:  # the file ends here
                    return done
        return done + _read_plain(plain, end, into[end - offset:])
    finally:
        os.close(plain)
        if direct is not None:
            os.close(direct)


def _read_plain(fd: int, offset: int, into: memoryview) -> int:
    done = 0
    while done < len(into):
        got = os.preadv(fd, [into[done:]], offset + done)
        if got == 0:
            break
        done += got
    return done
