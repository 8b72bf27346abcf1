"""`auditor validate-projection`: check the projections against a real run of a held-out scale.

    auditor validate-projection --arch tinystories-33m --hidden 256 --layers 2 \\
        --target gpt-neo-125m -o reports/projection-validation-gpt-neo-125m.md

Audits GradProbe for real at the small scale, projects it (scaled, fitted on traced calibration
runs; and traced) to the target, runs the target for real and prints the error of every
projected number: the peaks, every stage, every component of the peak stage. Before the
target's real run, its traced projection's peak RSS must fit in the available memory less a
margin, or nothing big runs (exit 2).

Exit status: 0 every target met; 1 a target missed, or a run failed (one line saying how it
ended); 2 bad input, or the target would not fit; 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP (every
child ended).
"""
from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

from architectures.options import add_size_arguments, add_threads_argument, check_model_options, size_overrides
from auditor.cli import (
    BAD_INPUT,
    UsageError,
    add_model_from_argument,
    add_output_argument,
    add_program_arguments,
    add_run_dir_argument,
    add_stage_argument,
    check_script,
    check_writable_report,
    epilog,
)
from auditor.cli.job_options import add_gradprobe_options, check_gradprobe_options, gradprobe_settings
from auditor.cli.stopping import job_command
from auditor.facts import safe_files


def register(subparsers) -> None:
    p = subparsers.add_parser("validate-projection", help="check the projections against a real held-out run",
                              description=__doc__.split("\n\n")[0],
                              epilog=epilog(["auditor validate-projection --arch tinystories-33m --layers 1 "
                                             "--target tinystories-33m --target-layers 8",
                                             "auditor validate-projection --model-from pruning.tiny_llama:build_llama "
                                             "--stage pruning.hessian:HessianStat.add_batch --target llama-2-7b "
                                             "--target-layers 2 --target-hidden 512 examples/prune_tiny_llama.py",
                                             "auditor validate-projection --model-from train:build --stage train:step "
                                             "--target llama-2-7b --target-layers 4 --held-out-args '--layers 4' "
                                             "train.py --layers 1 --batch 2"],
                                            [(0, "every target met"),
                                             (1, "a target missed, or a run failed (one line saying how it ended)"),
                                             (2, BAD_INPUT[1] + "; also a held-out run whose traced peak "
                                                 "would not fit in the available memory"),
                                             (130, "Ctrl-C (the runs that finished are kept)"),
                                             (143, "SIGTERM (129 SIGHUP): as Ctrl-C, every child ended")]))
    p.add_argument("--arch", help="architecture audited at the small scale")
    add_size_arguments(p, scale="small scale: ")
    p.add_argument("--target", default="tinystories-33m", metavar="ARCH", help="held-out architecture")
    add_size_arguments(p, prefix="target-", scale="held-out scale: ")
    add_gradprobe_options(p)
    add_threads_argument(p)
    p.add_argument("--available", metavar="SIZE",
                   help="memory the held-out run may use, e.g. 8GiB (default: what the system has available)")
    p.add_argument("--margin", metavar="SIZE", default="1GiB",
                   help="kept free below the available memory")
    # A value like -1GiB is a value, as argparse takes -1 (then refused as negative), not an option
    p._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)\s*[A-Za-z]*$")
    add_run_dir_argument(p, "folder for every run (default: a new folder under runs/)")
    add_output_argument(p, "markdown report (default: validation.md in the run folder)", metavar="REPORT.md")
    program = p.add_argument_group(
        "a program of your own instead of GradProbe (SCRIPT runs unmodified; the target's sizes "
        "reach its model where --model-from builds it)")
    add_model_from_argument(program, "the traced run and (without --held-out-args) the held-out run")
    add_stage_argument(program)
    program.add_argument("--held-out-args", metavar="'ARGS'",
                         help="the held-out real run is SCRIPT as written with these arguments instead "
                              "(one string, split as a shell would), its own model built by them at the "
                              "target's size: nothing replaced (default: SCRIPT ARGS with its model built at "
                              "the --target sizes by the program's own builder)")
    add_program_arguments(p, program, "the program's Python script")
    p.set_defaults(handler=main)


@job_command
def main(args) -> int:
    from auditor.cli.run_dir import check_new_run_dir
    check_new_run_dir(args.run_dir)  # small/, target/, calibration/ must not exist yet
    program = _checked_program(args)
    held_out_args = _held_out_args(args)
    small, target, target_overrides, output = _checked(args)
    from auditor.capture.audit import new_run_folder
    from auditor.cli.progress import StatusLine
    from auditor.jobs.projection_validation import NotEnoughMemory, validate
    from auditor.renderers import terminal
    from auditor.renderers.validation_markdown import render
    from auditor.report_models.validation import validation_report

    name = Path(args.script).stem if program else args.arch
    folder = Path(args.run_dir) if args.run_dir else new_run_folder(f"validate-{name}-to-{Path(target).name}")
    output = output or folder / "validation.md"
    available = _size(args.available, "--available") if args.available else None

    try:
        with StatusLine() as progress:  # each step printed as it starts, the running one shown with its time
            if program is not None:
                from auditor.capture.tracing.model_from import TargetModel
                from auditor.jobs.program_validation import validate_program
                result = validate_program(program, args.model_from, TargetModel(target, target_overrides),
                                          args.stages, folder, threads=args.threads or 1,
                                          available=available, margin=_size(args.margin, "--margin"),
                                          progress=progress, held_out_args=held_out_args)
            else:
                result = validate(small, target, target_overrides, folder, threads=args.threads,
                                  available=available, margin=_size(args.margin, "--margin"),
                                  progress=progress)
    except NotEnoughMemory as error:
        raise UsageError(str(error)) from None
    except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM, SIGHUP: every child's group ended
        from auditor.capture.process_group import exit_status, interruption
        print(f"auditor: {interruption(stop)}; the runs that finished are in {str(folder)!r}", file=sys.stderr)
        return exit_status(stop)
    except RuntimeError as error:  # a run that failed, saying how: "killed by SIGKILL: out of memory?"
        print(f"auditor: {error}; the runs that finished are in {str(folder)!r}", file=sys.stderr)
        return 1
    report = validation_report(result)
    output.parent.mkdir(parents=True, exist_ok=True)
    safe_files.write_text(output, render(report, args.command_line))
    console = terminal.console(stdout=True, highlight=True, piped_width=200)
    if "held_out" in result:  # which real run the projection was held against
        console.print(result["held_out"]["sentence"], markup=False, highlight=False, soft_wrap=True)
    terminal.validation(console, report, output)
    return 1 if report.missed else 0


def _checked_program(args):
    """The program to validate (None: GradProbe), its script and --model-from checked."""
    if args.script is None and not args.model_from:
        if args.stages:
            raise UsageError("--stage applies to a program of your own: give --model-from and SCRIPT")
        return None
    if args.script is None or not args.model_from:
        raise UsageError("a program of your own needs both --model-from MODULE:NAME and SCRIPT")
    script = check_script(args.script)
    from auditor.capture.staging.targets import resolve
    from auditor.capture.tracing.model_from import check
    from auditor.jobs.script_projection import Program
    folder = str(script.resolve().parent)
    saved = list(sys.path)
    sys.path.insert(0, folder)  # as the script will import them
    from auditor.capture.staging import main_script
    main_script.declare(script)  # --model-from and --stage may name the script's own (__main__:get_llm)
    try:
        check(args.model_from)
        for stage in args.stages:
            resolve(stage)
    except ValueError as error:
        raise UsageError(str(error)) from None
    finally:
        sys.path[:] = saved
    return Program(script=str(script.resolve()), args=list(args.args), cwd=os.getcwd(), path=[folder])


def _held_out_args(args) -> list[str] | None:
    """--held-out-args split as a shell would; UsageError (one line) for what cannot be one."""
    text = args.held_out_args
    if text is None:
        return None
    if args.script is None:
        raise UsageError("--held-out-args are the held-out run's arguments for SCRIPT: give --model-from "
                         "and SCRIPT (GradProbe's held-out run is set by --target and its sizes)")
    try:
        split = shlex.split(text)
    except ValueError as error:  # "No closing quotation"
        raise UsageError(f"--held-out-args {text!r}: {str(error).lower()}; give the arguments as one "
                         "string, quoted as in a shell") from None
    if not split:
        raise UsageError("--held-out-args is empty; give the arguments that run SCRIPT at the target's size, "
                         "e.g. --held-out-args '--layers 32 --hidden 4096'")
    return split


def _checked(args):
    """Every argument validated before anything runs: bad input is one line, exit 2."""
    overrides, target_overrides = size_overrides(args), size_overrides(args, "target-")
    try:
        check_gradprobe_options(args)
        check_model_options(args, "target", prefix="target-")
        _size(args.margin, "--margin")
        if args.available is not None and _size(args.available, "--available") == 0:
            raise ValueError("--available must be more than 0 bytes")
    except ValueError as error:
        raise UsageError(str(error)) from None
    output = Path(args.output) if args.output is not None else None
    if output is not None:
        check_writable_report(output)
    if args.run_dir:
        from auditor.record.run_folder import check_run_folder
        try:
            check_run_folder(args.run_dir)
        except ValueError as error:
            raise UsageError(str(error)) from None
    return gradprobe_settings(args, overrides), args.target, target_overrides, output


def _size(text: str, option: str) -> int:
    from auditor.facts.units import parse_size
    if text.strip().startswith("-"):
        raise UsageError(f"{option} {text}: a size cannot be negative"
                         + (" (0 keeps nothing free)" if option == "--margin" else ""))
    try:
        return parse_size(text)
    except ValueError as error:
        raise UsageError(f"{option}: {error}") from None
