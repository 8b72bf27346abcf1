"""`auditor train-step`: the memory of real training steps, component by component, swept over
context lengths and precisions, each configuration in a fresh process.

    auditor train-step --arch tinystories-33m gpt-neo-125m --seq-len 128 512 \\
        --precision fp32 amp-bf16 --accumulation 2 -o reports/train-step-cpu.md

Exit status: 0 every configuration finished; 1 one did not (the report shows its finished
stages and how it ended: "killed by SIGKILL: out of memory?"); 2 bad input, or a --run-dir
already holding a configuration's folder (a run folder is never reused); 130 Ctrl-C, 143
SIGTERM, 129 SIGHUP (the report holds what finished).
"""
from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from architectures.activation_size import PRECISIONS
from architectures.options import (
    add_device_argument,
    add_seed_argument,
    add_sequence_arguments,
    add_size_arguments,
    at_least,
    check_model_options,
    finite_float,
    positive_number,
    size_overrides,
)
from auditor.cli import (
    BAD_INPUT,
    UsageError,
    add_memray_switch,
    add_output_argument,
    add_run_dir_argument,
    check_writable_report,
    epilog,
)
from auditor.cli.job_options import TRAIN_STEP_DEFAULTS, settings_from, take_defaults
from auditor.cli.progress import StatusLine
from auditor.cli.report_name import default_report_path, defaults_of
from auditor.cli.stopping import job_command
from auditor.jobs.optimizer_state import OPTIMIZERS
from auditor.jobs.settings import TrainStepSettings


def register(subparsers) -> None:
    p = subparsers.add_parser("train-step", help="memory of training steps: components, sweeps, leaks",
                              description=__doc__.split("\n\n")[0],
                              epilog=epilog(["auditor train-step --arch tinystories-33m --seq-len 128 512",
                                             "auditor train-step --precision fp32 amp-bf16 --optimizer sgd"],
                                            [(0, "every configuration finished"),
                                             (1, "one did not (the report shows its finished stages and how "
                                                 "it ended)"),
                                             (2, BAD_INPUT[1] + "; also a --run-dir already holding a "
                                                 "configuration's folder"),
                                             (130, "Ctrl-C (the report holds what finished)"),
                                             (143, "SIGTERM (129 SIGHUP): as Ctrl-C, every child ended")]))
    p.add_argument("--arch", nargs="+", metavar="ARCH",
                   help="architecture names or local checkpoint folders")
    add_size_arguments(p)
    add_sequence_arguments(p, many=True)
    p.add_argument("--precision", nargs="+", metavar="MODE", choices=PRECISIONS,
                   help=f"precision modes to sweep: {', '.join(PRECISIONS)} (amp-*: autocast over fp32 "
                        "weights; bf16/fp16: the whole model, gradients and optimizer state in it)")
    p.add_argument("--amp", choices=("bf16", "fp16"), help="autocast: the same as --precision amp-DTYPE")
    p.add_argument("--accumulation", type=int, metavar="N", help="micro-batches per optimizer step")
    p.add_argument("--steps", type=int, metavar="N", help="optimizer steps")
    p.add_argument("--optimizer", metavar="NAME", help=f"one of {', '.join(OPTIMIZERS)}")
    p.add_argument("--lr", type=finite_float, metavar="RATE", help="learning rate (> 0)")
    add_seed_argument(p)
    add_device_argument(p)
    add_memray_switch(p)  # on CPU only
    add_run_dir_argument(p, "folder for the run records (default: a new folder under runs/); refused if "
                            "it already holds a folder of a configuration swept: a run folder is never reused")
    add_output_argument(p, "report path (default: reports/train-step-ARCH.md, plus every setting that "
                           "differs from its default: -seq-len512-sgd...)", metavar="REPORT.md")
    take_defaults(p, TrainStepSettings)
    p.set_defaults(handler=main)
    p.set_defaults(setting_defaults=defaults_of(p))


@job_command
def main(args) -> int:
    configurations, output = _checked(args)
    from auditor.capture.audit import new_run_folder

    folder = Path(args.run_dir) if args.run_dir else new_run_folder("train-step")
    runs = [(settings, folder / _folder_name(settings)) for settings in configurations]
    _check_run_folders(args.run_dir, runs)
    output.parent.mkdir(parents=True, exist_ok=True)  # reports/ by default; only once all is checked
    return _sweep(args, runs, output)


def _folder_name(settings) -> str:
    return f"{Path(settings.architecture).name}-seq{settings.sequence_length}-{settings.precision}"


def _check_run_folders(run_dir: str | None, runs) -> None:
    """UsageError (one line) before any work: a configuration's folder already holding a run
    (an old record must never be rendered under a new command line), or one that cannot be
    created. Other configurations' folders may share the --run-dir."""
    from auditor.cli.run_dir import check_unused_folder
    if run_dir is None:
        return
    for settings, run in runs:
        check_unused_folder(run, taken=f"--run-dir {run_dir!r} already holds {settings.label}'s folder "
                            f"{str(run)!r}; choose a new --run-dir (a run folder is never reused)",
                            problem=f"--run-dir {run_dir!r}")


def _sweep(args, runs, output: Path) -> int:
    """Each configuration in a fresh process; the report covers what finished. Ctrl-C (or
    SIGTERM, SIGHUP) stops the sweep: the report then holds the configurations (and stages)
    done, exit status 128 + the signal (130 for Ctrl-C)."""
    import sys

    from auditor.capture.process_group import exit_status, interruption
    from auditor.jobs.train_step import audit_in_fresh_process
    from auditor.renderers import train_step_markdown
    from auditor.report_models.train_step import train_step_report

    on_cpu = args.device == "cpu"
    records, failed, stopped = [], 0, None
    try:
        with StatusLine() as advance:
            for index, (settings, run) in enumerate(runs, 1):
                advance(f"[{index}/{len(runs)}] {settings.label}, {settings.steps} steps")
                try:
                    record = audit_in_fresh_process(settings, run, memray=on_cpu and args.memray,
                                                    cuda_history=not on_cpu,
                                                    sweep_command=shlex.join(args.command_line))
                except RuntimeError as error:
                    record = None
                    print(f"auditor: {error}", file=sys.stderr)
                except KeyboardInterrupt as stop:  # fresh_process.Interrupted: the child's stages
                    stopped = stop
                    record = getattr(getattr(stop, "child", None), "record", None)
                if record is not None and "workload" in record.annotations:  # it reached the workload
                    records.append((record, run))
                failed += record is None or record.exit is None or record.exit.status != "ok"
                if stopped is not None:
                    break
    except KeyboardInterrupt as stop:  # between two configurations
        stopped = stop
    if not records:
        print("auditor: no configuration left a run record; no report written", file=sys.stderr)
        return exit_status(stopped) if stopped is not None else 1
    train_step_markdown.write(train_step_report([record for record, _ in records]), output,
                              folders=[folder for _, folder in records], command=shlex.join(args.command_line))
    _print_summary(records, output)
    if stopped is not None:
        print(f"auditor: {interruption(stopped)}; the report holds the {len(records)} configuration(s) begun",
              file=sys.stderr)
        return exit_status(stopped)
    return 1 if failed else 0


def _checked(args):
    """Every configuration validated before any runs, without torch until all that can be checked
    without it is: bad input is one line, exit 2."""
    if args.amp and args.precision:
        raise UsageError("give --amp or --precision, not both (--amp bf16 is --precision amp-bf16)")
    precisions = [f"amp-{args.amp}"] if args.amp else (args.precision or [TRAIN_STEP_DEFAULTS["precision"]])
    try:
        _check_each_once(args.arch, args.seq_len, precisions)
        check_model_options(args)
        at_least(args.accumulation, 1, "--accumulation")
        at_least(args.steps, 1, "--steps")
        if args.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {args.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
        positive_number(args.lr, "--lr")
        if args.run_dir is not None:  # a file, or a folder that cannot be made; before torch loads
            from auditor.record.run_folder import check_run_folder
            check_run_folder(args.run_dir)
    except ValueError as error:
        raise UsageError(str(error)) from None
    output = Path(args.output) if args.output is not None else _default_output(args, precisions)
    check_writable_report(output, create_folder=args.output is None)

    from auditor.jobs.train_step import check_settings
    overrides = size_overrides(args)
    configurations = [settings_from(args, TrainStepSettings, architecture=arch, overrides=overrides,
                                    sequence_length=seq, precision=precision)
                      for arch in args.arch for seq in args.seq_len for precision in precisions]
    try:
        for settings in configurations:
            check_settings(settings)  # what only torch can tell: autocast on this device, CUDA
    except ValueError as error:
        raise UsageError(str(error)) from None
    return configurations, output


def _check_each_once(architectures: list[str], lengths: list[int], precisions: list[str]) -> None:
    """A configuration swept twice would run twice into one run folder (named by the
    architecture's folder name, the length and the precision)."""
    names = [Path(a.rstrip("/")).name or a for a in architectures]
    axes: list[tuple[str, Sequence[object], Sequence[object]]] = [
        ("--arch", names, architectures), ("--seq-len", lengths, lengths), ("--precision", precisions, precisions)]
    for option, values, shown in axes:  # values: as the folder names them; shown: as typed
        for i, value in enumerate(values):
            if value in values[:i]:
                first = shown[values.index(value)]
                same = "is given twice" if shown[i] == first else f"and {first} share the name {value!r}"
                raise ValueError(f"{option} {shown[i]} {same}: each configuration runs once, in its own folder")


# Where the records go and the report itself: they leave the report's name alone.
_NOT_IN_THE_NAME = ("handler", "arch", "run_dir", "output", "amp")


def _default_output(args, precisions: list[str]) -> Path:
    settings = {k: getattr(args, k) for k in args.setting_defaults if k not in _NOT_IN_THE_NAME}
    defaults = dict(args.setting_defaults, precision=[TRAIN_STEP_DEFAULTS["precision"]])
    return default_report_path("train-step", args.arch, dict(settings, precision=precisions), defaults)


def _print_summary(records, output: Path) -> None:
    """A line per configuration: its peaks, and how it ended if not ok, with the figures of
    what finished (forward only, when no step did)."""
    from auditor.analysis.training.step import peaks, stage, sweep_rows
    from auditor.facts.units import size
    finished = [record for record, _ in records]
    for record, row in zip(finished, sweep_rows(finished), strict=True):
        head = f"{row['architecture']} seq {row['sequence_length']} {row['precision']}"
        ended = "" if record.exit is not None and record.exit.status == "ok" else \
            f" ({(record.exit.error or record.exit.status) if record.exit is not None else 'unfinished'})"
        if row.get("step_live_tensors") is not None:
            print(f"{head}: forward only {size(row.get('forward_live_tensors'))}, full step "
                  f"{size(row.get('step_live_tensors'))} live tensors; peak RSS {size(row.get('step_rss'))}{ended}")
            continue
        forward = peaks(stage(record, "forward only"))
        done = ("nothing measured" if forward["live_tensors"] is None and forward["rss"] is None else
                f"forward only {size(forward['live_tensors'])} live tensors, peak RSS {size(forward['rss'])}")
        print(f"{head}: no full step finished{ended}; {done}")
    print(f"report: {output}")
