"""The traced projection's RSS band against real held-out runs: each case one `auditor
validate-projection` at 8x or more in parameters, its real peak RSS (and every stage's) placed
in the band auditor.analysis.projection.rss_band gives from the audited run's own readings.

    python benchmarks/rss_band_validation.py --run-dir runs/rss-band -o reports/rss-band-validation.md [--case NAME ...]
    python benchmarks/rss_band_validation.py --from reports/rss-band-validation.json \\
        -o reports/rss-band-validation.md      # the report again from its record, running nothing

Each case runs in a fresh process; the band is computed again from the run folder's records (the
audited run and the traced one), so the rows are the current code's over those runs. The rows go
to a JSON record beside the report (REPORT.json), from which `--from` renders the same report.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ["--arch", "llama-2-7b", "--layers", "1", "--hidden", "128", "--heads", "4", "--intermediate", "344",
         "--vocab", "4096", "--target", "llama-2-7b", "--target-layers", "2", "--target-hidden", "512",
         "--target-heads", "8", "--target-intermediate", "1376", "--target-vocab", "4096"]  # 8.4x
MISTRAL = ["--arch", "mistral-7b", "--layers", "1", "--hidden", "128", "--heads", "4", "--intermediate", "344",
           "--vocab", "4096", "--target", "mistral-7b", "--target-layers", "2", "--target-hidden", "512",
           "--target-heads", "8", "--target-intermediate", "1376", "--target-vocab", "8192"]  # 11.8x
GPT_NEO = ["--arch", "tinystories-33m", "--layers", "1", "--hidden", "128", "--vocab", "4096",
           "--target", "tinystories-33m", "--target-layers", "2", "--target-hidden", "512",
           "--target-vocab", "8192"]  # 11.7x
CASES = {
    "sparse-state / llama, wanda, sequence 256": [*LLAMA, "--variant", "sparse-state", "--strategy", "wanda",
                                                   "--seq-len", "256"],
    "sparse-state / llama, wanda, sequence 256, batch 2": [*LLAMA, "--variant", "sparse-state", "--strategy",
                                                            "wanda", "--seq-len", "256", "--batch-size", "2"],
    "baseline / mistral, wanda, sequence 256": [*MISTRAL, "--variant", "baseline", "--strategy", "wanda",
                                                "--seq-len", "256"],
    "lean / gpt-neo": [*GPT_NEO, "--variant", "lean", "--strategy", "magnitude"],
    "checkpointed / gpt-neo, batch 4": [*GPT_NEO, "--variant", "checkpointed", "--strategy", "magnitude",
                                        "--batch-size", "4"],
    "program: hessian": ["--model-from", "pruning.tiny_llama:build_llama",
                         "--stage", "pruning.hessian:prune_with_hessians",
                         "--stage", "pruning.hessian:HessianStat.add_batch",
                         "--target", "llama-2-7b", "--target-layers", "2", "--target-hidden", "512",
                         "--target-intermediate", "1376", "--target-heads", "4", "--target-vocab", "512",
                         "examples/prune_tiny_llama.py", "--method", "hessian"],
}


def run_case(name: str, args: list[str], folder: Path) -> dict:
    slug = "".join(c if c.isalnum() else "-" for c in name).strip("-")
    run_dir = folder / slug
    command = ["auditor", "validate-projection", "--run-dir", str(run_dir), *args]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "auditor", *command[1:]], cwd=ROOT, capture_output=True, text=True)
    row: dict = {"name": name, "command": command, "wall_s": round(time.perf_counter() - started, 1),
                 "status": done.returncode}
    if not (run_dir / "validation.json").is_file():
        row["failure"] = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return row
    row.update(measure(run_dir))
    return row


def measure(run_dir: Path) -> dict:
    """The band computed again from the run folder's records, beside the real held-out run."""
    import auditor
    from auditor.analysis.projection.rss_band import where
    from auditor.analysis.projection.scaled import json_stage_keys, stage_keys
    from auditor.analysis.projection.traced import project_traced
    small, real = auditor.load(run_dir / "small"), auditor.load(run_dir / "target")
    traced = project_traced(small, auditor.load(run_dir / "traced-target"))
    validation = json.loads((run_dir / "validation.json").read_text())
    band = traced["peak"]["rss_band"]
    projected = json_stage_keys(traced)
    stages: list[tuple[float, str]] = []
    for key, stage in stage_keys(real).items():
        outside = where(stage.rss.peak, (projected.get(key) or {}).get("rss_band"))
        if outside is not None:
            stages.append((outside, stage.path))
    worst = max(stages, key=lambda s: abs(s[0]), default=None)
    return {"scale_up": validation["scale_up"], "real_rss": real.peak.rss, "point": traced["peak"]["rss"],
            "low": band["low"], "high": band["high"], "basis": band["basis"],
            "real_live_tensors": max((s.live_tensors.peak or 0) for s in real.stages if s.live_tensors),
            "live_tensors": traced["live_tensor_peak"], "outside": where(real.peak.rss, band),
            "stages": len(stages), "stages_inside": sum(1 for s in stages if s[0] == 0.0),
            "worst_stage": ({"path": worst[1], "outside": worst[0]} if worst and worst[0] else None)}


def render(rows: list[dict], argv: list[str]) -> str:
    from auditor.facts import units
    measured = [r for r in rows if "low" in r]
    inside = sum(1 for r in measured if r["outside"] == 0.0)
    stages = sum(r["stages"] for r in measured)
    stages_inside = sum(r["stages_inside"] for r in measured)
    lines = ["# The traced projection's RSS band against real held-out runs", "",
             "Each row is one `auditor validate-projection` run: audited for real at a small scale, traced at "
             "the held-out target, and the target run for real. The band is auditor.analysis.projection.rss_band's, "
             "from the audited run's own readings: low is the tensors at the target plus the audited run's RSS "
             "beyond tensors with no retention growth, high grows that run's retention as its heap's high water "
             "grows at the target (or the allocator model's upper growth); both widened by the noise between "
             "identical runs. *point*: the projected peak RSS; *error*: point against real.", "",
             f"**{inside} of {len(measured)} held-out peaks inside their band; {stages_inside} of {stages} stages.**",
             "", "```", "python benchmarks/rss_band_validation.py " + shlex.join(argv), "```", "",
             "| case | scale-up | live tensors, real / traced | real peak RSS | point (error) | band "
             "(low, high against real) | inside | stages inside | command |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        command = f"`{shlex.join(r['command'])}`"
        if "low" not in r:
            lines.append(f"| {r['name']} | - | - | - | - | - | failed: {r.get('failure', '?')} | - | {command} |")
            continue
        real = r["real_rss"]
        worst = (f" (worst {r['worst_stage']['path']}: {r['worst_stage']['outside']:+.2%} outside)"
                 if r["worst_stage"] else "")
        lines.append(
            f"| {r['name']} | {r['scale_up']:.1f}x | {units.size(r['real_live_tensors'])} / "
            f"{units.size(r['live_tensors'])} | {units.size(real)} | {units.size(r['point'])} "
            f"({r['point'] / real - 1:+.2%}) | {units.size(r['low'])} to {units.size(r['high'])} "
            f"({r['low'] / real - 1:+.1%}, {r['high'] / real - 1:+.1%}) | "
            f"{_inside(r['outside'])} | "
            f"{r['stages_inside']} of {r['stages']}{worst} | {command} |")
    if measured:
        lines += ["", "The basis each report prints, for the first case:", "", f"> {measured[0]['basis']}"]
    return "\n".join(lines) + "\n"


def _inside(outside: float) -> str:
    return "yes" if outside == 0.0 else f"NO, {outside:+.2%} outside"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, default=Path("runs/rss-band"))
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--from", dest="record", type=Path, help="render from this JSON record, running nothing")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.record is not None:
        saved = json.loads(args.record.read_text())
        rows, shown = saved["rows"], saved["argv"]
    else:
        shown = argv
        rows = []
        for name in args.case or list(CASES):
            print(f"{name} ...", file=sys.stderr, flush=True)
            rows.append(run_case(name, CASES[name], args.run_dir))
        args.output.with_suffix(".json").write_text(json.dumps({"argv": shown, "rows": rows}, indent=1) + "\n")
    args.output.write_text(render(rows, shown))
    return 0 if args.record is not None or all(r.get("outside") == 0.0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
