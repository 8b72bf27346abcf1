"""Validation of a program's traced projection against a real held-out run: any algorithm,
unmodified, its model swapped where it builds it (auditor.capture.tracing.model_from).

    result = validate_program(Program(script="prune.py", args=[...]), "lib:build_model",
                              TargetModel("llama-2-7b", {"layers": 4, "hidden": 512}),
                              ["lib:prune_layer"], folder)

1. The program runs for real with its own model (`small/`), each run in a fresh process.
2. It is traced at the target (`traced-target/`) and projected (auditor.jobs.script_projection).
   The traced peak RSS must fit in the memory available less a margin, or `NotEnoughMemory` is
   raised before the big run.
3. It runs for real at the target (`target/`), held out: by default with the target's sizes
   handed to the program's own builder (auditor.capture.tracing.model_from); with `held_out_args`, as the program
   is written, with those arguments of its own and nothing replaced (--model-from only
   observes), so the check is against the program itself. The model it built must have the
   traced target's parameter count, or nothing is compared. Every projected number is then
   compared with the measured one (auditor.analysis.projection.validation): per stage, per
   component of the real run's peak stage, and the peaks. A program has no scaled projection
   (its drivers are GradProbe's); the traced targets apply. `result["held_out"]` says which
   held-out run it was, in a sentence the report prints.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import asdict, replace
from pathlib import Path

from auditor.analysis.projection.validation import check_targets, compare
from auditor.capture.tracing.model_from import TargetModel
from auditor.facts import safe_files
from auditor.jobs.projection_validation import DEFAULT_MARGIN, SCALE_UP_RANGE, available_memory, check_fits
from auditor.jobs.script_projection import Plan, Program, plan_for, project_program, run_program
from auditor.record.run_folder import load
from auditor.record.schema import RunRecord


def validate_program(program: Program, model_from: str, target: TargetModel, stages: list[str],
                     folder: Path, *, label: str | None = None, threads: int = 1,
                     available: int | None = None, margin: int = DEFAULT_MARGIN,
                     progress=lambda text: None, held_out_args: list[str] | None = None) -> dict:
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
    peak = traced.get("peak")
    rss = peak.get("rss") if peak else None
    if rss is not None:  # else not projected: nothing to fit
        check_fits(target.describe(), rss, now, margin, "peak RSS of its traced projection")
    if held_out_args is None:
        progress(f"running it for real at {target.describe()} (held out)")
        held_out = replace(plan, traced=False, name="target", threads=threads)
    else:  # the program as written: its own arguments build its model, --model-from only observes
        progress(f"running it for real as written with {shlex.join(held_out_args)} (held out)")
        held_out = replace(own, program=replace(program, args=list(held_out_args)), name="target")
    real = _finished(run_program(held_out, folder / "target"), f"real run at {target.describe()}")
    small_parameters = _parameters(small)
    target_parameters = _parameters(real)
    traced_parameters = _parameters(load(folder / "traced-target"))
    if held_out_args is not None and target_parameters != traced_parameters:
        raise RuntimeError(f"the held-out run's model (the program with {shlex.join(held_out_args)}) has "
                           f"{target_parameters:,} parameters, the traced {target.describe()} "
                           f"{traced_parameters:,}: --held-out-args must build the --target model; "
                           "nothing compared")
    result = compare(small, real, {"traced": traced})
    result.update(
        small={"label": "the program's own model", "parameters": small_parameters,
               "run": str(folder / "small" / "run.json"), "program": asdict(program),
               "model_from": model_from, "stages": list(stages)},
        target={"label": target.describe(), "architecture": target.architecture,
                "overrides": target.overrides, "parameters": target_parameters,
                "run": str(folder / "target" / "run.json")},
        folder=str(folder), available=now, margin=margin,
        scale_up=target_parameters / small_parameters if small_parameters else 0.0,
        scale_up_range=SCALE_UP_RANGE, projections={"traced": traced},
        held_out=_held_out(program, model_from, target, held_out_args, real))
    result["targets"] = check_targets(result)
    safe_files.write_text(folder / "validation.json", json.dumps(result, indent=1) + "\n")
    return result


def _held_out(program: Program, model_from: str, target: TargetModel, held_out_args: list[str] | None,
              real: RunRecord) -> dict:
    """Which held-out run it was, in a sentence for the report: the program as written with
    arguments of its own, or the target's sizes handed to its builder (or a stand-in, where the
    builder could not take them)."""
    name = Path(program.script).name if program.script else f"{program.function}()"
    if held_out_args is not None:
        return {"how": "own arguments", "args": list(held_out_args),
                "sentence": f"The held-out real run is the program as written, `{shlex.join([name, *held_out_args])}`: "
                            f"its own model built by its own arguments ({_parameters(real):,} parameters, as "
                            f"the traced {target.describe()} has), nothing replaced."}
    args = list(program.args)
    calls = (real.annotations.get("model_from") or {}).get("calls") or [{}]
    built = calls[0].get("target_built") or {}
    if built.get("by") == "stand-in":
        return {"how": "a stand-in in place of the program's model", "args": args,
                "sentence": f"The held-out real run is `{shlex.join([name, *args])}` with the auditor's "
                            f"{target.describe()} in place of the model `{model_from}` builds "
                            f"({built.get('says', 'a stand-in')}): it checks the tracing, not the program's "
                            "own model at that size; --held-out-args runs the program as written."}
    return {"how": "target sizes handed to the program's builder", "args": args,
            "sentence": f"The held-out real run is `{shlex.join([name, *args])}` with {target.describe()}'s "
                        f"sizes handed to the program's own builder `{model_from}` (the model it builds, as it "
                        "builds it, at those sizes); --held-out-args runs the program as written instead."}


def _finished(child, what: str) -> RunRecord:
    if not child.ok or child.record is None:
        raise RuntimeError(child.failure(what))
    return child.record


def _parameters(record: RunRecord) -> int:
    calls = (record.annotations.get("model_from") or {}).get("calls") or [{}]
    return int(calls[0].get("parameters") or 0)
