"""Census roots found without being named: the program's models, optimizers and own objects.

A census names only what its roots reach; without `auditor.track` (or a staged method's
receiver) a script's parameters, gradients and optimizer state were `unowned` "activations and
temporaries". At each census the audit adds, after the roots it was given (which keep their
names and their priority):

- every **top-level module** alive (an `nn.Module` that is no other live module's child and
  holds a parameter or buffer) and every **optimizer**, found in one pass over the heap. Each
  is named by the variable that holds it in the program's frames on the census's thread,
  innermost first (`model`, `optimizer`; a module global of the program counts), else by its
  class (`LlamaForCausalLM`, `AdamW`). So the walk (auditor.capture.census.ownership) gives `model.parameters`
  (weights), `model.grad` (gradients), `optimizer.state` (optimizer state) in any script;
- every object of a **program class** (defined in the audited program's own files, not in the
  standard library, an installed package or the auditor) held by a local variable of a frame
  that runs inside the open stages (the frames from the census up to the one that opened the
  outermost stage), named by its class as a staged method's receiver is (`Pruner`): what the
  CLI's staged methods register as roots, the Python API's one stage finds the same way.

The same rules run for `auditor run --stage` and for `auditor.stage()`: the two paths name the
same objects alike (a receiver's `Pruner[label]` folds to the found `Pruner`).
"""
from __future__ import annotations

import functools
import gc
import os
import sys
import weakref
from types import FrameType

import torch

from auditor.capture.census.take import subclasses
from auditor.facts.allocation_sites import AUDITOR, is_program_code

_HIDDEN_NAMES = frozenset({"self", "cls", "args", "kwargs", "_"})


def found_roots(taken: dict[str, object], frames: list[FrameType],
                stage_frames: list[FrameType]) -> tuple[list[tuple[str, object]], list[object]]:
    """The top-level modules and optimizers `taken` (name -> object, the given roots) does not
    hold yet, each with its name, and the program-class objects held in `stage_frames`' locals
    (to be named as receivers are). `frames`: the program's frames, innermost first, for names."""
    held = {id(obj) for obj in taken.values()}
    modules, optimizers = _modules_and_optimizers()
    found = [obj for obj in (*_top_level(modules), *optimizers) if id(obj) not in held]
    modules.clear()
    optimizers.clear()
    names = _variable_names(frames, {id(obj) for obj in found})
    used = set(taken)
    named = []
    for obj in found:
        name = _unique(names.get(id(obj)) or type(obj).__name__, used)
        used.add(name)
        named.append((name, obj))
    instances = _program_objects(stage_frames, held | {id(obj) for obj in found})
    return named, instances


def program_frames(start: FrameType | None) -> list[FrameType]:
    """The frames of the audited program from `start` outward (the auditor's and libraries' left out)."""
    frames = []
    frame = start
    while frame is not None:
        if is_program_file(frame.f_code.co_filename):
            frames.append(frame)
        frame = frame.f_back
    return frames


def frames_until(start: FrameType | None, last: FrameType | None) -> list[FrameType]:
    """The program's frames from `start` outward up to `last` (included), or none if `last`
    is not on that stack (a stage opened by another thread)."""
    frames = []
    frame = start
    while frame is not None:
        if is_program_file(frame.f_code.co_filename):
            frames.append(frame)
        if frame is last:
            return frames
        frame = frame.f_back
    return []


def opener_frame(start: FrameType | None) -> FrameType | None:
    """The first frame outside the auditor: the one that entered a stage (a `with` block), or
    the caller of a staged callable."""
    frame = start
    while frame is not None and frame.f_code.co_filename.startswith(AUDITOR):
        frame = frame.f_back
    return frame


@functools.lru_cache(maxsize=4096)
def is_program_file(filename: str) -> bool:
    """Code of the audited program (auditor.facts.allocation_sites.is_program_code: not the standard
    library, an installed package, `<frozen ...>` or `<string>`), the auditor's jobs left out too."""
    if not filename:
        return False
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    return is_program_code(path) and not path.startswith(AUDITOR)


def _modules_and_optimizers() -> tuple[list, list]:
    module_types, optimizer_types = subclasses(torch.nn.Module), subclasses(torch.optim.Optimizer)
    modules, optimizers = [], []
    for obj in gc.get_objects():  # one pass over the heap, exact types only (cheap)
        kind = type(obj)
        if kind in module_types:
            modules.append(obj)
        elif kind in optimizer_types:
            optimizers.append(obj)
    return modules, optimizers


def _top_level(modules: list) -> list:
    """The modules no other live module holds as a child, that hold a tensor."""
    children: set[int] = set()
    for module in modules:
        try:
            children.update(id(child) for child in vars(module).get("_modules", {}).values())
        except Exception:  # a half-built module
            continue
    top = []
    for module in modules:
        if id(module) in children:
            continue
        try:
            holds = next(iter(module.parameters()), None) is not None or next(iter(module.buffers()), None) is not None
        except Exception:
            continue
        if holds:
            top.append(module)
    return top


def _variable_names(frames: list[FrameType], wanted: set[int]) -> dict[int, str]:
    """id -> the first variable (innermost frame first, its locals then its module's globals)
    that holds the object."""
    names: dict[int, str] = {}
    for scope in (*(_locals(f) for f in frames), *(f.f_globals for f in reversed(frames))):
        for name, value in list(scope.items()):
            key = id(value)
            if key in wanted and key not in names and name not in _HIDDEN_NAMES and not name.startswith("__"):
                names[key] = name
        if len(names) == len(wanted):
            break
    return names


def _locals(frame: FrameType) -> dict:
    try:
        return dict(frame.f_locals)
    except Exception:
        return {}


def _program_objects(frames: list[FrameType], held: set[int]) -> list[object]:
    """Objects of program classes held by the frames' local variables (once each)."""
    seen, found = set(held), []
    for frame in frames:
        for value in _locals(frame).values():
            if id(value) in seen or not _is_program_object(value):
                continue
            seen.add(id(value))
            found.append(value)
    return found


def _is_program_object(value: object) -> bool:
    kind = type(value)
    if isinstance(value, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer, type)):
        return False
    module = sys.modules.get(kind.__module__)
    filename = getattr(module, "__file__", None)
    if not filename or not is_program_file(filename):
        return False
    try:
        weakref.ref(value)  # held weakly as a root: an object that cannot be is not taken
    except TypeError:
        return False
    return True


def _unique(name: str, used: set[str]) -> str:
    if name not in used:
        return name
    count = 2
    while f"{name}#{count}" in used:
        count += 1
    return f"{name}#{count}"
