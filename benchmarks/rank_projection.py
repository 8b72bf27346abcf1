"""Per-rank projection of sharded GradProbe (FSDP2) at target world sizes, checked on a held-out scale.

    # held-out check: audit the small size on 2 real ranks, trace the target size at 2 and 4 ranks
    # (every rank), run the target size for real on 2 and 4 ranks (torchrun, gloo), compare per rank
    .venv/bin/python benchmarks/rank_projection.py validate --run-dir runs/rank-projection
    # the same with glibc's mmap threshold fixed in every rank (MALLOC_MMAP_THRESHOLD_=131072)
    .venv/bin/python benchmarks/rank_projection.py validate --run-dir runs/rank-projection --malloc fixed
    # a second held-out size, in the target's regime: its largest blocks above glibc's 32 MiB cap
    .venv/bin/python benchmarks/rank_projection.py validate --run-dir runs/rank-projection --scale large

    # the target: Mistral-7B traced at 2, 4 and 8 ranks (one rank per shard class), paired with the
    # small size's real ranks
    .venv/bin/python benchmarks/rank_projection.py project --run-dir runs/rank-projection \
        --target mistral-7b --world-size 2 4 8
    # the same, every rank audited and traced with glibc's mmap threshold fixed
    .venv/bin/python benchmarks/rank_projection.py project --run-dir runs/rank-projection \
        --target mistral-7b --world-size 2 4 8 --malloc fixed

    .venv/bin/python benchmarks/rank_projection.py render --run-dir runs/rank-projection \
        -o reports/rank-projection-cpu.md

The committed report's run folder is `reports/rank-projection-cpu-runs` (the records of the steps
above, memray files left out): `render --run-dir reports/rank-projection-cpu-runs -o
reports/rank-projection-cpu.md` makes the committed report again, byte for byte.

Each step writes its rows as JSON in the run folder (validation.json, projection-TARGET.json);
`render` writes the markdown from them, with the commands the steps ran. A step run again on the
same folder reuses the runs and traces it finds there, and recomputes its rows.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

from auditor.record.schema import RunRecord

# The small (audited) and the held-out size: Mistral's family, 2 layers, 9.8x in parameters; the
# target's intermediate size (1378) and vocabulary (8191) do not split evenly over 4 ranks.
SMALL = dict(layers=2, hidden=128, heads=4, intermediate=344, vocab=4096)
HELD_OUT = dict(layers=2, hidden=512, heads=8, intermediate=1378, vocab=8191)
# `--scale large`: a second held-out size in the target's regime, where the largest blocks (the
# embedding and output layer, gathered layers, the MLP's weights and gradients) are above glibc's
# 32 MiB cap on its mmap threshold, so they are mmapped and given back when freed whatever the
# threshold does
LARGE = dict(layers=2, hidden=2048, heads=16, intermediate=5632, vocab=32000)
SCALES = {"held-out": (HELD_OUT, ""), "large": (LARGE, "-large")}  # --scale -> size, folder suffix
ARCH = "mistral-7b"
# The held-out check keeps a quarter of the candidates (tau = 0), so the gradients decide; the
# target's projection has the spec's settings (auditor gradprobe's defaults).
SETTINGS = dict(sequence_length=32, batch_size=1, batches=2, sparsity=0.3, threshold=0.0)
TARGET_SETTINGS = dict(sequence_length=128, batch_size=1, batches=2, sparsity=0.1, threshold=2.0)
BUDGETS_GIB = [24, 40, 80]
FIXED_THRESHOLD = 131072  # `--malloc fixed`: glibc's starting mmap threshold, kept
FIXED_SUFFIX = "-fixed-threshold"  # `--malloc fixed`'s run folders and JSON


def settings(architecture: str, overrides: dict, chosen: dict = SETTINGS):
    from auditor.jobs.gradprobe import Settings
    return Settings(architecture=architecture, overrides=overrides, variant="sharded", **chosen)


def small_real(run_dir: Path, chosen: dict = SETTINGS, name: str = "small-2-ranks") -> dict[int, RunRecord]:
    """The audited run: the small size on 2 real ranks."""
    return finished_or_run(settings(ARCH, SMALL, chosen), 2, run_dir / name)


def finished_or_run(chosen, world_size: int, folder: Path) -> dict[int, RunRecord]:
    """Real ranks' records: the ones a finished earlier run left in `folder`, else a new torchrun
    (so a step run again after an analysis change recomputes its rows without rerunning them)."""
    from auditor.jobs.rank_projection import real_ranks
    found = finished_ranks(chosen, world_size, folder)
    return found if found is not None else real_ranks(chosen, world_size, folder)


def finished_ranks(chosen, world_size: int, folder: Path) -> dict[int, RunRecord] | None:
    """The records of a finished run of `chosen` in `folder` (None: no folder); a folder holding
    another run is bad input: one line, exit status 2."""
    from auditor.analysis.ranks.merged import load_ranks
    if not folder.is_dir():
        return None
    found = load_ranks(folder)
    if sorted(found) != list(range(world_size)) or any(
            r.annotations["workload"]["settings"] != asdict(chosen) for r in found.values()):
        print(f"rank_projection.py: error: {folder} holds another run: choose a new --run-dir", file=sys.stderr)
        raise SystemExit(2)
    return found


def validate(args) -> None:
    from auditor.analysis.ranks.projection import held_out_row, project_ranks
    from auditor.jobs.rank_projection import traced_ranks
    run_dir = Path(args.run_dir)
    start = time.perf_counter()
    suffix = use_malloc(args.malloc)
    size, scale_suffix = SCALES[args.scale]
    target = settings(ARCH, size)
    for world in args.world_size:  # a folder holding another run is refused before any work
        finished_ranks(target, world, run_dir / f"held-out-{world}-ranks{scale_suffix}{suffix}")
    real_small = small_real(run_dir, name=f"small-2-ranks{suffix}")
    output = run_dir / f"validation{scale_suffix}{suffix}.json"
    reused = output.is_file() and all((run_dir / f"{kind}-{world}-ranks{scale_suffix}{suffix}").is_dir()
                                      for kind in ("traced", "held-out") for world in args.world_size)
    rows = []
    for world in args.world_size:
        folder = f"{world}-ranks{scale_suffix}{suffix}"
        traced = traced_ranks(target, world, run_dir / f"traced-{folder}", real_small, lower_bound=False)
        projected = project_ranks(real_small, {world: traced})[0]
        real = finished_or_run(target, world, run_dir / f"held-out-{folder}")
        rows += [asdict(held_out_row(world, r, real[r.rank])) for r in projected.ranks]
    # rows recomputed from the runs an earlier step left keep that step's time and load
    timing = ({key: json.loads(output.read_text())[key] for key in ("seconds", "load_average")} if reused
              else {"seconds": time.perf_counter() - start})
    _write(output, {"rows": rows, "small": SMALL, "held_out": size, "scale": _scale(SMALL, size), **timing})


def use_malloc(regime: str) -> str:
    """Every rank this process starts from now on (audited, traced, real) runs with glibc's default
    malloc ("default") or with its mmap threshold fixed at its starting 128 KiB ("fixed"); returns
    the run folders' suffix. glibc reads these variables when a process starts, so this process's
    own malloc is left as it was."""
    for key in [k for k in os.environ if k.startswith("MALLOC_")]:
        del os.environ[key]
    if regime == "default":
        return ""
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(FIXED_THRESHOLD)
    return FIXED_SUFFIX


def project(args) -> None:
    from auditor.analysis.ranks.projection import project_ranks
    from auditor.jobs.rank_projection import traced_ranks
    run_dir = Path(args.run_dir)
    suffix = use_malloc(args.malloc)
    real_small = small_real(run_dir, TARGET_SETTINGS, f"small-2-ranks-target-settings{suffix}")
    target = settings(args.target, {}, TARGET_SETTINGS)
    args.lower_bound_at = args.world_size if args.lower_bound_at is None else args.lower_bound_at
    output = run_dir / f"projection-{args.target}{suffix}.json"
    traced, seconds = {}, _earlier_seconds(output)
    for world in args.world_size:
        start = time.perf_counter()
        folder = run_dir / f"{args.target}-{world}-ranks{suffix}"
        reused = folder.is_dir()  # traces a finished earlier run left (auditor.jobs.rank_projection)
        traced[world] = traced_ranks(target, world, folder, real_small, every_rank=False,
                                     lower_bound=world in args.lower_bound_at)
        if not reused or str(world) not in seconds:
            seconds[str(world)] = time.perf_counter() - start
        worlds = project_ranks(real_small, traced)  # written after each world size: a long trace
        for projected in worlds:
            projected.estimates_measured = projected.world_size in args.lower_bound_at
        _write(output,  # the peaks; the stage rows stay in the traced records
               {"target": args.target, "malloc": args.malloc, "worlds": [w.to_json() for w in worlds],
                "trace_seconds": seconds})


def _earlier_seconds(path: Path) -> dict:
    """The tracing times of the run that traced the folders this one reuses."""
    return json.loads(path.read_text()).get("trace_seconds", {}) if path.is_file() else {}


def _scale(small: dict, large: dict) -> float:
    import architectures
    return architectures.count_parameters(ARCH, **large) / architectures.count_parameters(ARCH, **small)


def _write(path: Path, data: dict) -> None:
    load = os.getloadavg()
    data = {"command": shlex.join(["benchmarks/rank_projection.py", *sys.argv[1:]]),
            "load_average": [round(x, 2) for x in load], **data}
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    print(f"wrote {path}")


NOTES = """\
How: rank r of an N-rank job runs in one process on torch's fake process group
(`torch.testing._internal.distributed.fake_pg`, `init_process_group("fake", rank=r, world_size=N,
store=FakeStore())`): its collectives need no peers, so FSDP2 (`fully_shard` per decoder layer, then
the root) shards the model as on that rank, gathers each layer into a buffer of the whole layer's
size and keeps its own rows of each gradient, while the project's traced run (FakeTensorMode)
measures every tensor at its nominal size (`auditor/jobs/rank_projection.py`).

What broke: FSDP2 under FakeTensorMode builds its default DeviceMesh from `torch.arange` and reads
the values back; fake tensors have none (plain FakeTensorMode raises DataDependentOutputException;
the project's value-free mode reads them as 0, so every rank became rank 0 of a mesh of zeros and
every shard came out empty, shape (0,)). The mesh is now built before tracing, on real tensors, and
handed to `fully_shard` as its default.

And a padded shard: FSDP2 keeps a rank's padded shard (rows that do not divide evenly) only when it
is a plain `torch.Tensor` whose storage pointer is nonzero and unchanged (`reset_sharded_param`);
a fake shard is neither, so a traced last rank padded each such shard a second time (+9-11% on it).
While tracing, a fake shard still on the storage FSDP2 padded is kept, as a real one is
(`keep_padded_shards`); nothing else of FSDP2 is replaced.

What differs from a real gloo rank: in about half of the real rank-runs, a gradient pass's peak
holds one more FSDP all-gather output (the root's and a layer's at once) than the traced rank;
the same run repeated gives either (seen on the tiny test model: both ranks, both passes). It is
consistent with gloo's worker thread dropping the collective's last reference after FSDP let the
buffer go; the fake process group has no such thread. So each rank has an upper bound: its traced
peak plus the largest FSDP unit's flat buffer, and the device count is read from the upper bound.

Two peaks per rank: the whole program's is at `build model` or `shard model`: the audited program
(like `benchmarks/sharded_gradprobe.py`) builds the whole model on every rank and holds it while
FSDP2 copies out the rank's shards; a device run builds it elsewhere (on meta or on the host) and
keeps only its shard, so the device count is read from the sharded part (`prune` and its phases). \
GPU figures are live tensors:
the CUDA context and the caching allocator's slack come on top and are not projected."""


def render(args) -> None:
    from auditor.analysis.ranks.projection import HeldOutRow, ProjectedWorld, held_out_findings, rank_projection
    from auditor.renderers import rank_projection_markdown as md
    from auditor.report_models.rank_retention import rank_retention, retention_sweep
    run_dir = Path(args.run_dir)
    lines = ["# Per-rank projection of sharded GradProbe (FSDP2) at target world sizes", "",
             "<!-- made by: " + shlex.join(["benchmarks/rank_projection.py", *sys.argv[1:]]) + " -->", "",
             md.BASIS, "", NOTES, ""]
    large_suffix = SCALES["large"][1]
    for suffix, title, fixed in (("", "", False), (FIXED_SUFFIX, ", glibc's mmap threshold fixed", True),
                                 (large_suffix, ", a large size", False)):
        validation = run_dir / f"validation{suffix}.json"
        if not validation.is_file():
            continue
        v = json.loads(validation.read_text())
        rows = [HeldOutRow.from_json(row) for row in v["rows"]]
        large = suffix == large_suffix
        malloc = (f"glibc's mmap threshold fixed at {FIXED_THRESHOLD:,} bytes in every rank "
                  f"(`MALLOC_MMAP_THRESHOLD_={FIXED_THRESHOLD}`), the audited ones included" if fixed
                  else "glibc's default malloc")
        lines += [f"## Held-out check{title}: projected ranks against real torchrun ranks (gloo, CPU)", "",
                  f"Audited for real: `{ARCH}` with {v['small']} on 2 ranks. Projected (traced, every rank) and "
                  f"then run for real with torchrun: {v['held_out']}, {v['scale']:.1f}x the parameters, at "
                  f"{' and '.join(sorted({str(r['world_size']) for r in v['rows']}))} ranks, with {malloc}. "
                  + ("At this size the largest blocks (the embedding and the output layer, each gathered layer, "
                     "the MLP's weights and their gradients) are above glibc's 32 MiB cap on the mmap threshold, "
                     "as a 7B model's are: they are mmapped and given back when freed, whatever the threshold "
                     "does; the blocks below it still come from the heap (*heap may keep*). " if large else "")
                  + f"Settings: {SETTINGS}. Targets as for single-process traced projection: "
                  "peak live tensors within 2% (run and every stage), RSS within 5%.", "",
                  *md.validation_table(rows), "", *md.validation_findings(held_out_findings(rows)), "",
                  f"`{v['command']}` ({v['seconds']:.0f} s, load average {v['load_average']})", ""]
    retention = run_dir / "rss-retention.json"
    if retention.is_file():
        lines += [*md.retention_section(rank_retention(json.loads(retention.read_text()))), ""]
    sweeps = sorted(run_dir.glob("rss-sweep*.json"), key=lambda p: (len(p.name), p.name))  # then -2, -3...
    if sweeps:
        lines += [*md.sweep_section(retention_sweep([json.loads(path.read_text()) for path in sweeps])), ""]
    for path in sorted(run_dir.glob("projection-*.json"), key=lambda p: (FIXED_SUFFIX in p.name, p.name)):
        p = json.loads(path.read_text())
        fixed = p.get("malloc") == "fixed"
        projection = rank_projection([ProjectedWorld.from_json(w) for w in p["worlds"]], BUDGETS_GIB)
        lines += [f"## {p['target']}: each rank at {', '.join(str(w.world_size) for w in projection.worlds)} ranks"
                  + (", glibc's mmap threshold fixed" if fixed else ""), "",
                  f"Settings: {TARGET_SETTINGS}, fp32, magnitude; paired with the real ranks of `{ARCH}` "
                  f"with {SMALL} on 2 ranks at the same settings (audited: `{run_dir.name}/"
                  f"small-2-ranks-target-settings{FIXED_SUFFIX if fixed else ''}`)"
                  + (f", every rank audited and traced with `MALLOC_MMAP_THRESHOLD_={FIXED_THRESHOLD}`: its "
                     "projected RSS is the one the held-out check with the threshold fixed holds for"
                     if fixed else "") + ".", "",
                  *md.ranks_table(projection.worlds), "", "### How many devices", "",
                  *md.devices_table(projection), "",
                  f"`{p['command']}` (tracing took " + ", ".join(f"{s:.0f} s at {w}" for w, s in
                                                                 p["trace_seconds"].items()) +
                  f" ranks; load average {p['load_average']})", ""]
    Path(args.output).write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    for name in ("validate", "project", "render"):
        step = sub.add_parser(name)
        step.add_argument("--run-dir", required=True)
        if name != "render":
            step.add_argument("--world-size", type=int, nargs="+", default=[2, 4])
        if name in ("validate", "project"):
            step.add_argument("--malloc", choices=["default", "fixed"], default="default",
                              help="glibc's default malloc in every rank, or its mmap threshold fixed at "
                                   f"{FIXED_THRESHOLD} (MALLOC_MMAP_THRESHOLD_); fixed writes its own folders "
                                   f"and JSON, suffixed {FIXED_SUFFIX}")
        if name == "validate":
            step.add_argument("--scale", choices=list(SCALES), default="held-out",
                              help=f"the held-out size: {HELD_OUT} (default), or large: {LARGE}, whose "
                                   "largest blocks are above glibc's 32 MiB mmap threshold cap, as the "
                                   "target's are; large writes its own folders and JSON, suffixed -large")
        if name == "project":
            step.add_argument("--target", default="mistral-7b")
            step.add_argument("--lower-bound-at", type=int, nargs="*", metavar="N",
                              help="world sizes traced a second time with estimated sizes empty, to measure "
                                   "the bytes resting on estimates (default: every one)")
        if name == "render":
            step.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    {"validate": validate, "project": project, "render": render}[args.step](args)


if __name__ == "__main__":
    main()
