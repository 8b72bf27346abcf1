"""`auditor compare`: does a variant really save memory, and does it still give the same result?

    auditor compare --baseline baseline --variant lean --repeats 3 -- --arch tinystories-33m
    auditor compare --baseline-cmd big "python big.py" --variant-cmd small "python small.py"
    auditor compare --from runs/compare-....json -o report.md       (render a record again)
    auditor compare --variant lean --run-dir runs/lean-vs-baseline   (keep every run's folder)

Each side runs in fresh processes, alternating, --repeats times. A bare name is a GradProbe
variant (`python -m gradprobe --variant NAME ...`, the arguments after `--` passed to every
GradProbe side); --baseline-cmd / --variant-cmd give any command (split like a shell would, no
shell run), which may report its loaded RSS and result through AUDITOR_RESULT (see
auditor/comparison/protocol.py). Writes FILE.md, FILE.png (chart) and FILE.json (the record).

A variant claims a saving only beyond the noise measured between runs (the rule is
auditor/comparison/verdict.py's RULE, stated in every report). Exit status: 0 when no variant
claims a saving with a result differing beyond its tolerance; 1 when one does (or a run fails,
or the report cannot be written); 2 for mistakes in what was typed, found before any run; 130
Ctrl-C, 143 SIGTERM, 129 SIGHUP (the run in progress ended, a partial report of those that
finished).
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from auditor.cli import BAD_INPUT, UsageError, add_output_argument, add_run_dir_argument, check_writable_report, epilog
from auditor.cli.stopping import job_command
from auditor.facts import safe_files
from auditor.record.run_folder import EVENTS_FILE, RUN_FILE

if TYPE_CHECKING:
    from auditor.comparison import Side

GRADPROBE_USAGE_STATUS = 2  # the gradprobe CLI's status for a mistake in its arguments


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare", help="validate a variant's memory saving and its result against a baseline",
        description="Run a baseline and variants in fresh processes, alternating; compare peak RSS,\n"
                    "peak over loaded, wall time and results.",
        epilog=epilog(["auditor compare --variant lean --repeats 3 -o lean.md -- --arch tinystories-33m",
                       "auditor compare --baseline-cmd old 'python prune.py' --variant-cmd new "
                       "'python prune.py --lean'",
                       "auditor compare --from runs/compare-baseline-vs-lean.json -o lean.md"],
                      [(0, "pass: no variant claims a saving with a result differing beyond its tolerance"),
                       (1, "a variant claims a saving but its result differs beyond its tolerance, a run "
                           "failed, or the report could not be written"),
                       BAD_INPUT, (130, "Ctrl-C: the run in progress ended, a partial report of those that "
                                           "finished"), (143, "SIGTERM (129 SIGHUP): as Ctrl-C, every child ended")],
                      "A bare NAME is a GradProbe variant: python -m gradprobe --variant NAME, with the arguments\n"
                      "after -- (e.g. -- --arch tinystories-33m --seq-len 128). A command may report its loaded RSS\n"
                      "and result through AUDITOR_RESULT (auditor/comparison/protocol.py).\n"
                      "A saving counts only beyond the noise measured between runs (the report states the rule)."))
    parser.add_argument("--baseline", metavar="NAME", help="GradProbe variant as the baseline (default: baseline)")
    parser.add_argument("--baseline-cmd", nargs=2, metavar=("NAME", "COMMAND"),
                        help="any command as the baseline, named NAME")
    parser.add_argument("--variant", metavar="NAME", action="append", default=[],
                        help="GradProbe variant to compare with the baseline (repeatable)")
    parser.add_argument("--variant-cmd", nargs=2, metavar=("NAME", "COMMAND"), action="append", default=[],
                        help="any command as a variant, named NAME (repeatable)")
    parser.add_argument("--repeats", type=int, default=3, metavar="N", help="runs per side")
    parser.add_argument("--tolerance", metavar="NAME=TOL", action="append", default=[],
                        help="differing result elements a variant may have: a count (10), a fraction "
                             "(0.001) or a percentage (0.1%%) (default: exact, or what the run declares)")
    parser.add_argument("--require-result", action="store_true",
                        help="fail a variant that gives no result to compare")
    add_output_argument(parser, "report file; FILE.png and FILE.json go beside it (default: under runs/)",
                        metavar="FILE.md", old=("--out",))
    add_run_dir_argument(parser, "keep every run's folder (output, result) in DIR, new or empty "
                                 "(default: none kept)", old=("--keep-runs",))
    parser.add_argument("--from", dest="from_record", metavar="RECORD.json",
                        help="render a saved comparison record again instead of running anything")
    parser.add_argument("common", nargs="*", metavar="GRADPROBE_ARG",
                        help="after --: arguments for every GradProbe side")
    parser.set_defaults(handler=main)


@job_command
def main(args) -> int:
    from auditor.comparison import Comparison, ComparisonRecordError, RunFailed, run_comparison
    from auditor.renderers import terminal
    from auditor.report_models.comparison import finished_run
    if args.from_record:
        if (args.baseline or args.baseline_cmd or args.variant or args.variant_cmd or args.common or args.tolerance
                or args.run_dir or args.require_result):
            raise UsageError("--from renders a saved record again; it takes only -o")
        try:
            comparison = Comparison.load(args.from_record)
        except ComparisonRecordError as error:
            raise UsageError(str(error)) from None
        source = Path(args.from_record)
        out = _output(args.output or str(source.with_suffix(".md")), source=source)
        return _finish(comparison, out, console=terminal.console(), source=source)
    if args.common and "--" not in args.command_line:
        raise UsageError(f"unexpected argument {args.common[0]!r}; arguments for GradProbe go after --")
    if args.repeats < 1:
        raise UsageError(f"--repeats must be at least 1, got {args.repeats}")
    baseline, variants, gradprobe_names = _sides(args)
    out = _output(args.output or _default_out(baseline.name, [v.name for v in variants]), default=not args.output)
    if args.run_dir:
        _keep_runs_folder(args.run_dir)
    console = terminal.console()
    total = (len(variants) + 1) * args.repeats
    try:
        comparison = run_comparison(baseline, variants, args.repeats, require_result=args.require_result,
                                    command=shlex.join(args.command_line), keep_runs=args.run_dir,
                                    on_run=lambda run: terminal.comparison_run(console, finished_run(run), total))
    except RunFailed as failure:
        if failure.side.name in gradprobe_names and failure.exit_status == GRADPROBE_USAGE_STATUS:
            lines = failure.stderr_tail.strip().splitlines()
            raise UsageError(lines[-1] if lines else str(failure)) from None
        console.print(f"compare: {failure}", markup=False)
        if failure.stderr_tail:
            console.print(f"last lines of its stderr:\n{failure.stderr_tail}", markup=False)
        return 1
    except KeyboardInterrupt as stop:  # the run in progress ended, the temporary folder removed
        return _interrupted(stop, out, console)
    return _finish(comparison, out, console)


def _interrupted(stop: KeyboardInterrupt, out: Path, console) -> int:
    """A partial report of the runs that finished (none: nothing written); 128 + the signal."""
    from auditor.capture.process_group import exit_status, interruption
    comparison = getattr(stop, "comparison", None)
    if comparison is None or not comparison.record["runs"]:
        why = comparison.record["interrupted"]["why"] if comparison is not None else interruption(stop)
        console.print(f"compare: {why}; no run finished, nothing written", markup=False, soft_wrap=True)
        return exit_status(stop)
    _finish(comparison, out, console)
    console.print(f"compare: {comparison.record['interrupted']['why']}; the report is partial", markup=False,
                  soft_wrap=True)
    return exit_status(stop)


# -- what was typed ----------------------------------------------------------------------------

def _sides(args: argparse.Namespace) -> tuple[Side, list[Side], set[str]]:
    from auditor.comparison import Side, Tolerance
    from auditor.jobs.gradprobe_sides import check_arguments, gradprobe_side, known_variants
    if args.baseline and args.baseline_cmd:
        raise UsageError("give --baseline NAME or --baseline-cmd NAME COMMAND, not both")
    if not args.variant and not args.variant_cmd:
        raise UsageError("nothing to compare: give --variant NAME or --variant-cmd NAME COMMAND")
    names = [args.baseline or ("baseline" if not args.baseline_cmd else None), *args.variant]
    names = [name for name in names if name]
    if names:
        known = known_variants()
        for name in names:
            if name not in known:
                raise UsageError(f"unknown variant {name!r}; known variants: {', '.join(known)} "
                                 f"(or give any command with --variant-cmd NAME COMMAND)")
    if args.common and not names:
        raise UsageError("arguments after -- go to GradProbe sides, and there is none here")
    gradprobe_names: set[str] = set()

    def command_side(name: str, text: str, flag: str) -> Side:
        if not name.strip():
            raise UsageError(f"{flag}: the side needs a name")
        try:
            command = shlex.split(text)
        except ValueError as error:
            raise UsageError(f"{flag} {name}: cannot split the command {text!r}: {error}") from None
        if not command:
            raise UsageError(f"{flag} {name}: the command is empty")
        if shutil.which(command[0]) is None:
            raise UsageError(f"{flag} {name}: {command[0]!r} is not an executable file or a command on PATH")
        return Side(name, command)

    def named_side(variant: str) -> Side:
        try:
            check_arguments(variant, list(args.common))
        except ValueError as error:
            raise UsageError(str(error)) from None
        side = gradprobe_side(variant, list(args.common))
        gradprobe_names.add(side.name)
        return side

    if args.baseline_cmd:
        name, text = args.baseline_cmd  # nargs=2
        baseline = command_side(name, text, "--baseline-cmd")
    else:
        baseline = named_side(args.baseline or "baseline")
    variants = [named_side(name) for name in args.variant]
    variants += [command_side(name, text, "--variant-cmd") for name, text in args.variant_cmd]
    _refuse_duplicates(baseline, variants)
    by_name = {side.name: side for side in variants}
    for item in args.tolerance:
        name, sep, value = item.partition("=")
        if not sep or name not in by_name:
            raise UsageError(f"--tolerance {item!r}: expected NAME=TOL with NAME one of the variants "
                             f"({', '.join(by_name)})")
        try:
            by_name[name].tolerance = Tolerance.parse(value)
        except ValueError as error:
            raise UsageError(f"--tolerance {item!r}: {error}") from None
    return baseline, variants, gradprobe_names


def _refuse_duplicates(baseline, variants) -> None:
    """A side given twice, or the baseline again as a variant, would measure only noise."""
    seen = [baseline]
    for side in variants:
        twin = next((other for other in seen if other.command == side.command), None)
        if twin is baseline:
            raise UsageError(f"variant {side.name!r} runs the baseline's own command; compare the baseline "
                             f"with another variant")
        if twin is not None:
            same = "" if twin.name == side.name else f" (the same command as {twin.name!r})"
            raise UsageError(f"variant {side.name!r} is given twice{same}; give each variant once")
        if any(other.name == side.name for other in seen):
            raise UsageError(f"two sides are named {side.name!r}; give each side its own name")
        seen.append(side)


def _default_out(baseline: str, variants: list[str]) -> str:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")  # and the pid: comparisons started together differ
    return f"runs/compare-{baseline}-vs-{'-'.join(variants)}-{stamp}-{os.getpid()}.md"


def _output(text: str, source: Path | None = None, default: bool = False) -> Path:
    """The report's path, once FILE.md, FILE.png and FILE.json can all be written there without
    landing on a record: a run folder's files, or a JSON file other than a comparison record
    (`source`, the record re-rendered, stays as it is). `default`: the folder may be created."""
    path = Path(text)
    if path.is_dir():
        raise UsageError(f"-o {text!r} is a folder; give a file name ending in .md")
    if path.suffix != ".md":
        raise UsageError(f"-o {text!r}: the report is a markdown file, FILE.md (FILE.png and FILE.json go beside it)")
    check_writable_report(path, create_folder=default)
    held = [name for name in (RUN_FILE, EVENTS_FILE) if (path.parent / name).exists()]
    if held:
        raise UsageError(f"-o {text!r}: {str(path.parent)!r} is a run folder (it holds {held[0]}); "
                         f"write the report outside it")
    record = path.with_suffix(".json")
    if record.name == RUN_FILE:
        raise UsageError(f"-o {text!r} would write its record to {str(record)!r}, a run record's name; "
                         f"name the report otherwise")
    for file in (path.with_suffix(".png"), record):
        if file.is_dir():
            raise UsageError(f"-o {text!r}: {str(file)!r} is a folder; name the report otherwise")
        if file.exists() and not os.access(file, os.W_OK):
            raise UsageError(f"-o {text!r}: {str(file)!r} is not writable")
    if record.exists() and not (source is not None and record.resolve() == source.resolve()):
        _replaceable_record(record, text)
    return path


def _replaceable_record(record: Path, text: str) -> None:
    """Only an earlier comparison's record may be replaced by this one's."""
    from auditor.comparison import Comparison, ComparisonRecordError
    try:
        Comparison.load(record)
    except ComparisonRecordError:
        raise UsageError(f"-o {text!r} would replace {str(record)!r}, which is not a comparison record; "
                         f"name the report otherwise") from None


def _keep_runs_folder(text: str) -> None:
    """A new or empty folder, or one that can be created; creates nothing."""
    from auditor.record.run_folder import dangling_link
    folder = Path(text)
    if dangling_link(folder):
        raise UsageError(f"--run-dir {dangling_link(folder)}")
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--run-dir {text!r} is a file; name a new or empty folder")
    if folder.exists() and any(folder.iterdir()):
        raise UsageError(f"--run-dir folder {text!r} is not empty; name a new or empty folder")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"--run-dir {text!r}: {str(existing)!r} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--run-dir {text!r}: folder {str(existing)!r} is not writable")


# -- what the user sees --------------------------------------------------------------------------

def _finish(comparison, out: Path, console, source: Path | None = None) -> int:
    """The results on the terminal, then the record (the one file that cannot be made again),
    then the chart and the report. A write that fails (a full disk) ends with one line."""
    from auditor.renderers import comparison_chart, comparison_markdown, terminal
    from auditor.report_models.comparison import comparison_report
    report = comparison_report(comparison.record, comparison.summary)
    terminal.comparison(console, report)
    json_path, chart = out.with_suffix(".json"), out.with_suffix(".png")
    written = "the record" if source is not None and json_path.resolve() == source.resolve() else None
    try:
        if written is None:
            comparison.save(json_path)
            written = "the record"
        charted = all(side.runs for side in report.sides)  # a stopped comparison: a side may have none
        if charted:
            comparison_chart.render(report, chart)
        safe_files.write_text(out, _said_interrupted(
            comparison_markdown.render(report, chart=chart.name if charted else None), comparison.record))
    except OSError as error:
        kept = (f"{written} {json_path} is complete: `auditor compare --from {json_path}` renders it again"
                if written else "no record was written")
        console.print(f"compare: cannot write {error.filename or out}: {error.strerror or error}; {kept}",
                      markup=False, soft_wrap=True)
        return 1
    console.print(f"report {out}, " + (f"chart {chart}, " if charted else "") + f"record {json_path}",
                  markup=False, soft_wrap=True)
    return 1 if report.failed else 0


def _said_interrupted(text: str, record: dict) -> str:
    """The report of a stopped comparison says so under its title: its figures are of the runs
    that finished."""
    stopped = record.get("interrupted")
    if not stopped:
        return text
    title, _, rest = text.partition("\n")
    done = len(record["runs"])
    note = (f"**This comparison did not finish: {stopped['why']}. The figures are of the "
            f"{done} run{'s' * (done != 1)} that finished, and so is the verdict; {stopped['run']} is not "
            f"among them.**")
    return f"{title}\n\n{note}\n{rest}"
