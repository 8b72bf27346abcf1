"""GradProbe sharded by FSDP2 over torchrun's ranks (gloo, CPU), audited per rank, against one process.

    # one rank's audited prune (what torchrun starts on every rank; alone, a single-process run)
    torchrun --standalone --nproc-per-node 2 benchmarks/sharded_gradprobe.py rank --run-dir runs/sharded
    auditor report runs/sharded                     # the merged report: runs/sharded/report.md

    # the committed comparison: baseline and sharded alone, then 2 and 4 ranks, each a fresh process
    .venv/bin/python benchmarks/sharded_gradprobe.py compare --ranks 2 4 \
        --run-dir reports/sharded-gradprobe-cpu-runs -o reports/sharded-gradprobe-cpu.md

`rank` audits the prune as `auditor gradprobe` does (the pruner's declared phases are stages, its
state is in the census, live tensors on; `auditor.jobs.gradprobe` gives the stage targets and the
categories), then reads the final masks, gathered one tensor at a time after the audit ended (a
collective), and rank 0 writes RUN/summary.json: the counts and the mask digest.
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

import benchmark_record

from auditor.record.schema import RunRecord, Stage

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = "summary.json"
COMPARE = "compare.json"  # what `compare` measured beyond the records: wall times, load, commands


def add_settings(parser) -> None:
    from architectures.options import add_size_arguments
    from gradprobe.cli import add_pruning_arguments
    parser.add_argument("--arch", default="tinystories-33m", help="architecture name")
    add_size_arguments(parser)
    add_pruning_arguments(parser)
    parser.add_argument("--seed", type=int, default=0)


def settings_of(args, variant: str):
    from architectures.options import size_overrides
    from auditor.jobs.gradprobe import Settings
    return Settings(architecture=args.arch, overrides=size_overrides(args), variant=variant,
                    sequence_length=args.seq_len, batch_size=args.batch_size, batches=args.batches,
                    sparsity=args.sparsity, reduction=args.reduction, threshold=args.threshold,
                    seed=args.seed)


def audited_prune(settings, out: Path, reduction: str = "own rows"):
    """This rank's audited prune: (its record, the PruneResult)."""
    import auditor
    from architectures import build_model
    from architectures.calibration import synthetic_batches
    from auditor.jobs import gradprobe as job
    from gradprobe.variants import VARIANTS, ShardedGradProbe

    with auditor.Audit(out=out, name=f"gradprobe-{settings.variant}-{settings.architecture}", census=True,
                       live_tensors=True, stage_targets=job.stage_targets(settings.variant),
                       command=shlex.join(["python", "benchmarks/sharded_gradprobe.py", *sys.argv[1:]])) as run:
        run.annotate("workload", job.workload(settings))
        with auditor.stage("build model"):
            model = build_model(settings.architecture, seed=settings.seed, **settings.overrides)
        batches = synthetic_batches(model.config.vocab_size, settings.sequence_length,
                                    settings.batch_size, settings.batches, seed=settings.seed)
        auditor.track("model", model)
        with auditor.stage("shard model"):  # joins torchrun's group, fully_shards (sharded only)
            make = VARIANTS[settings.variant] if settings.variant != "sharded" else ShardedGradProbe
            pruner = make(model, settings.strategy, **({"reduction": reduction} if make is ShardedGradProbe else {}))
            # named before the stage ends, or the census names it by its class, without categories
            auditor.track("pruner", pruner, categories=job.pruner_categories(settings.variant))
        with auditor.stage("prune"):
            result = pruner.prune(batches, sparsity=settings.sparsity, num_batches=settings.batches,
                                  reduction_factor=settings.reduction, gradient_threshold=settings.threshold)
        run.annotate("result", {"candidates": result.candidates, "pruned": result.pruned,
                                "prunable": result.prunable, "sparsity": result.sparsity})
    return run.record, result


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist

    from gradprobe import mask_digest
    torch.set_num_threads(args.threads)
    variant = args.variant or ("sharded" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "baseline")
    record, result = audited_prune(settings_of(args, variant), Path(args.run_dir), args.gradient_reduction)
    digest = mask_digest(result.masks)  # sharded: every rank gathers each mask in turn
    world = dist.get_world_size() if dist.is_initialized() else 1
    if not dist.is_initialized() or dist.get_rank() == 0:
        summary = {"variant": variant, "world_size": world, "threads_per_rank": args.threads,
                   "reduction": args.gradient_reduction if variant == "sharded" else None,
                   "candidates": result.candidates, "pruned": result.pruned, "prunable": result.prunable,
                   "mask_digest": digest}
        (Path(args.run_dir) / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        # Records, summary and masks are written: leave without the C++ static destructors. In one
        # fresh-clone CI run a finished rank aborted there ("terminate called without an active
        # exception", SIGABRT: a native thread still joinable at exit) and failed the torchrun job.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


# -- compare: fresh processes, one merged or single report each, and the markdown ---------------

def launch(command: list[str]) -> float:
    start = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run(command, cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{shlex.join(command)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return time.perf_counter() - start


def compare_main(args) -> None:
    base = Path(args.run_dir)
    settings = _settings_arguments(args)
    runs, commands = [], []
    planned = [("alone-baseline", 1, "baseline", "own rows"), ("alone-sharded", 1, "sharded", "own rows"),
               *[(f"{n}-ranks" + ("" if r == "own rows" else "-" + r.replace(" ", "-")), n, "sharded", r)
                 for r in args.gradient_reductions for n in args.ranks]]
    for name, ranks, variant, reduction in planned:
        folder = base / name
        script = ["benchmarks/sharded_gradprobe.py", "rank", "--run-dir", str(folder), "--variant", variant,
                  *settings] + (["--gradient-reduction", reduction] if reduction != "own rows" else [])
        command = ([".venv/bin/python", *script] if ranks == 1 else
                   [".venv/bin/python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                    str(ranks), *script])
        seconds = launch([sys.executable, *command[1:]])
        launch([sys.executable, "-m", "auditor", "report", str(folder)])
        runs.append({"name": name, "ranks": ranks, "seconds": seconds})
        commands.append(shlex.join(command).replace(str(ROOT) + "/", ""))
    load = os.getloadavg()
    (base / COMPARE).write_text(json.dumps(
        {"command": shlex.join(["benchmarks/sharded_gradprobe.py", *_without_output(sys.argv[1:])]),
         "load_average_at_end": [round(x, 2) for x in load], "runs": runs, "commands": commands}, indent=1) + "\n")
    _write_tables([base], args.output)


def _without_output(argv: list[str]) -> list[str]:
    """The command as measured: where its table was written (-o) is not part of it."""
    kept, skip = [], False
    for word in argv:
        if skip or word in ("-o", "--output"):
            skip = not skip
            continue
        kept.append(word)
    return kept


def table_main(args) -> None:
    _write_tables([Path(d) for d in args.run_dir], args.output)


def _write_tables(run_dirs: list[Path], output: str) -> None:
    """Each run folder's table (from its compare.json and its runs' records): into the report's
    block named after the folder, or alone in a new file."""
    tables = {f"table {d.name}": table(d) for d in run_dirs}
    filling = Path(output).is_file() and "<!-- begin " in Path(output).read_text()
    text = benchmark_record.fill(output, tables) if filling else "\n".join(tables.values())
    Path(output).write_text(text)
    print(text)


def table(run_dir: Path) -> str:
    """The markdown table of one `compare`, made from what it left in its run folder alone."""
    from auditor import load
    from auditor.analysis.ranks.merged import merge_ranks
    made = json.loads((run_dir / COMPARE).read_text())
    rows = []
    for run in made["runs"]:
        folder = run_dir / run["name"]
        summary = json.loads((folder / SUMMARY).read_text())
        records = ([load(folder)] if run["ranks"] == 1 else
                   [load(folder / f"rank-{r.rank}") for r in merge_ranks(folder).ranks])
        rows.append((run["name"], run["ranks"], summary, [_peaks(r) for r in records], run["seconds"]))
    return render(rows, made)


def _settings_arguments(args) -> list[str]:
    from architectures.options import size_overrides
    out = ["--arch", args.arch, "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size),
           "--batches", str(args.batches), "--sparsity", str(args.sparsity), "--reduction",
           str(args.reduction), "--threshold", str(args.threshold), "--seed", str(args.seed)]
    for name, value in size_overrides(args).items():
        out += [f"--{name.replace('_', '-')}", str(value)]
    return out


def _peaks(record: RunRecord) -> dict:
    stages = record.stages
    live = max(stages, key=lambda s: _live_peak(s) or 0)
    prune = [s for s in stages if s.path == "prune" or s.path.startswith("prune/")]
    prune_live = max(_live_peak(s) or 0 for s in prune)
    prune_rss = max(s.rss.peak or 0 for s in prune)
    return {"rss": record.peak.rss, "rss_stage": record.peak.stage or "(outside every stage)",
            "live": _live_peak(live), "live_stage": live.path,
            "prune_rss": prune_rss, "prune_live": prune_live}


def _live_peak(stage: Stage) -> int | None:
    return stage.live_tensors.peak if stage.live_tensors is not None else None


def _code(stage: str) -> str:
    return stage if stage.startswith("(") else f"`{stage}`"


def render(rows: list, made: dict) -> str:
    from auditor.facts.units import size
    base_digest = rows[0][2]["mask_digest"]
    lines = ["| run | ranks | rank | peak RSS | in stage | peak live tensors | in stage | prune: peak live | "
             "masks = baseline's | wall (whole run) |", "|---|---:|---:|---:|---|---:|---|---:|---|---:|"]
    for name, ranks, summary, peaks, seconds in rows:
        same = "yes" if summary["mask_digest"] == base_digest else "**NO**"
        for rank, p in enumerate(peaks):
            lines.append(f"| {name} | {ranks} | {rank} | {size(p['rss'])} | {_code(p['rss_stage'])} "
                         f"| {size(p['live'])} | "
                         f"`{p['live_stage']}` | {size(p['prune_live'])} | {same} | {seconds:.1f} s |")
    load = made["load_average_at_end"]
    return "\n".join(["<!-- made by: " + made["command"] + " -->",
                      f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", "",
                      *lines, "", "Mask digests: " + ", ".join(f"{n}: `{s['mask_digest'][:16]}`"
                                                              for n, _, s, _, _ in rows), "",
                      "The runs' commands (from the repository root; `compare` starts each in a fresh "
                      "process, with `OMP_NUM_THREADS=1`):", "", "```", *made["commands"], "```", ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    rank = sub.add_parser("rank", help="one rank's audited prune (run it under torchrun)")
    rank.add_argument("--run-dir", required=True)
    rank.add_argument("--variant", help="default: sharded under torchrun, baseline alone")
    rank.add_argument("--threads", type=int, default=1)
    rank.add_argument("--gradient-reduction", default="own rows", help="sharded: how FSDP reduces gradients "
                      "(gradprobe.variants.shards.REDUCTIONS)")
    add_settings(rank)
    compare = sub.add_parser("compare", help="alone, then each number of ranks; a markdown table")
    compare.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    compare.add_argument("--gradient-reductions", nargs="+", default=["own rows"], metavar="REDUCTION")
    compare.add_argument("--run-dir", required=True)
    compare.add_argument("-o", "--output", required=True)
    add_settings(compare)
    tables = sub.add_parser("table", help="the tables again from the run folders `compare` left, measuring nothing")
    tables.add_argument("--run-dir", nargs="+", required=True)
    tables.add_argument("-o", "--output", required=True,
                        help="a report holding a block per run folder (benchmark_record.fill), or a new file")
    args = parser.parse_args()
    {"rank": rank_main, "compare": compare_main, "table": table_main}[args.part](args)


if __name__ == "__main__":
    main()
