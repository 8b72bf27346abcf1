"""Where a real gloo rank's RSS beyond its live tensors goes, at the rank projection's two sizes.

    .venv/bin/python benchmarks/rank_rss_retention.py --run-dir runs/rank-rss --repeats 3 \
        -o reports/rank-projection-cpu-runs/rss-retention.json

The per-rank projection (benchmarks/rank_projection.py) gets live tensors right at a held-out
size but RSS 16-20% low. This runs the sharded GradProbe rank of the held-out check for real
(torchrun, 2 ranks, gloo, one thread each) at the small and the held-out size, each with glibc's
default malloc and again with its mmap threshold fixed at 128 KiB (MALLOC_MMAP_THRESHOLD_, which
also stops the threshold from following the blocks freed), and prints for rank 0:
- the gradient passes' peak RSS, live tensors and RSS beyond them (from the rank's run record);
- after the prune, glibc's own account of each malloc arena (`malloc_info`): the main arena (the
  main thread's: the program's tensors and objects) and the other threads' arenas (gloo's
  worker threads), the bytes each holds from the system and how much of that is free.
Peak RSS varies from run to run by tens of MiB at the held-out size, so each configuration runs
`--repeats` times: a row is the run of median peak RSS, with the range of RSS beyond live
tensors over all of them. It prints them as a table and writes them as JSON (`-o`), which the rank projection's report
shows (`benchmarks/rank_projection.py render` reads it from its run folder).

    .venv/bin/python benchmarks/rank_rss_retention.py --sweep --run-dir runs/rank-rss-sweep \
        -o reports/rank-projection-cpu-runs/rss-sweep.json

`--sweep` runs the same rank once at five sizes between the small and the held-out one (hidden
128 to 512), on 2 and 4 ranks, with each malloc, and keeps rank 0's RSS beyond live tensors at
the end of `shard model` and at the prune's peak: how much the prune adds beyond its tensors,
against its live tensors, size by size.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
MALLOC = {"default": "default", "fixed 128 KiB threshold": "fixed"}  # a row's label -> rank_projection.use_malloc's


def arenas() -> dict:
    """glibc's malloc_info of this process: per arena, bytes from the system and bytes free."""
    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes, libc.fclose.argtypes = [ctypes.c_int, ctypes.c_void_p], [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile(suffix=".xml") as file:
        stream = libc.fopen(file.name.encode(), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        text = Path(file.name).read_text()
    found = []
    for number, body in re.findall(r'<heap nr="(\d+)">(.*?)</heap>', text, re.S):
        current = int(re.search(r'<system type="current" size="(\d+)"', body).group(1))
        free = sum(int(size) for size in re.findall(r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"', body))
        found.append({"arena": int(number), "current": current, "free": free})
    mmapped = re.search(r'<total type="mmap" count="\d+" size="(\d+)"', text)
    return {"arenas": found, "mmapped": int(mmapped.group(1)) if mmapped else 0}


def rank_main(settings_json: str, out: str) -> None:
    """One torchrun rank: the held-out check's real rank, then rank 0 writes its arenas."""
    import torch
    import torch.distributed as dist

    from auditor.jobs.gradprobe import Settings
    from auditor.jobs.rank_projection import rank_audit
    torch.set_num_threads(1)
    rank_audit(Settings(**json.loads(settings_json)), Path(out), fake=False)
    if dist.get_rank() == 0:
        (Path(out) / "arenas.json").write_text(json.dumps(arenas()))
    dist.barrier()
    dist.destroy_process_group()


def run(size: str, overrides: dict, malloc: str, folder: Path) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from rank_projection import ARCH, settings, use_malloc
    chosen = asdict(settings(ARCH, overrides))
    use_malloc(MALLOC[malloc])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               __file__, "rank", json.dumps(chosen), str(folder)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise SystemExit(f"{size} ({malloc}) failed:\n{done.stderr[-3000:]}")
    record = json.loads((folder / "rank-0" / "run.json").read_text())
    passes = [s for s in record["stages"] if s["path"].endswith("_gradients")]
    peak = max(passes, key=lambda s: s["rss"]["peak"])
    return {"size": size, "malloc": malloc, "stage": peak["path"].split(".")[-1], "rss": peak["rss"]["peak"],
            "live": peak["live_tensors"]["peak"], **json.loads((folder / "arenas.json").read_text())}


SWEEP = [dict(layers=2, hidden=h, heads=heads, intermediate=i, vocab=v) for h, heads, i, v in
         ((128, 4, 344, 4096), (192, 4, 516, 4096), (256, 4, 688, 6000), (384, 8, 1032, 8191),
          (512, 8, 1378, 8191))]


def sweep_run(overrides: dict, ranks: int, malloc: str, folder: Path) -> dict:
    """One real run of `ranks` ranks: rank 0's prune peak against its state after sharding."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from rank_projection import ARCH, settings, use_malloc

    from auditor.jobs.rank_projection import real_ranks
    use_malloc(MALLOC[malloc])
    record = real_ranks(settings(ARCH, overrides), ranks, folder)[0]
    stages = {s.path: s for s in record.stages}
    prune, sharded = stages["prune"], stages["shard model"]
    return {"hidden": overrides["hidden"], "ranks": ranks, "malloc": malloc,
            "live": prune.live_tensors.peak, "rss": prune.rss.peak,
            "beyond_after_sharding": sharded.rss.end - sharded.live_tensors.end,
            "threshold": prune.live_tensors.allocator_threshold,
            "heap_high_water": prune.live_tensors.heap_high_water}


def median_run(runs: list[dict]) -> dict:
    """The run of median peak RSS, with the range of RSS beyond live tensors over all `runs`."""
    chosen = dict(sorted(runs, key=lambda r: r["rss"])[len(runs) // 2])
    beyond = [r["rss"] - r["live"] for r in runs]
    chosen.update(runs=len(runs), beyond_range=[min(beyond), max(beyond)])
    return chosen


def table(rows: list[dict]) -> str:
    lines = ["| size | malloc | gradient pass at peak | peak RSS | live tensors | RSS beyond them (range) "
             "| main arena: held / free | other arenas: held / free | mmapped |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        main, others = r["arenas"][0], r["arenas"][1:]
        held, free = sum(a["current"] for a in others), sum(a["free"] for a in others)
        lines.append(f"| {r['size']} | {r['malloc']} | `{r['stage']}` | {r['rss'] / MIB:,.1f} MiB "
                     f"| {r['live'] / MIB:,.1f} MiB | {(r['rss'] - r['live']) / MIB:,.1f} MiB "
                     f"({r['beyond_range'][0] / MIB:,.1f}-{r['beyond_range'][1] / MIB:,.1f}) "
                     f"| {main['current'] / MIB:,.1f} / {main['free'] / MIB:,.1f} MiB "
                     f"| {held / MIB:,.1f} / {free / MIB:,.1f} MiB | {r['mmapped'] / MIB:,.1f} MiB |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        return rank_main(*sys.argv[2:4])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, help="a new folder for the runs' records")
    parser.add_argument("-o", "--output", help="write the rows as JSON here too")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each configuration (default: 3)")
    parser.add_argument("--sweep", action="store_true", help="five sizes, 2 and 4 ranks, each malloc, one run each")
    args = parser.parse_args()
    if args.sweep:
        rows = [sweep_run(o, ranks, malloc, Path(args.run_dir) / f"h{o['hidden']}-{ranks}-{malloc.split()[0]}")
                for o in SWEEP for ranks in (2, 4) for malloc in MALLOC]
        for r in rows:
            print(r)
        if args.output:
            command = "benchmarks/rank_rss_retention.py " + " ".join(sys.argv[1:])
            Path(args.output).write_text(json.dumps({"command": command, "rows": rows}, indent=1) + "\n")
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from rank_projection import HELD_OUT, SMALL
    rows = []
    for size, overrides in (("small", SMALL), ("held-out", HELD_OUT)):
        for malloc in MALLOC:
            folders = [Path(args.run_dir) / f"{size}-{malloc.split()[0]}-{n}" for n in range(args.repeats)]
            rows.append(median_run([run(size, overrides, malloc, folder) for folder in folders]))
    print(table(rows))
    if args.output:
        command = "benchmarks/rank_rss_retention.py " + " ".join(sys.argv[1:])
        Path(args.output).write_text(json.dumps({"command": command, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
