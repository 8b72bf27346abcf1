"""What does recording data-dependent sizes (`Audit(record_sizes=True)`) cost a real run?

The main job (`auditor.jobs.gradprobe.audit`: census, live-tensor meter, staged phases; no
memray) on one variant, with and without the size recorder, rounds alternating the order so a
slow spell falls on both alike, after one untimed warm-up run. Prints each side's median wall time of the whole audited run
and the ratio, with the load averages before and after.

    flock /tmp/cpu.lock .venv/bin/python benchmarks/data_dependent_overhead.py --variant sparse-state --rounds 3
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="sparse-state")
    parser.add_argument("--arch", default="tinystories-33m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers  # noqa: F401  (imported before any timing, as the CLI does)

    from auditor.jobs.gradprobe import Settings, audit
    settings = Settings(architecture=args.arch, variant=args.variant)
    folder = Path(tempfile.mkdtemp(prefix="dd-overhead-"))
    times: dict[str, list[float]] = {"without": [], "with": []}
    sites = None
    print(f"load average before: {os.getloadavg()}")
    try:
        audit(settings, folder / "warm-up")  # first run in the process: imports, caches; not timed
        for round_ in range(args.rounds):
            order = ("without", "with") if round_ % 2 == 0 else ("with", "without")
            for side in order:
                began = time.perf_counter()
                record = audit(settings, folder / f"{side}-{round_}", record_sizes=side == "with")
                times[side].append(time.perf_counter() - began)
                if side == "with":
                    sites = len(record["data_dependent_sizes"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"load average after: {os.getloadavg()}")
    medians = {side: statistics.median(t) for side, t in times.items()}
    for side, t in times.items():
        print(f"{side:>8} recorder: median {medians[side]:.2f} s of {', '.join(f'{x:.2f}' for x in t)}")
    print(f"with / without: {medians['with'] / medians['without']:.3f}x ({sites} sites recorded; "
          f"{args.variant}, {args.arch}, {args.threads} threads, {args.rounds} rounds)")


if __name__ == "__main__":
    main()
