"""A program's traced projection: the audited program run again, unmodified, in a fresh process,
on fake tensors, with the target's model where it builds its own (auditor.capture.tracing.model_from).

    plan = Plan(program=Program(script="prune.py", args=["--sparsity", "0.5"]),
                model_from="lib:build_model", target=TargetModel("mistral-7b"),
                stages=["lib:prune_layer"])
    projection = project_program(record, plan, folder / "target-mistral-7b")

The traced run has the real run's stage targets, so its stages pair with the real run's by
path, and `auditor.analysis.projection.traced` makes the projection: tensors measured exactly
at the target's shapes, the process beyond tensors taken from the real run. The program runs a
second time: `AUDITOR_TRACED=1` is set in its environment, so a program that writes results
can skip that (fake tensors have no values to write). A traced run that ends in an error still
gives the stages it finished; the projection says which, and that the rest is not projected.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from auditor.capture.tracing.model_from import TargetModel
from auditor.record.derived import Projection
from auditor.record.schema import RunRecord

TRACED_ENV = "AUDITOR_TRACED"
NO_STAGES = ("the real run has no stages, and a projection is made stage by stage (the traced run's "
             "against the real run's): name the program's steps with --stage MODULE:FUNCTION")


@dataclass
class Program:
    """A script, module or code string (`python SCRIPT ARGS`, `python -m MODULE ARGS`, `python -c
    CODE ARGS` in `cwd`) or a function called with no arguments (`module:function`), run with
    `path` first on sys.path."""
    script: str | None = None
    args: list[str] = field(default_factory=list)
    function: str | None = None
    cwd: str = "."
    path: list[str] = field(default_factory=list)
    module: str | None = None
    code: str | None = None

    def main(self):
        """What runs as __main__ (auditor.capture.staging.main_script.Main), or None for a function."""
        if self.script is None and self.module is None and self.code is None:
            return None
        from auditor.capture.staging.main_script import Main
        return Main(script=self.script, module=self.module, code=self.code)

    def run(self) -> None:
        main = self.main()
        if main is not None:
            try:
                main.run(self.args)
            except SystemExit as done:
                if done.code not in (None, 0):
                    raise
            return
        from auditor.capture.staging.targets import import_named
        module, _, qualname = (self.function or "").partition(":")
        function: object = import_named(module, "program")
        for part in qualname.split("."):
            function = getattr(function, part)
        function()  # type: ignore[operator]


@dataclass
class Plan:
    """One run of the program in a fresh process: traced (fake tensors) or real, with the
    target's model in place of its own, or (no target) its own model, observed."""
    program: Program
    model_from: str
    target: TargetModel | None
    observed: list[dict] = field(default_factory=list)  # the real run's model_from calls
    stages: list[str] = field(default_factory=list)
    label: str | None = None
    name: str = "program"
    data_dependent_sizes: list | None = None  # the real run's, for value-dependent sizes
    traced: bool = True
    threads: int = 1
    estimate_sizes: bool = True  # False: value-dependent sizes traced empty (the lower bound)
    rank: int | None = None  # a rank of a distributed run: traced as that rank of world_size
    world_size: int | None = None


def plan_for(record: RunRecord, program: Program, model_from: str, target: TargetModel,
             stages: list[str], label: str | None = None) -> Plan:
    """The traced run's plan from the real run's record (its model_from calls, its name)."""
    observed = (record.annotations.get("model_from") or {}).get("calls") or []
    rank = record.rank
    return Plan(program=program, model_from=model_from, target=target, observed=observed,
                stages=list(stages), label=label, name=f"{record.name}-traced",
                data_dependent_sizes=record.annotations.get("data_dependent_sizes"),
                rank=rank.rank if rank else None, world_size=rank.world_size if rank else None)


def project_program(record: RunRecord, plan: Plan, folder: Path, timeout_s: int = 3600) -> Projection:
    """The traced projection of the program to `plan.target`; RuntimeError (one line) when the
    traced run finished no stage."""
    from auditor.analysis.findings.child_processes import projection_caveat
    from auditor.analysis.projection.estimated_bytes import estimated_bytes, has_estimates
    from auditor.analysis.projection.traced import project_traced
    if not plan.observed:
        raise RuntimeError(f"--model-from {plan.model_from} was never called in the real run: "
                           "nothing tells where the program builds its model")
    other = next((c for c in plan.observed if c.get("returned") != "module"), None)
    if other is not None:
        raise RuntimeError(f"--model-from {plan.model_from} returned a {other.get('class', '?')} in "
                           "the real run, not a torch.nn.Module: there is no model to replace")
    if plan.target is None or not plan.traced:
        raise ValueError("a projection needs a traced plan with a target model")
    if not record.stages:
        raise RuntimeError(NO_STAGES)
    child = run_program(plan, folder, timeout_s)
    traced = child.record
    if traced is None or not child.stages:
        raise RuntimeError(child.failure(f"traced run at {plan.target.describe()}"))
    if child.ok and has_estimates(traced):  # how much rests on estimated sizes: traced again without
        lower = run_program(replace(plan, estimate_sizes=False), folder / "lower-bound", timeout_s)
        if lower.ok and lower.record is not None:
            traced.annotations["estimated_bytes"] = estimated_bytes(traced, lower.record)
    projection = project_traced(record, traced)
    projection["target"] = plan.target.describe()
    projection["model_from"] = plan.model_from
    built = [c["target_built"] for c in (traced.annotations.get("model_from") or {}).get("calls") or []
             if isinstance(c, dict) and c.get("target_built")]
    if built:  # the program's own model at the target's sizes, or a stand-in: said with the figures
        projection["target_built"] = next((b for b in built if b.get("by") == "stand-in"), built[0])
    leaves_out = projection_caveat(record)
    if leaves_out:  # child processes that held memory: the traced run forks none
        projection["leaves_out"] = leaves_out
    if plan.rank is not None:
        projection["traced_as_rank"] = {"rank": plan.rank, "world_size": plan.world_size}
    projection["run_folder"] = folder.name
    if not child.ok:  # what it finished is projected; the rest is said to be missing
        projection["incomplete"] = child.failure("the traced run")
        unfinished = [s.path for s in traced.stages if s.status != "ok"]
        if unfinished:  # the innermost stage it was in when it failed
            projection["failed_stage"] = unfinished[-1]
    return projection


def traced_folder(run_folder: Path, target: TargetModel) -> Path:
    """Where a run's traced run at `target` goes: `RUN/target-llama-2-7b-layers-4`."""
    slug = "".join(c if c.isalnum() or c in "._-" else "-" for c in target.describe())
    return Path(run_folder) / ("target-" + "-".join(p for p in slug.split("-") if p))


def run_program(plan: Plan, folder: Path, timeout_s: int = 3600):
    """The plan's run in a fresh process (its RSS owes nothing to ours); the ChildRun, with
    the run record it left (rebuilt from its events if it died)."""
    from auditor.capture.fresh_process import run_module
    from auditor.record.run_folder import rank_folder_name
    record_folder = folder if plan.rank is None else Path(folder) / rank_folder_name(plan.rank)
    return run_module("auditor.jobs.script_projection", json.dumps(asdict(plan)), str(folder),
                      run_folder=record_folder, timeout_s=timeout_s,
                      env={TRACED_ENV: "1"} if plan.traced else None)


def _from_json(data: dict) -> Plan:
    target = TargetModel(**data["target"]) if data.get("target") else None
    return Plan(**{**data, "program": Program(**data["program"]), "target": target})


def _main(plan: Plan, folder: Path) -> None:
    import torch

    from auditor.capture.audit import Audit
    from auditor.capture.staging.call_labels import resolve_hook
    from auditor.capture.tracing.model_from import ModelFrom
    torch.set_num_threads(plan.threads)
    program = plan.program
    folder = folder.resolve()  # the program may change folder
    os.chdir(program.cwd)
    sys.path[0:0] = program.path
    label = resolve_hook(plan.label) if plan.label else None
    target = plan.target
    if program.main() is not None:  # its own functions may be named (auditor.capture.staging.main_script)
        program.main().declare()
    # the rank joined and the model's builder patched before the stages wrap it (each entered in turn)
    with (_as_rank(plan), ModelFrom(plan.model_from, target, plan.observed),
          Audit(folder, plan.name, census=True, live_tensors=True, traced=plan.traced,
                stage_targets=plan.stages, stage_label=label, command=shlex_join(program),
                record_sizes=not plan.traced,
                observed_sizes=plan.data_dependent_sizes if plan.traced else None,
                estimate_sizes=plan.estimate_sizes) as audit):
        if target is not None:
            audit.annotate("workload", {"architecture": target.architecture,
                                        "overrides": target.overrides, "dtype": target.dtype,
                                        "model_from": plan.model_from})
        program.run()


@contextlib.contextmanager
def _as_rank(plan: Plan):
    """A rank's traced run: this process joins torch's fake process group as that rank of its
    world size before the program starts (auditor.jobs.rank_projection: no peers, every
    collective answered at once, FSDP2 sharding as on that rank), and the program's own
    `init_process_group` finds it joined: the real run's rendezvous (torchrun's store, still in
    the environment, which the program may read) is never contacted."""
    if plan.rank is None or plan.world_size is None:
        yield
        return
    import torch.distributed.distributed_c10d as c10d

    from auditor.capture.staging.targets import Patch, Target
    from auditor.jobs.rank_projection import default_mesh, join_fake_group, keep_padded_shards
    mesh = join_fake_group(plan.rank, plan.world_size)
    joined = Patch(Target("init_process_group", c10d, "init_process_group", "torch.distributed:init_process_group"),
                   lambda function, _: _already_joined(function))
    try:
        with default_mesh(mesh), keep_padded_shards():
            yield
    finally:
        joined.restore()


def _already_joined(init_process_group):
    @functools.wraps(init_process_group)
    def joined(*args, **kwargs):
        return None  # the fake group stands for the one the real run joined
    return joined


def shlex_join(program: Program) -> str:
    import shlex
    main = program.main()
    if main is not None:
        return shlex.join(["python", *main.command(), *program.args])
    return f"{program.function}()"



def audit_and_project(program, *, model_from: str, target: str | TargetModel, stages=(),
                      run_dir: str | os.PathLike | None = None, name: str | None = None,
                      **audit_options) -> RunRecord:
    """The Python API: audit `program()` here (census and live tensors on), then trace it at
    `target` in a fresh process; returns the run record with its projection in its
    annotations, as `auditor.load` gives it (also written to RUN_DIR/projections.json, so
    `auditor report RUN_DIR` shows it).

    `program`: a module-level function with no arguments, or "module:function"; the fresh
    process imports it with this process's sys.path. RuntimeError (one line) when the traced
    run fails; the real run's record is written before.
    """
    from auditor.capture.audit import Audit
    from auditor.capture.tracing.model_from import ModelFrom
    from auditor.record.run_folder import write_derived
    spec = program if isinstance(program, str) else f"{program.__module__}:{program.__qualname__}"
    target = target if isinstance(target, TargetModel) else TargetModel(target)
    call = Program(function=spec, cwd=os.getcwd(), path=[p for p in sys.path if p])
    with ModelFrom(model_from), Audit(run_dir, name or spec.rpartition(":")[2], census=True, live_tensors=True,
               stage_targets=list(stages), record_sizes=True, **audit_options) as audit:
        call.run()
    record = RunRecord.from_json(audit.record, str(audit.run_json))
    projection = project_program(record, plan_for(record, call, model_from, target, list(stages)),
                                 traced_folder(audit.folder, target))
    write_derived(audit.folder, "projections", [projection])
    record.annotations["projections"] = [projection]
    return record


if __name__ == "__main__":  # python -m auditor.jobs.script_projection PLAN_JSON FOLDER
    _main(_from_json(json.loads(sys.argv[1])), Path(sys.argv[2]))
