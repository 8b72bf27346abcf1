"""`auditor project-ranks`: sharded GradProbe (FSDP2) projected rank by rank to a target at
several world sizes, and the fewest devices of a given memory that hold its worst rank.

    auditor project-ranks --arch mistral-7b --layers 2 --hidden 128 --target mistral-7b --world-size 2 4 8

It audits the small size for real on --ranks ranks (torchrun, gloo, CPU), traces the target's
ranks on torch's fake process group at each world size (auditor.jobs.rank_projection), pairs each
traced rank with a real one (auditor.analysis.ranks.projection) and writes the report
(auditor.renderers.rank_projection_markdown) and `rank-projection.json` into the run folder.
The real ranks run with this environment's glibc malloc settings: projected RSS holds for ranks
run with the mmap threshold fixed (MALLOC_MMAP_THRESHOLD_); under glibc's default each rank says
what the heap may keep beyond it, and is a lower estimate where that is more than 5% of it.

Exit status: 0 done; 1 a real or traced run failed; 2 bad input; 130 Ctrl-C.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from architectures.options import add_seed_argument, add_size_arguments, at_least, check_model_options, size_overrides
from auditor.cli import BAD_INPUT, UsageError, add_output_argument, add_run_dir_argument, check_writable_report, epilog
from auditor.cli.job_options import gradprobe_settings, take_defaults
from auditor.cli.progress import StatusLine
from auditor.facts import safe_files
from auditor.jobs.settings import RANK_VARIANT, GradProbeSettings

DEFAULT_WORLD_SIZES = [2, 4, 8]
DEFAULT_DEVICE_MEMORY_GIB = [24, 40, 80]


def register(subparsers) -> None:
    p = subparsers.add_parser("project-ranks", help="project sharded GradProbe rank by rank to a target",
                              description=__doc__.split("\n\n")[0],
                              epilog=epilog(["auditor project-ranks --arch mistral-7b --layers 2 --hidden 128 "
                                             "--heads 4 --intermediate 344 --target mistral-7b --world-size 2 4 8",
                                             "auditor project-ranks --layers 1 --target tinystories-33m "
                                             "--world-size 2 4 --device-memory 1",
                                             "MALLOC_MMAP_THRESHOLD_=131072 auditor project-ranks --layers 1 "
                                             "--target tinystories-33m   # RSS that holds for ranks run so"],
                                            [(0, "done"), (1, "a real or traced run failed"), BAD_INPUT,
                                             (130, "Ctrl-C (the runs that finished are kept)")]))
    p.add_argument("--arch", help="architecture audited for real at the small size")
    add_size_arguments(p)
    p.add_argument("--target", default="mistral-7b", metavar="ARCH", help="architecture to project to")
    add_size_arguments(p, prefix="target-", scale="target: ")
    from gradprobe.cli import add_pruning_arguments
    add_pruning_arguments(p)
    add_seed_argument(p)
    p.add_argument("--world-size", type=int, nargs="+", default=DEFAULT_WORLD_SIZES, metavar="N",
                   help="world sizes to project to")
    p.add_argument("--ranks", type=int, default=2, metavar="N", help="real ranks the small size is audited on")
    p.add_argument("--every-rank", action="store_true",
                   help="trace every rank; by default one rank per class of equal shard shapes stands for its class")
    p.add_argument("--device-memory", type=float, nargs="+", default=DEFAULT_DEVICE_MEMORY_GIB, metavar="GIB",
                   help="device sizes in GiB the report finds the fewest ranks for")
    add_run_dir_argument(p, "folder for every run (default: a new folder under runs/)")
    add_output_argument(p, "markdown report (default: rank-projection.md in the run folder)", metavar="REPORT.md")
    take_defaults(p, GradProbeSettings)
    p.set_defaults(handler=main, variant=RANK_VARIANT)  # the one variant that runs on ranks


def main(args) -> int:
    from auditor.cli.run_dir import check_new_run_dir
    check_new_run_dir(args.run_dir)
    small, target = _checked(args)
    from auditor.analysis.ranks.projection import rank_projection
    from auditor.capture.audit import new_run_folder
    from auditor.jobs.rank_projection import project_world_sizes
    from auditor.renderers import rank_projection_markdown

    folder = Path(args.run_dir) if args.run_dir else new_run_folder(f"ranks-{args.arch}-to-{Path(args.target).name}")
    output = Path(args.output) if args.output else folder / "rank-projection.md"
    try:
        with StatusLine() as advance:
            worlds = project_world_sizes(small, target, args.world_size, folder, ranks=args.ranks,
                                         every_rank=args.every_rank, progress=advance)
    except KeyboardInterrupt:
        print(f"auditor: interrupted; the runs that finished are in {str(folder)!r}", file=sys.stderr)
        return 130
    except (RuntimeError, OSError) as error:  # a torchrun or traced child that failed, saying how
        print(f"auditor: {str(error).splitlines()[0]}; the runs that finished are in {str(folder)!r}",
              file=sys.stderr)
        return 1
    safe_files.write_text(folder / "rank-projection.json",
                          json.dumps({"worlds": [w.to_json() for w in worlds]}, indent=1, default=str) + "\n")
    output.parent.mkdir(parents=True, exist_ok=True)
    safe_files.write_text(output, rank_projection_markdown.render(rank_projection(worlds, args.device_memory),
                                                                  small=small, target=target,
                                                                  command=args.command_line))
    from auditor.facts.units import size
    worst = worlds[-1].worst.sharded
    print(f"auditor: {len(worlds)} world size(s) projected; at {worlds[-1].world_size} ranks the worst "
          f"rank's sharded peak is {size(worst.live_tensors)} of live tensors\n"
          f"report: {output}\nruns: {folder}")
    return 0


def _checked(args):
    """The small and the target settings, every argument checked before any work (one line, exit 2)."""
    from dataclasses import replace

    try:
        small = gradprobe_settings(args, size_overrides(args))
        check_model_options(args, "target", prefix="target-")
        at_least(args.ranks, 1, "--ranks")
        for world in args.world_size:
            at_least(world, 1, "--world-size")
        for gib in args.device_memory:
            if not gib > 0:
                raise ValueError(f"--device-memory must be more than 0 GiB, got {gib:g}")
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.output is not None:
        check_writable_report(args.output)
    return small, replace(small, architecture=args.target, overrides=size_overrides(args, "target-"))
