"""The two validate-projection runs of reports/projection-validation-variants.md (sparse-state and
lean, whose records are sized by data-dependent counts), kept as records and filled into it.

    # both runs (about 2 min each), their records, and the report's blocks filled from them
    .venv/bin/python benchmarks/projection_validation_variants.py run --run-dir runs/pv-variants \
        -o reports/projection-validation-variants.md
    # the blocks again from the committed records alone
    .venv/bin/python benchmarks/projection_validation_variants.py fill -o reports/projection-validation-variants.md

A record (reports/projection-validation-variants-runs/VARIANT.json) holds the command as run,
its validation result (the run folder's validation.json, which `auditor validate-projection`
renders its report from) and the peak of the traced run's lower-bound twin (every data-dependent
size empty), which the result does not carry. The run folders themselves are not committed.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import benchmark_record
from auditor.renderers import validation_markdown
from auditor.units import size

VARIANTS = ("sparse-state", "lean")
SETTINGS = ["--arch", "tinystories-33m", "--layers", "1", "--hidden", "256", "--target", "gpt-neo-125m",
            "--threads", "2"]
RECORDS = Path("reports/projection-validation-variants-runs")


def run(args) -> None:
    import auditor
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    RECORDS.mkdir(parents=True, exist_ok=True)
    for variant in VARIANTS:
        command = ["auditor", "validate-projection", *SETTINGS, "--variant", variant,
                   "--run-dir", str(run_dir / variant), "-o", str(run_dir / f"{variant}.md")]
        done = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True)
        if done.returncode not in (0, 1):  # 1: a target missed, which the report shows
            raise SystemExit(f"{shlex.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        lower = auditor.load(run_dir / variant / "traced-target" / "lower-bound")
        benchmark_record.write(RECORDS / f"{variant}.json", {
            "command": shlex.join(command),
            "result": json.loads((run_dir / variant / "validation.json").read_text()),
            "lower_bound_live_tensors": max((s.live_tensors.peak or 0) for s in lower.stages if s.live_tensors)})
    fill(args)


def fill(args) -> None:
    records = {v: benchmark_record.read(RECORDS / f"{v}.json") for v in VARIANTS}
    blocks = {"summary": summary(records), **{v: section(v, r) for v, r in records.items()}}
    Path(args.output).write_text(benchmark_record.fill(args.output, blocks))
    print(blocks["summary"])


def summary(records: dict[str, dict]) -> str:
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
            f"{_signed(resting['error'])} (`{resting['path']}`, {resting['estimated_share']:.0%} of its bytes estimated)"
            if resting else "none",
            _signed((record["lower_bound_live_tensors"] - real) / real),
            f"{size(peak_stage['estimated'])} of {size(peak_stage['tensor_peak'])}",
            _signed(found[("traced", "peak RSS")]["error"]),
            _signed(scaled["error"]) if scaled["error"] is not None else "no number: " + scaled["not_printed"]]) + " |")
    return "\n".join(lines)


def section(variant: str, record: dict) -> str:
    """The report `validate-projection` wrote, one heading level down, titled by its variant."""
    text = validation_markdown.render(record["result"], record["command"])
    title, rest = text.split("\n", 1)
    title = title.replace("# Projection validation:", f"## Variant `{variant}`:", 1)
    return title + "\n" + "\n".join("#" + line if line.startswith("#") else line for line in rest.split("\n"))


def _signed(share: float) -> str:
    return f"{share:+.2%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    measure = sub.add_parser("run", help="run both validations, keep their records, fill the report")
    measure.add_argument("--run-dir", required=True)
    again = sub.add_parser("fill", help="fill the report's blocks from the committed records, running nothing")
    for step in (measure, again):
        step.add_argument("-o", "--output", required=True, help="the report whose blocks are filled")
    args = parser.parse_args()
    {"run": run, "fill": fill}[args.step](args)


if __name__ == "__main__":
    main()
