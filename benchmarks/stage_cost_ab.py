"""What does a stage cost with no audit active, now against an earlier revision? Both
versions of auditor/capture/stage.py are loaded into one process (torch imported, as in a real
program) and timed alternately, so a slow spell falls on both alike.

    .venv/bin/python benchmarks/stage_cost_ab.py --before REV [--rounds 15] [--calls 200000] \
        [-o reports/audit-overhead.md]     # fills its `stage cost` block, writes audit-overhead-stage-cost.json
"""
from __future__ import annotations

import argparse
import importlib.util
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchmark_record
import torch  # noqa: F401 (the stage reads torch's profiler flag once torch is imported)

import auditor  # noqa: F401


def load_before(revision: str):
    source = subprocess.run(["git", "show", f"{revision}:auditor/capture/stage.py"], capture_output=True,
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
    parser.add_argument("--before", help="git revision to compare with")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("-o", "--output", metavar="REPORT", help="fill the report's `stage cost` block with "
                        "what this prints, and write the record beside it (REPORT-stage-cost.json)")
    parser.add_argument("--from", dest="record", metavar="RECORD",
                        help="print (and with -o, fill) from a record this script wrote, measuring nothing")
    args = parser.parse_args()
    if not (args.before or args.record):
        parser.error("--before REV is needed to measure (or --from RECORD to print a measurement again)")
    record = benchmark_record.read(args.record) if args.record else measure(args)
    text = "\n".join(f"{name:>10}: median {statistics.median(values):.0f} ns, min {min(values):.0f} ns "
                     f"per `with auditor.stage(...)` with no audit ({record['rounds']} rounds of {record['calls']:,})"
                     for name, values in record["times_ns"].items())
    print(text)
    if args.output:
        Path(args.output).write_text(benchmark_record.fill(args.output, {"stage cost": f"```\n{text}\n```"}))
        if not args.record:
            report = Path(args.output)
            benchmark_record.write(report.with_name(report.stem + "-stage-cost.json"), record)


def measure(args) -> dict:
    versions = {args.before: load_before(args.before), "now": sys.modules["auditor.capture.stage"]}
    times: dict[str, list[float]] = {name: [] for name in versions}
    for _ in range(args.rounds):
        for name, module in versions.items():
            times[name].append(ns_per_stage(module, args.calls))
    return {"command": shlex.join([".venv/bin/python", "benchmarks/stage_cost_ab.py", "--before", args.before]),
            "rounds": args.rounds, "calls": args.calls, "times_ns": times}


if __name__ == "__main__":
    main()
