"""`auditor gradprobe`: the main job. Audits GradProbe on an architecture, projects it to
7B-scale targets (scaled and traced) and writes the markdown memory report.

    auditor gradprobe --arch tinystories-33m --target mistral-7b -o reports/gradprobe-tinystories-33m.md
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from auditor.cli import UsageError, check_writable_report
from auditor.cli.progress import StatusLine

DEFAULT_TARGETS = ["mistral-7b"]
SIZES = ("layers", "hidden", "vocab", "heads", "intermediate")


def add_settings_arguments(p) -> None:
    """The GradProbe settings every command that runs the job takes."""
    p.add_argument("--variant", default="baseline", help="GradProbe variant (see gradprobe.variants)")
    p.add_argument("--strategy", default="magnitude", choices=["magnitude", "wanda"])
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--sparsity", type=float, default=0.1)
    p.add_argument("--reduction", type=float, default=0.1)
    p.add_argument("--threshold", type=float, default=2.0, help="gradient threshold tau")
    p.add_argument("--seed", type=int, default=0)


def settings_from(args, overrides: dict, device: str = "cpu"):
    """The job's Settings from those arguments, checked: ValueError (one line) if wrong."""
    import architectures
    import torch
    from auditor.jobs.gradprobe import Settings
    from gradprobe.pruner import check_settings
    from gradprobe.variants import check_variant

    architectures.make_config(args.arch, **overrides)
    check_variant(args.variant)
    check_settings(args.sparsity, args.reduction, args.batches, args.threshold, torch.float32)
    for name in ("seq_len", "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    return Settings(architecture=args.arch, overrides=overrides, variant=args.variant,
                    strategy=args.strategy, device=device, sequence_length=args.seq_len,
                    batch_size=args.batch_size, batches=args.batches, sparsity=args.sparsity,
                    reduction=args.reduction, threshold=args.threshold, seed=args.seed)


def register(subparsers) -> None:
    p = subparsers.add_parser("gradprobe", help="audit GradProbe and write the memory report",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="tinystories-33m", help="architecture name or checkpoint folder")
    for name in SIZES:
        p.add_argument(f"--{name}", type=int, help=f"override the architecture's {name}")
    add_settings_arguments(p)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--target", action="append", dest="targets", metavar="ARCH",
                   help=f"architecture to project to (repeatable; default {DEFAULT_TARGETS[0]})")
    p.add_argument("--no-trace", action="store_true", help="scaled projection only (no traced run)")
    # memray is on by default: it costs about 2 s here and names the lines behind the peak.
    p.add_argument("--memray", dest="memray", action="store_true", default=True,
                   help="trace allocations with memray (the default; kept for old command lines)")
    p.add_argument("--no-memray", dest="memray", action="store_false",
                   help="skip the memray trace (the report then lists no allocation sites)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--run-dir", help="folder for the run record (default: a new folder under runs/)")
    p.add_argument("-o", "--output", help="report path (default reports/gradprobe-ARCH.md)")
    p.set_defaults(handler=main)


def main(args) -> int:
    settings, targets, output = _checked(args)
    import torch

    from auditor.analysis.projection import project
    from auditor.analysis.traced_projection import project_traced
    from auditor.audit import new_run_folder
    from auditor.jobs import gradprobe as job
    from auditor.record import write_json_atomically
    from auditor.renderers.markdown import write_report

    if args.threads:
        torch.set_num_threads(args.threads)
    folder = Path(args.run_dir) if args.run_dir else new_run_folder(f"gradprobe-{args.arch}")
    with StatusLine() as advance:
        advance("auditing the real run")
        record = job.audit(settings, folder, memray=args.memray,
                           on_stage_end=lambda entry: advance(entry["path"]))
        if not args.no_trace:  # small traced runs that let the scaled projection fit its drivers
            from auditor.jobs.calibration import calibrate
            advance("calibrating the scaled projection (small traced runs)")
            record["calibration"] = calibrate(settings, folder / "calibration")
        projections = []
        for target in targets:
            advance(f"projecting to {target} (scaled)")
            projections.append(project(record, target))
            if not args.no_trace:
                advance(f"tracing {target} on fake tensors")
                traced = job.traced_audit(replace(settings, architecture=target, overrides={}),
                                          folder / f"traced-{target}")
                projections.append(project_traced(record, traced))
    record["projections"] = projections
    write_json_atomically(folder / "run.json", record)
    write_report(record, output, run_folder=folder)
    _print_summary(record, output, folder)
    return 0


def _checked(args):
    """Every argument validated before anything runs: bad input is one line, exit 2."""
    import architectures

    overrides = {k: getattr(args, k) for k in SIZES if getattr(args, k) is not None}
    targets = args.targets or DEFAULT_TARGETS
    try:
        import torch
        settings = settings_from(args, overrides, args.device)
        for target in targets:
            architectures.make_config(target)
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available")
    except ValueError as error:
        raise UsageError(str(error)) from None
    output = Path(args.output or f"reports/gradprobe-{args.arch.strip('/').split('/')[-1]}.md")
    check_writable_report(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    return settings, targets, output


def _print_summary(record: dict, output: Path, folder: Path) -> None:
    from auditor.units import size
    peak = record["peak"]
    print(f"peak RSS {size(peak['rss'])} in {peak['stage']}")
    for p in record.get("projections", []):
        if p.get("peak"):
            print(f"{p['method']:>6} projection to {p['target']}: peak RSS {size(p['peak']['rss'])}, "
                  f"live tensors {size(p['live_tensor_peak'])}")
    print(f"report: {output}\nrun record: {folder / 'run.json'}")
