"""Workers that an audited script starts with torch.multiprocessing audit themselves.

`auditor run SCRIPT` audits the script's own process. A script that calls
`torch.multiprocessing.spawn(worker, nprocs=N)` (or `start_processes`) does its work in N new
interpreters, which that audit cannot see: its record would hold the launcher alone. While the
script runs, `carry_into_spawn(audit)` wraps the function each worker runs, so that worker i
audits itself with the run's options and stage targets, as rank i of N, into the run folder's
rank-i/ (auditor.capture.ranks; a process group the worker initialises later confirms or corrects its
rank). The launcher's record stays in the run folder and names the workers' folders
(annotation `spawned`); `auditor report RUN` merges the ranks and names the launcher.

Spawn and forkserver workers are audited; fork workers (a copy of the audited process) are not,
and the launcher's record says so. A second spawn in the same run writes into RUN/spawn-2/. A
worker whose audit cannot start runs unaudited, with a warning: the program's behaviour and exit
status never depend on the auditor. torch is patched only once the script imports
torch.multiprocessing (an import hook until then), never imported here.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import socket
import sys
import types
import uuid
from dataclasses import dataclass
from pathlib import Path

from auditor.capture import ranks
from auditor.capture.staging import name_bindings

SPAWN_MODULE = "torch.multiprocessing.spawn"
AUDITED_METHODS = ("spawn", "forkserver")  # a fresh interpreter per worker


@dataclass(frozen=True)
class WorkerAudit:
    """What a spawned worker needs to audit itself (pickled with its function)."""
    folder: str                   # the ranks' shared folder (absolute)
    name: str
    options: dict                 # Audit's probe options, as the launcher's audit ran them
    stage_targets: tuple[str, ...]  # the script's own functions named in __mp_main__
    label: str | None             # --label MODULE:FUNCTION
    command: str
    nprocs: int
    spawn_id: str                 # tells this spawn's ranks from an earlier run's


def run_worker(fn, plan: WorkerAudit, index: int, *args):
    """Worker `index` of a spawn: `fn(index, *args)` under its own audit."""
    runs_in = getattr(getattr(fn, "func", fn), "__globals__", None)
    if isinstance(runs_in, dict):  # the script's functions run in runpy's namespace, not __mp_main__'s
        name_bindings.search_also(runs_in)
    audit = _worker_audit(plan, index)
    if audit is None:
        return fn(index, *args)
    error = None
    try:
        return fn(index, *args)
    except BaseException as raised:  # the worker's own ending: its record says how it ended
        error = raised
        if raised.__traceback__ is not None:  # from the worker's own frame on, as without the auditor
            raised.__traceback__ = raised.__traceback__.tb_next
        raise
    finally:
        audit.__exit__(type(error) if error else None, error, error.__traceback__ if error else None)


def _worker_audit(plan: WorkerAudit, index: int):
    from auditor.capture.audit import Audit
    from auditor.capture.staging.call_labels import resolve_hook
    rank = {"rank": index, "world_size": plan.nprocs, "local_rank": index, "host": socket.gethostname(),
            "backend": None, "run_id": plan.spawn_id, "source": ranks.SPAWNED, "read_at": "start"}
    targets = [_in_this_worker(spec) for spec in plan.stage_targets]
    try:
        label = resolve_hook(plan.label) if plan.label else None
        audit = Audit(plan.folder, plan.name, stage_targets=targets, command=plan.command,
                      stage_label=label, rank=rank, **plan.options)
        return audit.__enter__()
    except Exception as error:  # never the worker's failure: it runs as it would have
        print(f"auditor: warning: spawned worker {index} runs unaudited: {error}", file=sys.stderr)
        return None


def _in_this_worker(spec: str) -> str:
    """A target of the audited script, named where a spawned worker has it: multiprocessing
    runs the launcher's main script again as __mp_main__ (aliased __main__)."""
    module, _, qualname = spec.partition(":")
    if module != "__main__":
        return spec
    return f"{'__mp_main__' if '__mp_main__' in sys.modules else '__main__'}:{qualname}"


class _Spawns:
    """The launcher's side: wraps each spawn's function and notes where its ranks write."""

    def __init__(self, audit, options: dict, label: str | None):
        self.audit, self.options, self.label = audit, options, label
        self.spawned: list[dict] = []
        self.targets = tuple(f"__main__:{t.name}" if t.script is not None else t.spec
                             for t in audit.stage_targets)

    def wrap(self, start_processes):
        @functools.wraps(start_processes)
        def audited_start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
            fn = self._audited(fn, nprocs, start_method)
            return start_processes(fn, args, nprocs, join, daemon, start_method)
        audited_start_processes.__auditor_spawn__ = start_processes
        return audited_start_processes

    def _audited(self, fn, nprocs: int, start_method: str):
        audited = start_method in AUDITED_METHODS and self.audit.record is None
        folder = Path(self.audit.folder)
        if audited and self.spawned:
            folder = folder / f"spawn-{len(self.spawned) + 1}"
        entry = {"folder": str(folder.relative_to(self.audit.folder)) if audited else None,
                 "nprocs": nprocs, "start_method": start_method, "audited": audited}
        self.spawned.append(entry)
        self.audit.annotate("spawned", list(self.spawned))
        if not audited:
            return fn
        self.audit.workers_audited = True
        plan = WorkerAudit(str(folder.resolve()), self.audit.name, self.options, self.targets,
                           self.label, self.audit.command, nprocs, uuid.uuid4().hex)
        return functools.partial(run_worker, fn, plan)


@contextlib.contextmanager
def carry_into_spawn(audit, options: dict, label: str | None = None):
    """While the script runs: every torch.multiprocessing spawn's workers audit themselves."""
    spawns = _Spawns(audit, options, label)
    hook = _PatchOnImport(spawns)
    if SPAWN_MODULE in sys.modules:
        hook.patch(sys.modules[SPAWN_MODULE])
    else:
        sys.meta_path.insert(0, hook)
    try:
        yield spawns
    finally:
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
        hook.restore()


class _PatchOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Patches torch.multiprocessing.spawn's start_processes as soon as that module has run,
    before torch.multiprocessing binds the name from it."""

    def __init__(self, spawns: _Spawns):
        self.spawns = spawns
        self.loader = None
        self.patched: list[tuple[types.ModuleType, object]] = []  # (module, its own start_processes)

    def find_spec(self, fullname, path=None, target=None):
        if fullname != SPAWN_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        self.loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)

    def patch(self, module: types.ModuleType) -> None:
        original = getattr(module, "start_processes", None)
        if original is None or hasattr(original, "__auditor_spawn__"):
            return
        names = vars(module)  # a module's attributes are its namespace's entries
        names["start_processes"] = self.spawns.wrap(original)
        self.patched.append((module, original))
        package = sys.modules.get("torch.multiprocessing")  # bound from the module on its import
        if package is not None and getattr(package, "start_processes", None) is original:
            vars(package)["start_processes"] = names["start_processes"]

    def restore(self) -> None:
        package = sys.modules.get("torch.multiprocessing")
        for module, original in self.patched:
            for owner in (module, package):
                if owner is not None and hasattr(getattr(owner, "start_processes", None), "__auditor_spawn__"):
                    vars(owner)["start_processes"] = original
        self.patched.clear()
