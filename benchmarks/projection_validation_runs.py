"""The validate-projection runs quoted in reports/projection-validation.md (five scale-ups of the
baseline) and reports/projection-validation-variants.md (sparse-state and lean, whose records are
sized by data-dependent counts), kept as records and filled into those reports.

    # a report's runs (about 2 min each), their records, and its blocks filled from them
    .venv/bin/python benchmarks/projection_validation_runs.py run --run-dir runs/pv \
        -o reports/projection-validation-variants.md
    # the blocks again from the committed records alone
    .venv/bin/python benchmarks/projection_validation_runs.py fill -o reports/projection-validation-variants.md

A record (reports/REPORT-runs/CASE.json) holds the command as run, its validation result (the run
folder's validation.json, which `auditor validate-projection` renders its report from) and the
peak of the traced run's lower-bound twin (every data-dependent size empty) where it has one,
which the result does not carry. The run folders themselves are not committed.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import benchmark_record

from auditor.facts.units import size
from auditor.renderers import validation_markdown
from auditor.report_models.validation import validation_report

BASELINE_SMALL = ["--arch", "tinystories-33m", "--hidden", "256", "--layers", "2"]
SMALL_MISTRAL = ["--arch", "mistral-7b", "--layers", "1", "--hidden", "256", "--vocab", "32000", "--heads", "4",
                 "--intermediate", "896"]
VARIANTS_SMALL = ["--arch", "tinystories-33m", "--layers", "1", "--hidden", "256", "--target", "gpt-neo-125m",
                  "--threads", "2"]
CASES = {  # report -> case -> its validate-projection arguments (run folder and report added per case)
    "projection-validation.md": {
        "A": [*BASELINE_SMALL, "--target", "tinystories-33m"],
        "B": [*BASELINE_SMALL, "--target", "gpt-neo-125m"],
        "C": ["--arch", "tinystories-33m", "--hidden", "128", "--layers", "2", "--target", "gpt-neo-125m"],
        "D": [*SMALL_MISTRAL, "--target", "mistral-7b", "--target-layers", "2", "--target-hidden", "1024",
              "--target-vocab", "32000", "--target-heads", "16", "--target-intermediate", "3584"],
        "E": [*SMALL_MISTRAL, "--target", "mistral-7b", "--target-layers", "4", "--target-hidden", "1536",
              "--target-vocab", "32000", "--target-heads", "16", "--target-intermediate", "5376"],
    },
    "projection-validation-variants.md": {
        "sparse-state": [*VARIANTS_SMALL, "--variant", "sparse-state"],
        "lean": [*VARIANTS_SMALL, "--variant", "lean"],
    },
}


def _cases(output: str) -> dict[str, list[str]]:
    name = Path(output).name
    if name not in CASES:
        raise SystemExit(f"-o {output}: its runs are not known here (known: {', '.join(CASES)})")
    return CASES[name]


def _records(output: str) -> Path:
    return Path(output).with_name(Path(output).stem + "-runs")


def run(args) -> None:
    import auditor
    run_dir, records = Path(args.run_dir), _records(args.output)
    run_dir.mkdir(parents=True, exist_ok=True)
    records.mkdir(parents=True, exist_ok=True)
    for case, arguments in _cases(args.output).items():
        command = ["auditor", "validate-projection", *arguments,
                   "--run-dir", str(run_dir / case), "-o", str(run_dir / f"{case}.md")]
        print(f"{case}: {shlex.join(command)}", flush=True)
        done = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True)
        if done.returncode not in (0, 1):  # 1: a target missed, which the report shows
            raise SystemExit(f"{shlex.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        twin = run_dir / case / "traced-target" / "lower-bound"
        lower = auditor.load(twin) if twin.is_dir() else None
        benchmark_record.write(records / f"{case}.json", {
            "command": shlex.join(command),
            "result": json.loads((run_dir / case / "validation.json").read_text()),
            "lower_bound_live_tensors": max((s.live_tensors.peak or 0) for s in lower.stages if s.live_tensors)
            if lower is not None else None})
    fill(args)


def fill(args) -> None:
    records = {case: benchmark_record.read(_records(args.output) / f"{case}.json") for case in _cases(args.output)}
    table = summary if Path(args.output).name == "projection-validation-variants.md" else scale_ups
    blocks = {"summary": table(records), **{case: section(case, r) for case, r in records.items()}}
    Path(args.output).write_text(benchmark_record.fill(args.output, blocks))
    print(blocks["summary"])


def scale_ups(records: dict[str, dict]) -> str:
    """The five scale-ups' targets side by side."""
    lines = ["| | small (real) | held-out target (real) | scale-up | scaled: peak live tensors | scaled: peak RSS | "
             "traced: peak live tensors | traced: every stage | traced: peak RSS |",
             "|---|---|---|---:|---|---|---:|---:|---:|"]
    for case, record in records.items():
        result = record["result"]
        found = {(t["method"], t["what"]): t for t in result["targets"]}
        lines.append(" | ".join([
            f"| {case}", result["small"]["label"], result["target"]["label"], f"{result['scale_up']:.1f}x",
            _target(found[("scaled", "peak live tensors")]), _target(found[("scaled", "peak RSS")]),
            _target(found[("traced", "peak live tensors")]), _target(found[("traced", "live tensors, every stage")]),
            _target(found[("traced", "peak RSS")])]) + " |")
    reasons = sorted({t.get("not_printed", "no number") for r in records.values() for t in r["result"]["targets"]
                      if t["error"] is None})
    return "\n".join(lines + ["", *(f"*not printed*: {why}." for why in reasons)] if reasons else lines)


def _target(target: dict) -> str:
    if target["error"] is None:
        return "*not printed*"
    return _signed(target["error"]) + ("" if target["met"] else " (**missed**)")


def summary(records: dict[str, dict]) -> str:
    """The variants' traced figures, with what rests on data-dependent estimates."""
    lines = ["| variant | traced: peak live tensors | traced: every stage of exact sizes | worst stage resting on "
             "estimates | traced without estimates (lower bound) | rests on estimates at the traced peak | traced: "
             "peak RSS | scaled |", "|---|---|---|---|---|---|---|---|"]
    for variant, record in records.items():
        result = record["result"]
        found = {(t["method"], t["what"]): t for t in result["targets"]}
        every = found[("traced", "live tensors, every stage")]
        resting = every.get("resting_on_estimates")
        real = result["peak"]["real"]["live_tensors"]
        traced = result["projections"]["traced"]
        peak_stage = max(traced["stages"], key=lambda s: s["tensor_peak"])
        scaled = found[("scaled", "peak live tensors")]
        lines.append(" | ".join([
            f"| {variant}", _signed(found[("traced", "peak live tensors")]["error"]), _signed(every["error"]),
            f"{_signed(resting['error'])} (`{resting['path']}`, "
            f"{resting['estimated_share']:.0%} of its bytes estimated)"
            if resting else "none",
            _signed((record["lower_bound_live_tensors"] - real) / real),
            f"{size(peak_stage['estimated'])} of {size(peak_stage['tensor_peak'])}",
            _signed(found[("traced", "peak RSS")]["error"]),
            _signed(scaled["error"]) if scaled["error"] is not None else "no number: " + scaled["not_printed"]]) + " |")
    return "\n".join(lines)


def section(case: str, record: dict) -> str:
    """The report `validate-projection` wrote, one heading level down, titled by its case."""
    text = validation_markdown.render(validation_report(record["result"]), record["command"])
    title, rest = text.split("\n", 1)
    named = f"Variant `{case}`" if "--variant" in record["command"] else case
    title = title.replace("# Projection validation:", f"## {named}:", 1)
    return title + "\n" + "\n".join("#" + line if line.startswith("#") else line for line in rest.split("\n"))


def _signed(share: float) -> str:
    return f"{share:+.2%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    measure = sub.add_parser("run", help="run the report's validations, keep their records, fill the report")
    measure.add_argument("--run-dir", required=True)
    again = sub.add_parser("fill", help="fill the report's blocks from the committed records, running nothing")
    for step in (measure, again):
        step.add_argument("-o", "--output", required=True, help="the report whose blocks are filled")
    args = parser.parse_args()
    {"run": run, "fill": fill}[args.step](args)


if __name__ == "__main__":
    main()
