"""Validation of a program's traced projection against a real held-out run: any algorithm,
unmodified, its model swapped where it builds it (auditor.model_from).

    result = validate_program(Program(script="prune.py", args=[...]), "lib:build_model",
                              TargetModel("llama-2-7b", {"layers": 4, "hidden": 512}),
                              ["lib:prune_layer"], folder)

1. The program runs for real with its own model (`small/`), each run in a fresh process.
2. It is traced at the target (`traced-target/`) and projected (auditor.jobs.script_projection).
   The traced peak RSS must fit in the memory available less a margin, or `NotEnoughMemory` is
   raised before the big run.
3. It runs for real with the target's model in place of its own (`target/`), and every projected
   number is compared with the measured one (auditor.analysis.projection_validation): per stage,
   per component of the real run's peak stage, and the peaks. A program has no scaled projection
   (its drivers are GradProbe's); the traced targets apply.
"""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

from auditor.analysis.projection_validation import check_targets, compare
from auditor.jobs.projection_validation import (DEFAULT_MARGIN, SCALE_UP_RANGE, available_memory,
                                                check_fits)
from auditor.jobs.script_projection import Plan, Program, plan_for, project_program, run_program
from auditor.model_from import TargetModel
from auditor.record_schema import RunRecord


def validate_program(program: Program, model_from: str, target: TargetModel, stages: list[str],
                     folder: Path, *, label: str | None = None, threads: int = 1,
                     available: int | None = None, margin: int = DEFAULT_MARGIN,
                     progress=lambda text: None) -> dict:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    memory = (lambda: available) if available is not None else available_memory
    own = Plan(program=program, model_from=model_from, target=None, stages=list(stages),
               label=label, name="small", traced=False, threads=threads)
    progress("running the program for real with its own model")
    small = _finished(run_program(own, folder / "small"), "real run with the program's own model")
    progress(f"tracing it at {target.describe()} on fake tensors")
    plan = plan_for(small, program, model_from, target, stages, label)
    traced = project_program(small, plan, folder / "traced-target")
    if traced.get("incomplete"):
        raise RuntimeError(f"the traced run at {target.describe()} did not finish: {traced['incomplete']}")
    now = memory()
    check_fits(target.describe(), traced["peak"]["rss"], now, margin, "peak RSS of its traced projection")
    progress(f"running it for real at {target.describe()} (held out)")
    held_out = replace(plan, traced=False, name="target", threads=threads)
    real = _finished(run_program(held_out, folder / "target"), f"real run at {target.describe()}")
    result = compare(small, real, {"traced": traced})
    small_parameters = _parameters(small)
    target_parameters = _parameters(real)
    result.update(
        small={"label": "the program's own model", "parameters": small_parameters,
               "run": str(folder / "small" / "run.json"), "program": asdict(program),
               "model_from": model_from, "stages": list(stages)},
        target={"label": target.describe(), "architecture": target.architecture,
                "overrides": target.overrides, "parameters": target_parameters,
                "run": str(folder / "target" / "run.json")},
        folder=str(folder), available=now, margin=margin,
        scale_up=target_parameters / small_parameters if small_parameters else 0.0,
        scale_up_range=SCALE_UP_RANGE, projections={"traced": traced})
    result["targets"] = check_targets(result)
    (folder / "validation.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def _finished(child, what: str) -> RunRecord:
    if not child.ok or child.record is None:
        raise RuntimeError(child.failure(what))
    return child.record


def _parameters(record: RunRecord) -> int:
    calls = (record.annotations.get("model_from") or {}).get("calls") or [{}]
    return int(calls[0].get("parameters") or 0)
