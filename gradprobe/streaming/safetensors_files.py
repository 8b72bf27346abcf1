"""Safetensors files read and written one tensor at a time, with plain reads and writes.

Why not `safetensors.safe_open`: it maps the whole file, and every page it touches counts in the
process's RSS until the file is closed, so a layer read through it is resident twice (the mapped
file and the tensor). Here a tensor is read with one `readinto` into its own buffer, and written
into a file whose header was laid out in advance, so tensors can be written in any order, as they
are produced, without ever holding a whole file in memory (their bulk bypasses the page cache:
`direct_writes`). The files are ordinary safetensors:
`safetensors.torch.load_file` and `transformers` read them.

Format: 8 bytes little-endian header length N, N bytes of JSON header
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`, then the data,
offsets relative to its start, tensors back to back.

A tensor without values (a fake tensor of a traced run, or a meta tensor) has no bytes to read
or write: it is made or taken with its shape and dtype, and the file's bytes are left alone. So
the auditor's traced run goes through the same reads and writes as a real one (the files keep
their full layout, unwritten), and measures the same tensors.
"""
from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import is_fake

from .direct_writes import PositionedFile, read_at

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
          "U8": torch.uint8, "BOOL": torch.bool}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes lie on disk."""
    path: str
    offset: int  # from the start of the file
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def read_header(path: str) -> dict[str, StoredTensor]:
    """Every tensor of one safetensors file, by name."""
    with open(path, "rb") as file:
        size_bytes = file.read(8)
        if len(size_bytes) < 8:
            raise ValueError(f"{path!r} is not a safetensors file (shorter than its header length)")
        (size,) = struct.unpack("<Q", size_bytes)
        try:
            header = json.loads(file.read(size))
        except (ValueError, UnicodeDecodeError) as error:
            raise ValueError(f"{path!r} is not a safetensors file: {error}") from None
    header.pop("__metadata__", None)
    stored = {}
    for name, entry in header.items():
        if entry["dtype"] not in DTYPES:
            raise ValueError(f"{path!r}: tensor {name!r} has dtype {entry['dtype']}, "
                             f"not one of {', '.join(DTYPES)}")
        begin, _ = entry["data_offsets"]
        stored[name] = StoredTensor(path, 8 + size + begin, DTYPES[entry["dtype"]], tuple(entry["shape"]))
    return stored


def holds_values(tensor: torch.Tensor) -> bool:
    """Whether the tensor has bytes of its own (not a traced run's fake tensor, not on meta)."""
    return not is_fake(tensor) and tensor.device.type != "meta"


def read_tensor(stored: StoredTensor, into: torch.Tensor | None = None, once: bool = False) -> torch.Tensor:
    """The tensor's bytes read straight into a fresh tensor of its stored dtype (or `into`).

    once: the file is read this once (scratch): its bulk bypasses the page cache (`read_at`)."""
    tensor = torch.empty(stored.shape, dtype=stored.dtype) if into is None else into
    if not holds_values(tensor):
        return tensor
    buffer = tensor.view(-1).view(torch.uint8).numpy().data  # a byte view: numpy has no bfloat16
    if once:
        read = read_at(stored.path, stored.offset, buffer)
    else:
        with open(stored.path, "rb") as file:
            file.seek(stored.offset)
            read = file.readinto(buffer)
    if read != stored.nbytes:
        raise ValueError(f"{stored.path!r} ends inside a tensor: the file is truncated")
    return tensor


class SafetensorsWriter:
    """A safetensors file whose layout is fixed first; tensors are then written in any order.

        with SafetensorsWriter(path, {name: (dtype, shape), ...}) as writer:
            writer.write(name, tensor)      # each declared name exactly once
    """

    def __init__(self, path: str, layout: dict[str, tuple[torch.dtype, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None):
        self.path, self.layout = path, layout
        header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
        offsets: dict[str, int] = {}
        end = 0
        for name, (dtype, shape) in layout.items():
            size = math.prod(shape) * dtype.itemsize
            header[name] = {"dtype": DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [end, end + size]}
            offsets[name], end = end, end + size
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # data starts 8-byte aligned, as the reference writer does
        self.data_start, self.offsets = 8 + len(text), offsets
        self.written: set[str] = set()
        self.file = PositionedFile(path)
        self.file.write_at(0, memoryview(struct.pack("<Q", len(text)) + text))
        self.file.truncate(self.data_start + end)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        dtype, shape = self.layout[name]
        if tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"{name}: declared {dtype} {tuple(shape)}, got {tensor.dtype} {tuple(tensor.shape)}")
        self.written.add(name)
        self._write_at(name, 0, tensor)

    def write_in_parts(self, name: str, parts: Iterable[tuple[int, torch.Tensor]]) -> None:
        """`name`'s values as (first element, flat part) pairs that cover it in order: a tensor
        never whole in memory (a 7B mask written from one reused 2 MiB buffer)."""
        dtype, shape = self.layout[name]
        covered = 0
        for first, part in parts:
            if part.dtype != dtype or first != covered:
                raise ValueError(f"{name}: a part of {part.dtype} at element {first}, expected {dtype} at {covered}")
            self._write_at(name, first * dtype.itemsize, part)
            covered += part.numel()
        if covered != math.prod(shape):
            raise ValueError(f"{name}: parts cover {covered} of {math.prod(shape)} elements")
        self.written.add(name)

    def _write_at(self, name: str, byte_offset: int, tensor: torch.Tensor) -> None:
        if holds_values(tensor):
            self.file.write_at(self.data_start + self.offsets[name] + byte_offset,
                               tensor.detach().contiguous().view(-1).view(torch.uint8).numpy().data)

    def close(self) -> None:
        self.file.close()
        missing = set(self.layout) - self.written
        if missing:
            os.remove(self.path)  # a half-written file must not pass for a result
            raise ValueError(f"{self.path!r}: {len(missing)} declared tensor(s) never written, "
                             f"e.g. {sorted(missing)[0]!r}")

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if kind is None:
            self.close()
        else:  # a half-written file must not pass for a result
            self.file.close()
            os.remove(self.path)
