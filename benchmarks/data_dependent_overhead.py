"""What does recording data-dependent sizes (`Audit(record_sizes=True)`) cost a real run?

The main job (`auditor.jobs.gradprobe.audit`: census, live-tensor meter, staged phases; no
memray) on one variant, with and without the size recorder, rounds alternating the order so a
slow spell falls on both alike, after one untimed warm-up run. Prints each side's median wall time
of the whole audited run and the ratio, with the load averages before and after.

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
                    sites = len(record.annotations["data_dependent_sizes"])
        per_op, ops = per_operator_cost(), operators_in(settings, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"load average after: {os.getloadavg()}")
    print(f"recorder cost per operator (tiny adds, best of 5): {per_op * 1e6:.2f} us; {ops:,} operators "
          f"in one audited run: {per_op * ops:.2f} s expected")
    medians = {side: statistics.median(t) for side, t in times.items()}
    for side, t in times.items():
        print(f"{side:>8} recorder: median {medians[side]:.2f} s of {', '.join(f'{x:.2f}' for x in t)}")
    print(f"with / without: {medians['with'] / medians['without']:.3f}x ({sites} sites recorded; "
          f"{args.variant}, {args.arch}, {args.threads} threads, {args.rounds} rounds)")


def per_operator_cost(n: int = 100_000) -> float:
    """Seconds the recorder adds to one operator it does no work for (the common case)."""
    from auditor.capture.tracing.data_dependent import SizeRecorder
    x = torch.ones(4)

    def loop() -> float:
        began = time.perf_counter()
        for _ in range(n):
            torch.add(x, x)
        return time.perf_counter() - began
    bare, recorded = [], []
    for _ in range(5):
        bare.append(loop())
        with SizeRecorder():
            recorded.append(loop())
    return (min(recorded) - min(bare)) / n


def operators_in(settings, folder: Path) -> int:
    """Operators dispatched in one audited run of the job (a counting mode around it)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from auditor.jobs.gradprobe import audit

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))
    with Count():
        audit(settings, folder / "counted", record_sizes=False)
    return Count.calls


if __name__ == "__main__":
    main()
