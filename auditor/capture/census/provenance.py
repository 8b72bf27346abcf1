"""Provenance: which live storages hold a copy of the weights, as the live-tensor meter saw them made.

A storage is a copy of the weights when an operator that copies values (`clone`, `_to_copy`:
`.to(dtype)`, `.to(device)`, `.float()`; `copy_` into a storage that is not a parameter's;
`contiguous`, `index`, `index_select`, `masked_select`, `gather`, `cat`, `stack`, any
`*_copy` operator) made it from a parameter's storage, or from a storage that is itself such a
copy. What it is called, and where it is kept, does not matter: a `backup` dict, a state dict
cloned, a copy moved to fp16 are all copies. Values computed from the weights (`W * mask`,
`W.abs()`, a norm) are not copies: they are new values.

Each copy records how many bytes *of the weights* it holds the values of (`covered`: its
elements times the weights' own element size, so an fp16 copy of fp32 weights covers all of
their bytes in half as many) and the census key of the parameter storage it came from.

The meter (auditor.capture.probes.live_tensors) follows copies as operators run; the census
(auditor.capture.census.take) asks the meters counting now for the live copies and module buffers, by
storage key, through `live_provenance()`: a lower layer than the probes, so the meters
register here (`counting`) instead of the census importing them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

# Operators whose output holds values copied from their first tensor argument (or, for
# `cat`/`stack`, from each tensor of the list). `copy_` is followed separately: it writes into
# an existing storage.
COPY_OPS = frozenset({
    "aten::clone", "aten::_to_copy", "aten::contiguous", "aten::index", "aten::index_select",
    "aten::masked_select", "aten::gather", "aten::take", "aten::cat", "aten::stack",
    "aten::_unsafe_index", "aten::narrow_copy", "aten::lift_fresh_copy",
})
LIST_OPS = frozenset({"aten::cat", "aten::stack"})  # sources: every tensor of the first argument
COPY_INTO = "aten::copy_"


def is_copy(op: str) -> bool:
    """Does operator `op` ("aten::clone") make a storage of values copied from its input?"""
    return op in COPY_OPS or (op.endswith("_copy") and op.startswith("aten::"))


# What the meter knows of a storage's origin (a cell's KIND)
NONE, PARAMETER, COPY, BUFFER = 0, 1, 2, 3


@dataclass
class Provenance:
    """Live storages by census key: copies of the weights (key -> (bytes of the weights
    covered, the key of the parameter storage copied)) and module buffers' keys."""
    copies: dict[tuple, tuple[int, tuple | None]] = field(default_factory=dict)
    buffers: set[tuple] = field(default_factory=set)
    followed: bool = False  # a meter counted: no copy here means none was made while it ran


class Source(Protocol):
    def provenance(self) -> Provenance: ...


_SOURCES: list[Source] = []


def counting(source: Source, on: bool) -> None:
    """A meter starts (`on`) or stops following copies."""
    if on:
        _SOURCES.append(source)
    elif source in _SOURCES:
        _SOURCES.remove(source)


def live_provenance() -> Provenance:
    """What the meters counting now know of the live storages (empty, `followed` False, with none)."""
    found = Provenance(followed=bool(_SOURCES))
    for source in list(_SOURCES):
        seen = source.provenance()
        found.copies.update(seen.copies)
        found.buffers |= seen.buffers
    return found
