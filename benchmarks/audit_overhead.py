"""What does auditing cost? GradProbe (baseline, magnitude) on TinyStories-33M, each run in a
fresh process: unaudited, audited with the default probes (RSS with exact per-stage peaks),
with tracemalloc, and with memray. Every GradProbe phase method is staged from outside.

    .venv/bin/python benchmarks/audit_overhead.py [--rounds 4] [--extra-rounds 2] \
        -o reports/audit-overhead.md                 # fills its `output` block, writes its .json
    .venv/bin/python benchmarks/audit_overhead.py --from reports/audit-overhead.json -o reports/audit-overhead.md

Each round runs the modes in a rotated order (unaudited and default every round, tracemalloc
and memray in the first --extra-rounds), so a slow spell on a shared machine falls on all
modes alike. Reported per mode: `prune` = wall time of `GradProbe.prune` inside the audit,
`total` = from entering the audit to run.json written (memray reads its trace there).
Ratios are against the unaudited runs: median/median, min/min, total/unaudited prune,
CPU time (user+sys of the process during the audit) median/median, and the median of the
per-round ratios (default mode only: the pairs run back to back).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import benchmark_record

ARCH = "tinystories-33m"
PHASES = ["prune", "save_state", "record_original_gradients", "record_gradients",
          "select_candidates", "reduce_candidates", "record_reduced_gradients", "decide",
          "apply_masks"]
MODES = {"unaudited": None, "default": {}, "tracemalloc": {"tracemalloc": True},
         "memray": {"memray": True}, "census": {"census": True}}


def child(mode: str, out: str) -> dict:
    """One measured run, in this (fresh) process."""
    import auditor
    from architectures import build_model
    from architectures.calibration import synthetic_batches
    from gradprobe.pruner import GradProbe

    model = build_model(ARCH, seed=0)
    batches = synthetic_batches(model.config.vocab_size, 128, 1, 2, seed=0)
    pruner = GradProbe(model, strategy="magnitude")

    def prune():
        return pruner.prune(batches, sparsity=0.1, num_batches=2, reduction_factor=0.1,
                            gradient_threshold=2.0)

    cpu_began = _cpu_s()
    if MODES[mode] is None:
        began = time.perf_counter()
        result = prune()
        prune_s = total_s = time.perf_counter() - began
        stages = peak = boundaries_s = None
    else:
        targets = [f"gradprobe.pruner:GradProbe.{phase}" for phase in PHASES]
        audit = auditor.Audit(out, name=mode, stage_targets=targets, **MODES[mode])
        began = time.perf_counter()
        with audit:
            started = time.perf_counter()
            result = prune()
            prune_s = time.perf_counter() - started
        total_s = time.perf_counter() - began
        stages, peak = len(audit.record["stages"]), audit.record["peak"]["rss"]
        boundaries_s = audit.record["audit_overhead_s"]["boundaries_s"]
    return {"mode": mode, "prune_s": prune_s, "total_s": total_s, "cpu_s": _cpu_s() - cpu_began,
            "boundaries_s": boundaries_s, "stages": stages, "peak_rss": peak,
            "sparsity": result.sparsity}


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def noop_stage_ns(rounds: int = 200_000) -> float:
    import auditor
    began = time.perf_counter()
    for _ in range(rounds):
        with auditor.stage("noop"):
            pass
    return (time.perf_counter() - began) / rounds * 1e9


def schedule(rounds: int, extra_rounds: int, extra_modes: list[str]) -> list[str]:
    order = []
    for i in range(rounds):
        modes = ["unaudited", "default"] + (extra_modes if i < extra_rounds else [])
        shift = i % len(modes)
        order.extend(modes[shift:] + modes[:shift])
    return order


def run_child(mode: str, folder: str, index: int) -> dict:
    out = os.path.join(folder, f"{index:02d}-{mode}")
    result = subprocess.run([sys.executable, __file__, "--child", mode, "--out", out],
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{mode} run failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def summary(runs: list[dict]) -> list[str]:
    by_mode: dict[str, list[dict]] = {}
    for run in runs:
        by_mode.setdefault(run["mode"], []).append(run)
    base = by_mode["unaudited"]
    base_prune = [r["prune_s"] for r in base]
    base_cpu = [r["cpu_s"] for r in base]
    lines = [f"\n{'mode':<12}{'n':>3}{'prune min':>11}{'median':>9}{'total median':>14}"
             f"{'x median':>10}{'x min':>8}{'x total':>9}{'x cpu':>8}{'stages':>8}"]
    for mode, mode_runs in by_mode.items():
        prune = [r["prune_s"] for r in mode_runs]
        total = [r["total_s"] for r in mode_runs]
        lines.append(f"{mode:<12}{len(mode_runs):>3}{min(prune):>10.2f}s{statistics.median(prune):>8.2f}s"
                     f"{statistics.median(total):>13.2f}s"
                     f"{statistics.median(prune) / statistics.median(base_prune):>10.3f}"
                     f"{min(prune) / min(base_prune):>8.3f}"
                     f"{statistics.median(total) / statistics.median(base_prune):>9.3f}"
                     f"{statistics.median(r['cpu_s'] for r in mode_runs) / statistics.median(base_cpu):>8.3f}"
                     f"{mode_runs[0]['stages'] or '-':>8}")
    pairs = [d["prune_s"] / u["prune_s"] for u, d in zip(base, by_mode["default"], strict=False)]
    lines.append(f"\ndefault/unaudited, per round (back-to-back pairs): "
                 f"{', '.join(f'{p:.3f}' for p in pairs)}; median {statistics.median(pairs):.3f}")
    lines.append("time spent inside the auditor's stage boundaries (its own clock), share of that "
                 "run's prune wall:")
    for mode, mode_runs in by_mode.items():
        if mode_runs[0]["boundaries_s"] is not None:
            spent = [r["boundaries_s"] for r in mode_runs]
            share = [r["boundaries_s"] / r["prune_s"] for r in mode_runs]
            lines.append(f"  {mode:<12} median {statistics.median(spent) * 1000:7.1f} ms, "
                         f"median share {statistics.median(share) * 100:.2f}%, max share {max(share) * 100:.2f}%")
    for mode, mode_runs in by_mode.items():
        lines.append(f"final sparsity, {mode}: {sorted({round(r['sparsity'], 6) for r in mode_runs})}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--extra-rounds", type=int, default=2)
    parser.add_argument("--extra-modes", nargs="*", default=["tracemalloc", "memray"])
    benchmark_record.add_options(parser)
    parser.add_argument("--child", choices=sorted(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.out)))
        return
    benchmark_record.publish(args, lambda: measure(args), output)


def measure(args) -> dict:
    noop_ns = noop_stage_ns()
    order = schedule(args.rounds, args.extra_rounds, args.extra_modes)
    load_before = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory(prefix="audit-overhead-") as folder:
        for index, mode in enumerate(order):
            runs.append(run_child(mode, folder, index))
            print(f"  {index + 1:>2}/{len(order)} {mode}", flush=True)
    return {"command": shlex.join([".venv/bin/python", "benchmarks/audit_overhead.py", *sys.argv[1:]]),
            "noop_stage_ns": noop_ns, "load_before": list(load_before), "load_after": list(os.getloadavg()),
            "runs": runs}


def output(record: dict) -> str:
    """What the benchmark prints, from its record alone."""
    runs = record["runs"]
    return "\n".join([
        f"no audit active: {record['noop_stage_ns']:.0f} ns per `with auditor.stage(...)` (object creation included)",
        f"GradProbe magnitude on {ARCH} (seq 128, batch 1, 2 batches, s=0.1); {len(runs)} fresh processes; "
        f"load average before: {', '.join(f'{x:.2f}' for x in record['load_before'])}",
        *[f"  {index + 1:>2}/{len(runs)} {run['mode']:<12} prune {run['prune_s']:7.2f} s  "
          f"total {run['total_s']:7.2f} s  cpu {run['cpu_s']:7.2f} s" for index, run in enumerate(runs)],
        *summary(runs),
        f"load average after: {', '.join(f'{x:.2f}' for x in record['load_after'])}", ""])


if __name__ == "__main__":
    main()
