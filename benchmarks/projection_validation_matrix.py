"""Every projection checked against a real held-out run, in one table: each GradProbe variant on
both families (GPT-Neo with the magnitude strategy, Mistral with wanda), and two algorithms of
this project's own (examples/pruning: a Hessian-keeping one and an activation-statistics one),
each at a scale-up of 8x or more in parameters.

    python benchmarks/projection_validation_matrix.py --run-dir runs/matrix \\
        -o reports/projection-validation-matrix.md [--case NAME ...]
    python benchmarks/projection_validation_matrix.py --from reports/projection-validation-matrix.json \\
        -o reports/projection-validation-matrix.md      # the report again from its record, running nothing

Each case is one `auditor validate-projection` command in a fresh process (its own report is in
the run folder); this script only runs them and tabulates their validation.json. A case that
fails is a row saying how, never left out. The rows go to a JSON record beside the report
(REPORT.json), from which `--from` renders the same report again.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {  # small -> held-out target: 11.7x (GPT-Neo) and 11.8x (Mistral) in parameters
    "gpt-neo": ("tinystories-33m", ["--layers", "1", "--hidden", "128", "--vocab", "4096"],
                ["--target-layers", "2", "--target-hidden", "512", "--target-vocab", "8192"]),
    "mistral": ("mistral-7b", ["--layers", "1", "--hidden", "128", "--heads", "4",
                               "--intermediate", "344", "--vocab", "4096"],
                ["--target-layers", "2", "--target-hidden", "512", "--target-heads", "8",
                 "--target-intermediate", "1376", "--target-vocab", "8192"]),
}
STRATEGY = {"gpt-neo": "magnitude", "mistral": "wanda"}
MAGNITUDE_ONLY = {"sharded"}  # its shards do not gather WANDA's input norms
PROGRAM_TARGET = ["--target", "llama-2-7b", "--target-layers", "2", "--target-hidden", "512",
                  "--target-intermediate", "1376", "--target-heads", "4", "--target-vocab", "512"]
PROGRAMS = {
    "hessian": ["pruning.hessian:prune_with_hessians", "pruning.hessian:HessianStat.add_batch"],
    "activation-norm": ["pruning.activation_norm:prune_by_activation_norm",
                        "pruning.activation_norm:InputNorms.add_batch"],
}


def cases() -> dict[str, list[str]]:
    """name -> the validate-projection arguments (run folder and report added per case)."""
    from gradprobe.variants import VARIANTS
    found = {}
    for variant in VARIANTS:
        for family, (arch, small, target) in SIZES.items():
            found[f"{variant} / {family}"] = [
                "--arch", arch, *small, "--target", arch, *target, "--variant", variant,
                "--strategy", "magnitude" if variant in MAGNITUDE_ONLY else STRATEGY[family]]
    for method, stages in PROGRAMS.items():
        found[f"program: {method}"] = [
            "--model-from", "pruning.tiny_llama:build_llama", *sum((["--stage", s] for s in stages), []),
            *PROGRAM_TARGET, "examples/prune_tiny_llama.py", "--method", method]
    return found


def run_case(name: str, args: list[str], folder: Path) -> dict:
    slug = "".join(c if c.isalnum() else "-" for c in name).strip("-")
    run_dir = folder / slug
    command = ["auditor", "validate-projection", "--run-dir", str(run_dir), *args]  # report: RUN/validation.md
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "auditor", *command[1:]], cwd=ROOT,
                          capture_output=True, text=True)
    row = {"name": name, "command": command, "wall_s": time.perf_counter() - started,
           "status": done.returncode}
    result_file = run_dir / "validation.json"
    if result_file.is_file():
        result = json.loads(result_file.read_text())
        row.update(scale_up=result["scale_up"], targets=result["targets"],
                   estimated=_estimated(result))
    else:
        row["failure"] = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return row


def _estimated(result: dict) -> str | None:
    """What of the traced peak rests on estimated value-dependent sizes, if the record says."""
    traced = (result.get("projections") or {}).get("traced") or {}
    estimates = traced.get("estimates") or {}
    return estimates.get("summary") if isinstance(estimates, dict) else None


def render(rows: list[dict], argv: list[str]) -> str:
    columns = [("peak live tensors", "traced"), ("live tensors, every stage", "traced"),
               ("peak RSS", "traced"), ("peak live tensors", "scaled"), ("peak RSS", "scaled")]
    head = ["case", "scale-up", *(f"{m} {w}" for w, m in columns),
            "traced stages resting on estimates (worst; no target)", "all met", "wall"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for row in rows:
        if "targets" not in row:
            lines.append(f"| {row['name']} | - | " + " | ".join(["-"] * (len(columns) + 1))
                         + f" | FAILED: {row['failure'].replace('|', '/')} | {row['wall_s']:.0f} s |")
            continue
        found = {(t["what"], t["method"]): t for t in row["targets"]}
        cells = [_cell(found.get(c)) for c in columns]
        cells.append(_estimated_cell(found.get(("live tensors, every stage", "traced"))))
        met = not any(t["met"] is False for t in row["targets"])
        lines.append(f"| {row['name']} | {row['scale_up']:.1f}x | " + " | ".join(cells)
                     + f" | {'yes' if met else 'NO'} | {row['wall_s']:.0f} s |")
    met = sum(1 for r in rows if "targets" in r and not any(t["met"] is False for t in r["targets"]))
    out = ["# Projection validation: every variant, both families, two programs of our own", "",
           "Each row is one `auditor validate-projection` run: audited for real at a small scale, "
           "projected (traced; and scaled for GradProbe), then the held-out target run for real. "
           "Targets: traced within 2% on peak live tensors and on every stage whose sizes are exact, "
           "traced RSS within 5%; scaled within 3% (live tensors) and 5% (RSS) where it prints a "
           "number. A stage resting partly on estimated value-dependent sizes is held to the peak "
           "target only: the run's total of such a structure is estimated from the small run, but "
           "its split across the target's tensors depends on values (its worst error is shown, with "
           "the share of its bytes estimated). "
           "*-* : no such projection for the case (a program is projected by tracing only).", "",
           f"**{met} of {len(rows)} cases meet every target.**", "",
           "```", shlex.join(["python", "benchmarks/projection_validation_matrix.py", *argv]), "```", "",
           *lines, "", "## Commands", ""]
    out += [f"- {row['name']}: `{shlex.join(row['command'])}`" for row in rows]
    return "\n".join(out) + "\n"


def _cell(target: dict | None) -> str:
    if target is None:
        return "-"
    if target["met"] is None:
        return "n/a: " + target.get("not_printed", "no number").split(":")[0]
    if target["error"] is None:
        return "no reading"
    return f"{target['error']:+.2%}" + ("" if target["met"] else " (missed)")


def _estimated_cell(target: dict | None) -> str:
    worst = (target or {}).get("resting_on_estimates")
    if not worst:
        return "none"
    return f"{worst['error']:+.2%} of {worst['stages']} ({worst['estimated_share']:.0%} estimated)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run-dir", help="folder for every case's runs")
    source.add_argument("--from", dest="record", metavar="MATRIX.json",
                        help="render the report again from a matrix's JSON record, running nothing")
    parser.add_argument("-o", "--output", required=True, help="the summary report (markdown)")
    parser.add_argument("--case", action="append", help="only these cases (repeatable)")
    args = parser.parse_args()
    if args.record:
        try:
            saved = json.loads(Path(args.record).read_text())
            rows, argv = saved["rows"], saved["argv"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"--from {args.record!r} is not a matrix record: {error}", file=sys.stderr)
            return 2
        Path(args.output).write_text(render(rows, argv))
        return 0
    chosen = cases()
    if args.case:
        unknown = [c for c in args.case if c not in chosen]
        if unknown:
            print(f"unknown case {unknown[0]!r}; known: {', '.join(chosen)}", file=sys.stderr)
            return 2
        chosen = {c: chosen[c] for c in args.case}
    folder = Path(args.run_dir)
    if folder.exists():
        print(f"--run-dir {args.run_dir!r} exists; give a new folder", file=sys.stderr)
        return 2
    rows = []
    for name, case in chosen.items():
        print(f"{name} ...", file=sys.stderr, flush=True)
        rows.append(run_case(name, case, folder))
        print(f"  {rows[-1].get('failure') or 'done'} ({rows[-1]['wall_s']:.0f} s)", file=sys.stderr)
    Path(args.output).write_text(render(rows, sys.argv[1:]))
    record = Path(args.output).with_suffix(".json")  # what --from renders again
    record.write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1) + "\n")
    return 0 if all("targets" in r and not any(t["met"] is False for t in r["targets"]) for r in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
