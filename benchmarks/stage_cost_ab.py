"""What does a stage cost with no audit active, now against an earlier revision? Both
versions of auditor/stage.py are loaded into one process (torch imported, as in a real
program) and timed alternately, so a slow spell falls on both alike.

    .venv/bin/python benchmarks/stage_cost_ab.py --before REV [--rounds 15] [--calls 200000]
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch  # noqa: F401 (the stage reads torch's profiler flag once torch is imported)

import auditor  # noqa: F401


def load_before(revision: str):
    source = subprocess.run(["git", "show", f"{revision}:auditor/stage.py"], capture_output=True,
                            text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "stage_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("stage_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ns_per_stage(module, calls: int) -> float:
    stage = module.stage
    began = time.perf_counter_ns()
    for _ in range(calls):
        with stage("x"):
            pass
    return (time.perf_counter_ns() - began) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="git revision to compare with")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    versions = {args.before: load_before(args.before), "now": sys.modules["auditor.stage"]}
    times = {name: [] for name in versions}
    for _ in range(args.rounds):
        for name, module in versions.items():
            times[name].append(ns_per_stage(module, args.calls))
    for name, values in times.items():
        print(f"{name:>10}: median {statistics.median(values):.0f} ns, min {min(values):.0f} ns "
              f"per `with auditor.stage(...)` with no audit ({args.rounds} rounds of {args.calls:,})")


if __name__ == "__main__":
    main()
