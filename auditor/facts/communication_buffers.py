"""Which library calls make communication buffers, and of what kind: the tensors a distributed
library allocates for its collectives, found by the library frame and operator that made them.

auditor.facts.allocation_sites walks the frames between an operator and the program's own line; where
one of them is a maker below, the site it gives ends with ` (kind)`, and the reports count the
storage as a communication buffer of that kind (auditor.analysis.ranks.merged per stage and rank).

- DDP: the Reducer allocates its gradient buckets (`aten::empty`, from C++) when
  DistributedDataParallel is built, and again when it rebuilds them in the forward after the
  first step.
- FSDP2 (`fully_shard`; its collectives module, `_fsdp_collectives.py`): `foreach_all_gather`
  allocates one flat buffer per layer group for the all-gather's output, whose slice for this rank
  is its input (copied in from the shards, or a flat copy in the parameter dtype under mixed
  precision): all-gather buffers. `foreach_all_gather_copy_out` makes temporaries for parameters
  sharded on a dim other than 0 (also all-gather buffers); the unsharded parameters it fills
  (`init_all_gather_outputs`, storages resized to full and to 0 from then on) are the weights.
  `foreach_reduce` allocates the reduce-scatter input, the group's unsharded gradients in one flat
  buffer (and, for dim-i sharding, their concatenation): reduce-scatter buffers. Its output is
  not one: a view of it becomes each parameter's sharded `.grad` (the census names it gradients),
  as PyTorch's FSDPMemTracker counts it (sharded gradients, its reduce-scatter figure being the
  input alone); so is the copy in the parameters' dtype made from it under mixed precision.
- DTensor: what `redistribute_local_tensor` makes (padding, the collective's output, the
  unpadded result) are redistribution buffers.
- Functional collectives (`torch.distributed._functional_collectives`): what their Python side
  makes around the c10d operator (the output of `all_gather_tensor` and the concatenation when
  gathering on a dim other than 0); the c10d operators' own outputs are counted by their operator
  where no maker names them (auditor.analysis.ranks.merged).

Files are matched by the end of their path (`os.sep` + name, so torch's older folders for the
same module match too) and functions by name; a maker whose file or function a torch version
lacks never matches, and nothing else changes. Makers are tried in order, first match wins, over
all the library frames of the walk (the outer purpose can outrank an inner one: a DTensor
redistribution's functional collective is the redistribution's buffer).
"""
from __future__ import annotations

import linecache
import os
from dataclasses import dataclass

DDP_BUCKETS = "DDP gradient buckets"
FSDP2_ALL_GATHER = "FSDP2 all-gather buffers"
FSDP2_REDUCE_SCATTER = "FSDP2 reduce-scatter buffers"
DTENSOR_REDISTRIBUTION = "DTensor redistribution buffers"
FUNCTIONAL_COLLECTIVES = "functional collective buffers"
KINDS = (DDP_BUCKETS, FSDP2_ALL_GATHER, FSDP2_REDUCE_SCATTER, DTENSOR_REDISTRIBUTION, FUNCTIONAL_COLLECTIVES)


@dataclass(frozen=True)
class Maker:
    """A library function whose new tensors are (or, kind None, are not) communication buffers."""
    path: str                     # the library file, by the end of its path
    function: str | None          # None: any function of the file
    kind: str | None              # None: not a buffer (a rule that outranks a wider one)
    ops: frozenset | None = None  # operators that allocate one there; None: any
    statement: str | None = None  # only where the frame's current line holds this text


def _file(*parts: str) -> str:
    return os.path.join(*parts)


_FSDP_COLLECTIVES = _file("_fsdp_collectives.py")
_EMPTY = frozenset({"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty"})
_ALLOCATING = _EMPTY | {"aten::cat", "aten::_chunk_cat", "aten::div"}
MAKERS: tuple[Maker, ...] = (
    Maker(_file("nn", "parallel", "distributed.py"), "_ddp_init_helper", DDP_BUCKETS, _EMPTY),
    Maker(_file("nn", "parallel", "distributed.py"), "_pre_forward", DDP_BUCKETS, _EMPTY),
    # FSDP2: the unsharded parameters and the sharded gradients are no buffers (listed first: they
    # outrank the collectives that call them)
    Maker(_file("_fsdp_param.py"), "init_all_gather_outputs", None),
    Maker(_file("_fsdp_common.py"), "_to_dtype_if_needed", None),
    Maker(_FSDP_COLLECTIVES, "foreach_reduce", None, _ALLOCATING, statement="reduce_output = "),
    Maker(_FSDP_COLLECTIVES, "foreach_reduce", FSDP2_REDUCE_SCATTER, _ALLOCATING),
    Maker(_FSDP_COLLECTIVES, "foreach_all_gather", FSDP2_ALL_GATHER),
    Maker(_FSDP_COLLECTIVES, "foreach_all_gather_copy_out", FSDP2_ALL_GATHER, _ALLOCATING),
    Maker(_file("tensor", "_redistribute.py"), "redistribute_local_tensor", DTENSOR_REDISTRIBUTION),
    Maker(_file("_tensor", "redistribute.py"), "redistribute_local_tensor", DTENSOR_REDISTRIBUTION),
    Maker(_file("_functional_collectives.py"), None, FUNCTIONAL_COLLECTIVES),
)
_MISS = -1
_candidates: dict = {}  # code object -> indices into MAKERS whose file and function it is


def maker_of(code, lineno: int, op: str) -> int:
    """The index in MAKERS of the first maker that a frame running `code` at `lineno` is and
    `op` allocates for, or _MISS."""
    found = _candidates.get(code)
    if found is None:
        filename = code.co_filename
        found = _candidates[code] = tuple(
            i for i, maker in enumerate(MAKERS)
            if (maker.function is None or maker.function == code.co_name)
            and filename.endswith(os.sep + maker.path))
    for i in found:
        maker = MAKERS[i]
        if maker.ops is not None and op not in maker.ops:
            continue
        if maker.statement is not None and maker.statement not in linecache.getline(code.co_filename, lineno):
            continue
        return i
    return _MISS


def kind_of(frames, op: str) -> tuple[str | None, object]:
    """Over `frames` (the library frames between the operator and the program, innermost
    first): (the kind the first-ranked maker among them names, the frame of that maker), or
    (None, None) where no maker makes a buffer of `op`."""
    if not op:
        return None, None
    best, where = len(MAKERS), None
    for frame in frames:
        index = maker_of(frame.f_code, frame.f_lineno, op)
        if _MISS < index < best:
            best, where = index, frame
    if where is None:
        return None, None
    kind = MAKERS[best].kind
    return (kind, where) if kind is not None else (None, None)


def kind_named(owner: str | None) -> str | None:
    """The kind a site (or a component named after it) ends with, where it names one."""
    if not owner or not owner.endswith(")"):
        return None
    return next((kind for kind in KINDS if owner.endswith(f" ({kind})")), None)


def library_place(frame) -> str:
    """`torch/distributed/...py:LINE function` of a library frame, for a buffer no program frame
    asked for (a hook run by a backward thread): its path from its package on, no machine folder."""
    filename = frame.f_code.co_filename
    marker = os.sep + "torch" + os.sep
    at = filename.rfind(marker)
    shown = filename[at + 1:] if at >= 0 else os.path.basename(filename)
    return f"{shown}:{frame.f_lineno} {frame.f_code.co_name}"
