"""Positioned writes whose aligned bulk bypasses the page cache: the bytes land where they should."""
from __future__ import annotations

import fcntl
import os

import pytest
import torch
from safetensors.torch import load_file

from gradprobe.streaming import direct_writes
from gradprobe.streaming.direct_writes import ALIGN, PositionedFile
from gradprobe.streaming.safetensors_files import SafetensorsWriter


def written(path: str, pieces: dict[int, bytes], size: int, monkeypatch, direct: bool) -> bytes:
    if not direct:
        monkeypatch.setattr(direct_writes, "_open_direct", lambda path, mode=None: None)
    file = PositionedFile(path)
    assert (file.direct is not None) == direct or not direct_supported(path)
    file.truncate(size)
    for offset, data in pieces.items():  # out of order, unaligned, some spanning many buffers
        file.write_at(offset, memoryview(data))
    file.close()
    with open(path, "rb") as handle:
        return handle.read()


def direct_supported(path: str) -> bool:
    return direct_writes._open_direct(path) is not None


@pytest.mark.parametrize("direct", [True, False])
def test_bytes_land_at_their_offsets_whatever_the_alignment(tmp_path, monkeypatch, direct):
    monkeypatch.setattr(direct_writes, "BUFFER_BYTES", 3 * ALIGN)  # a write spans several buffers
    generator = torch.Generator().manual_seed(0)
    sizes = [5, ALIGN - 3, 2 * ALIGN, 7 * ALIGN + 11, 13, 4 * ALIGN + 1]
    pieces, offset = {}, 8
    for size in sizes:
        pieces[offset] = bytes(torch.randint(0, 256, (size,), generator=generator, dtype=torch.uint8).tolist())
        offset += size
    expected = bytearray(offset + 100)
    for start, data in pieces.items():
        expected[start:start + len(data)] = data
    order = dict(reversed(list(pieces.items())))
    assert written(str(tmp_path / "f"), order, len(expected), monkeypatch, direct) == bytes(expected)


def test_a_safetensors_file_written_through_it_loads(tmp_path):
    tensors = {"a": torch.randn(3, 1000).to(torch.bfloat16), "b": torch.arange(12345, dtype=torch.uint8),
               "c": torch.randn(1)}
    path = str(tmp_path / "t.safetensors")
    with SafetensorsWriter(path, {name: (t.dtype, tuple(t.shape)) for name, t in tensors.items()}) as writer:
        for name in ("c", "a", "b"):
            writer.write(name, tensors[name])
    loaded = load_file(path)
    assert all(torch.equal(loaded[name], t) for name, t in tensors.items())


def test_a_filesystem_that_refuses_o_direct_gets_plain_writes(tmp_path, monkeypatch):
    """A descriptor that takes the O_DIRECT open but refuses the write (EINVAL) falls back for good."""
    path = str(tmp_path / "f")
    file = PositionedFile(path)
    if file.direct is None:
        pytest.skip("this filesystem refuses O_DIRECT at open already")
    real = os.pwrite

    def refuse(fd, data, offset):
        if fd == file.direct:
            raise OSError(22, "Invalid argument")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", refuse)
    data = bytes(range(256)) * 64
    file.write_at(1, memoryview(data))
    assert file.direct is None
    file.write_at(1 + len(data), memoryview(data))
    file.close()
    with open(path, "rb") as handle:
        assert handle.read() == b"\0" + data + data


@pytest.mark.parametrize("direct", [True, False])
def test_read_at_reads_back_any_range(tmp_path, monkeypatch, direct):
    monkeypatch.setattr(direct_writes, "BUFFER_BYTES", 2 * ALIGN)
    if not direct:
        monkeypatch.setattr(direct_writes, "_open_direct", lambda path, mode=None: None)
    data = bytes(torch.randint(0, 256, (9 * ALIGN + 77,), generator=torch.Generator().manual_seed(1),
                               dtype=torch.uint8).tolist())
    path = str(tmp_path / "f")
    with open(path, "wb") as handle:
        handle.write(data)
    for offset, length in [(0, len(data)), (3, 5), (ALIGN - 1, 3 * ALIGN + 2), (5 * ALIGN, 4 * ALIGN + 77),
                           (len(data) - 10, 10)]:
        into = bytearray(length)
        assert direct_writes.read_at(path, offset, memoryview(into)) == length
        assert bytes(into) == data[offset:offset + length]
    into = bytearray(100)  # past the end: fewer bytes
    assert direct_writes.read_at(path, len(data) - 40, memoryview(into)) == 40


def test_the_reused_buffer_grows_when_a_write_needs_more(tmp_path, monkeypatch):
    """The aligned buffer outlives the write that made it: one made small serves a larger one too."""
    data = bytes(range(256)) * (12 * ALIGN // 256)
    for buffer_bytes in (ALIGN, 4 * ALIGN):
        monkeypatch.setattr(direct_writes, "BUFFER_BYTES", buffer_bytes)
        path = str(tmp_path / f"f{buffer_bytes}")
        file = PositionedFile(path)
        file.write_at(0, memoryview(data))
        file.close()
        with open(path, "rb") as handle:
            assert handle.read() == data


def test_a_read_the_filesystem_refuses_with_o_direct_is_read_plainly(tmp_path, monkeypatch):
    monkeypatch.setattr(direct_writes, "BUFFER_BYTES", 2 * ALIGN)
    data = bytes(range(256)) * (7 * ALIGN // 256) + b"tail"
    path = str(tmp_path / "f")
    with open(path, "wb") as handle:
        handle.write(data)
    if direct_writes._open_direct(path, os.O_RDONLY) is None:
        pytest.skip("this filesystem refuses O_DIRECT at open already")
    real, calls = os.preadv, []

    def refuse_direct(fd, buffers, offset):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            calls.append(offset)
            if len(calls) > 1:  # the first aligned chunk reads, the next is refused
                raise OSError(22, "Invalid argument")
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", refuse_direct)
    into = bytearray(len(data) - 5)
    assert direct_writes.read_at(path, 5, memoryview(into)) == len(data) - 5
    assert bytes(into) == data[5:] and len(calls) == 2
