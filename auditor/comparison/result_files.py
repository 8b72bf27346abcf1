"""Results in safetensors files: a digest of their content, and how many elements differ.

Elements are compared bit for bit (same dtype: each element's bytes; a NaN equals the same
NaN, -0.0 differs from 0.0); tensors of different dtypes are compared by value. A tensor
present on one side only, or with another shape, counts every one of its elements as
differing. Tensors are read one at a time, so memory stays at about two tensors.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

SAME_SIZE_INTEGER = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def digest(path: str | Path) -> tuple[str, int]:
    """sha256 over every tensor's name, dtype, shape and bytes (names sorted), and the
    total number of elements."""
    import torch
    from safetensors import safe_open
    sha, total = hashlib.sha256(), 0
    with safe_open(str(path), framework="pt") as file:
        for name in sorted(file.keys()):
            tensor = file.get_tensor(name)
            sha.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
            sha.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            total += tensor.numel()
    return sha.hexdigest(), total


def differing_elements(reference: str | Path, other: str | Path) -> int:
    """Elements of `other` that differ from `reference`, over the union of tensor names."""
    from safetensors import safe_open
    differing = 0
    with safe_open(str(reference), framework="pt") as ref, safe_open(str(other), framework="pt") as oth:
        ref_names, other_names = set(ref.keys()), set(oth.keys())
        for name in sorted(ref_names | other_names):
            if name not in other_names:
                differing += ref.get_tensor(name).numel()
            elif name not in ref_names:
                differing += oth.get_tensor(name).numel()
            else:
                differing += _differing(ref.get_tensor(name), oth.get_tensor(name))
    return differing


def _differing(a, b) -> int:
    import torch
    if a.shape != b.shape:
        return max(a.numel(), b.numel())
    if a.dtype == b.dtype and a.element_size() in SAME_SIZE_INTEGER:
        a, b = _raw(a), _raw(b)
    return int(torch.count_nonzero(a != b))


def _raw(tensor):
    """The tensor's elements as same-sized integers (their bits), flat."""
    import torch
    tensor = tensor.contiguous().reshape(-1)
    if tensor.dtype == torch.bool:
        return tensor.view(torch.uint8)
    return tensor.view(getattr(torch, SAME_SIZE_INTEGER[tensor.element_size()]))
