"""Every file the auditor writes, written so that a symlink planted at its name is never followed.

Run folders are shared and committed: anyone can plant `report.md -> ~/.bashrc` in one. Opening
such a name for writing would write through the link, outside the folder. So a file is never
opened at its own name: its content goes into a temporary created exclusively beside it
(a unique name, O_CREAT|O_EXCL|O_NOFOLLOW: a link there makes the open fail, never followed),
which is then renamed over the name. A rename replaces a symlink itself, never its target, and a
reader never sees half a file; a write that fails (disk full) leaves the name as it was and no
temporary behind.

    write_text(path, text)            write_bytes(path, data)            write_json(path, value)
    with replaced(path, "wb") as f:   # for writers that take a file: figure.savefig(f, format="png")
        ...
    open_new(path)                    # a file created here, never there before (an append-only log)
    read_file(path)                   # a record's bytes: a FIFO or a device planted there is refused, never waited on
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
TRIES = 100  # unique names drawn before giving up (another process would have to take each)


def open_new(path: str | os.PathLike, extra_flags: int = 0, mode: int = 0o666) -> int:
    """A descriptor of a file created at `path` now: FileExistsError if anything is there,
    a symlink (even one to nowhere) included, so nothing is ever written through a link."""
    return os.open(path, NEW_FILE | extra_flags, mode)


def read_file(path: str | os.PathLike) -> bytes:
    """The bytes of the regular file at `path` (a link to one counts). A FIFO planted at a record's
    name would make a read wait forever for a writer, a device never end: OSError instead."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "it is a folder", str(path))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "it is not a regular file (a FIFO, a device or a socket)", str(path))
        with os.fdopen(fd, "rb") as file:
            fd = -1  # the file object closes it
            return file.read()
    finally:
        if fd >= 0:
            os.close(fd)


def _temporary(path: Path) -> tuple[int, Path]:
    # a name near the 255-byte limit keeps its head: the temporary's own name must fit too
    head = path.name if len(os.fsencode(path.name)) <= 200 else path.name[:50]
    for _ in range(TRIES):
        tmp = path.with_name(f".{head}.{secrets.token_hex(6)}.tmp")
        try:
            return open_new(tmp), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {str(path)!r}")


@contextlib.contextmanager
def replaced(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[Any]:
    """A file to write `path`'s new content into ("w" text or "wb" bytes); on leaving the block
    it replaces `path` whole (fsynced, renamed over it); an exception leaves `path` untouched."""
    if mode not in ("w", "wb"):
        raise ValueError(f"replaced() writes a whole file: mode 'w' or 'wb', not {mode!r}")
    path = Path(path)
    fd, tmp = _temporary(path)
    try:
        # text: a file name that is not UTF-8 ('caf\udce9', as python reads it) written as its own bytes
        text = mode == "w"
        with os.fdopen(fd, mode, encoding=encoding if text else None,
                       errors="surrogateescape" if text else None) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    with replaced(path, "w", encoding) as file:
        file.write(text)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with replaced(path, "wb") as file:
        file.write(data)


def write_json(path: str | os.PathLike, value: Any, indent: int | None = 1) -> None:
    """`value` as JSON and a newline; a value JSON cannot hold raises before anything is created."""
    write_text(path, json.dumps(value, indent=indent) + "\n")
