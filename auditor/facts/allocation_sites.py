"""Where the program asked for a tensor: the innermost frame of its own code.

A tensor no census root reaches (a calibration buffer in a local variable, an activation
kept in a list) has no owner to be named after; the line that allocated it is the next best
name, `examples/pruning/layer_inputs.py:22 capture_layer_inputs`. The live-tensor meter asks
for the site of every storage of at least `MIN_BYTES` as the operator that makes it returns;
the census names unowned storages after it.

"The program's own code" is any file outside the standard library, installed packages and
the auditor's measuring code (its jobs/ are workloads, so they count as the program). A frame
walk costs about a microsecond; each code object's verdict is cached.
"""
from __future__ import annotations

import os
import site
import sys
import sysconfig
import types

from auditor.facts import communication_buffers

MIN_BYTES = 64 * 1024  # smaller storages are not worth a frame walk: they never matter alone

# the package auditor/ (this file is in auditor/facts/)
AUDITOR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")
_JOBS = os.path.join(AUDITOR, "jobs", "")
_verdicts: dict = {}  # code object -> shown path, or None for library code


def caller_site() -> str | None:
    """`path:line function` of the innermost frame in the program's own code, or None."""
    return allocation_site("")  # this frame is the auditor's: the walk passes over it


# What a library allocates for its collectives (auditor.facts.communication_buffers): DDP's gradient
# buckets, FSDP2's all-gather and reduce-scatter buffers, DTensor's redistributions.
DDP_BUCKETS = communication_buffers.DDP_BUCKETS


def allocation_site(op: str) -> str | None:
    """caller_site, and after it `(what)` where a library frame between the operator `op` and the
    program is one that makes communication buffers (auditor.facts.communication_buffers) and `op`
    allocates one there. With no frame of the program on the stack (a hook a backward thread
    runs), a communication buffer is named by the library call that made it; anything else, None."""
    frame: types.FrameType | None = sys._getframe(1)
    library: list[types.FrameType] | None = [] if op else None  # the frames a maker may be among
    while frame is not None:
        code = frame.f_code
        shown = _verdicts.get(code, False)
        if shown is False:
            shown = _verdicts[code] = _shown_if_program(code.co_filename)
        if shown is not None:
            what, _ = communication_buffers.kind_of(library or (), op)
            return f"{shown}:{frame.f_lineno} {code.co_name}" + (f" ({what})" if what else "")
        if library is not None and not is_auditor_code(code.co_filename):
            library.append(frame)
        frame = frame.f_back
    what, maker = communication_buffers.kind_of(library or (), op)
    return f"{communication_buffers.library_place(maker)} ({what})" if what else None


def communication_buffer(owner: str | None) -> str | None:
    """What a site (or the component named after it) from allocation_site is for, where it is a
    communication buffer."""
    return communication_buffers.kind_named(owner)


def is_program_code(filename: str) -> bool:
    """A file of the audited program: not the standard library, an installed package or the
    auditor's measuring code (its jobs/ are workloads, so they count as the program)."""
    if filename.startswith(_JOBS):
        return True
    return not (filename.startswith("<") or filename.startswith(_library_roots()))


def is_auditor_code(filename: str) -> bool:
    """A file of the auditor's measuring code (not its jobs)."""
    return filename.startswith(AUDITOR) and not filename.startswith(_JOBS)


def _shown_if_program(filename: str) -> str | None:
    if filename.startswith("<"):
        return None
    path = os.path.abspath(filename)
    return _shown(path) if is_program_code(path) else None


def _shown(path: str) -> str:
    """Relative to the working folder when inside it; else the folder and file name (no
    machine paths in records that get committed)."""
    cwd = os.path.join(os.getcwd(), "")
    if path.startswith(cwd):
        return os.path.relpath(path, cwd)
    return os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))


def _library_roots() -> tuple[str, ...]:
    global _ROOTS
    if _ROOTS is None:
        paths = sysconfig.get_paths()
        roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
        roots.update(getattr(site, "getsitepackages", lambda: [])())
        roots.add(getattr(site, "USER_SITE", None) or "")  # `pip install --user` packages
        roots.add(AUDITOR)
        _ROOTS = tuple(os.path.join(os.path.abspath(r), "") for r in roots if r)
    return _ROOTS


_ROOTS: tuple[str, ...] | None = None


# Frames that only hand an allocation on: torch's operator and module-call plumbing; the
# live-tensor meter's dispatch mode when it is running the program's operator (every op runs
# inside it); the wrappers the auditor puts around staged callables (a staged library
# function's allocations are the caller's).
_PLUMBING = tuple(os.path.join("torch", *parts) for parts in (
    ("_ops.py",), ("_compile.py",), ("_dynamo", ""), ("nn", "modules", "module.py"), ("utils", "_contextlib.py"),
    ("utils", "_python_dispatch.py")))
# The auditor's own files by their place in the package, not by this checkout's absolute path:
# a report re-made from a record elsewhere (a fresh clone) must drop the same frames. Records
# made before the modules moved into a folder per floor name them at their old places, listed
# second.
def _at(*parts: str) -> str:
    return os.path.join("auditor", *parts)


# Dispatch modes an operator passes through on its way to the allocator (file -> the frame's
# function): the live-tensor meter, the recorder of data-dependent sizes
# (auditor.capture.tracing.data_dependent) in real runs, and the wrapper every such mode is
# called through (auditor.capture.tracing.dispatch_mode).
_DISPATCH_MODES = {_at("capture", "probes", "live_tensors.py"): "__torch_dispatch__",
                   _at("capture", "tracing", "data_dependent.py"): "__torch_dispatch__",
                   _at("capture", "tracing", "dispatch_mode.py"): "dispatch",
                   _at("probes", "live_tensors.py"): "__torch_dispatch__",
                   _at("data_dependent.py"): "__torch_dispatch__",
                   _at("dispatch_mode.py"): "dispatch"}
_WRAPPERS = {_at("capture", "staging", "targets.py"): "staged_call", _at("capture", "stage.py"): "staged",
             _at("targets.py"): "staged_call", _at("stage.py"): "staged"}


def _in_package(filename: str, paths) -> str | None:
    """The package-relative path in `paths` that `filename` is, if any."""
    return next((p for p in paths if filename == p or filename.endswith(os.sep + p)), None)


def passes_through(function: str, filename: str, below_an_operator: bool = True) -> bool:
    """True for a frame that is plumbing between the code that asked and the allocator.
    `below_an_operator`: an inner frame is torch's operator call (without it, the meter's
    dispatch frame is allocating for itself)."""
    mode = _in_package(filename, _DISPATCH_MODES)
    if mode is not None:
        return function == _DISPATCH_MODES[mode] and below_an_operator
    wrapper = _in_package(filename, _WRAPPERS)
    if wrapper is not None and _WRAPPERS[wrapper] == function:
        return True
    return any(part in filename for part in _PLUMBING)
