"""`auditor report RUN [RUN ...] [-o REPORT.md]`: the markdown memory report of a run, from its
record alone (run.json or its run folder; no live process), with the timeline PNG beside it.
Records of `auditor train-step` give the training-step report instead, one or several
configurations in one report.

Any run folder renders, finished or not: one with an event log but no run.json (a killed
run, or a disk that filled before run.json) is assembled from its log, nothing written into
it, and the report says at the top that the run did not finish and which stages did.

A multi-rank run folder (RUN/rank-N/ from torchrun or spawn workers, auditor.capture.ranks) gives one
merged report of its ranks (auditor.renderers.ranks_markdown), a killed rank's from its log.

Default output: report.md in the run folder. A record that is missing, truncated, not JSON,
of an unknown schema or with a field of the wrong type, and an output that is not a .md file,
would land on a run record's file, or cannot be written, are usage errors: one line, exit
status 2, nothing written.
"""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from auditor.cli import BAD_INPUT, UsageError, add_output_argument, check_file_writable, epilog
from auditor.cli.stopping import job_command

DEFAULT_NAME = "report.md"
NAME_MAX = 255  # bytes in one file name on Linux and macOS file systems


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "report", help="render a markdown memory report from a run record",
        description="Render the memory report of a run from its record alone (run.json or a "
                    "run folder): summary, stages, components, timeline PNG, allocation sites, "
                    "findings, minimum, environment.",
        epilog=epilog(["auditor report runs/20250101-120000-prune",
                       "auditor report runs/20250101-120000-prune -o reports/prune.md",
                       "auditor report runs/train-step/*/run.json -o train-step.md"],
                      [(0, "the report is written (its path is printed)"), BAD_INPUT]))
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run.json, or the run folder holding it; several train-step runs "
                             "make one training-step report")
    add_output_argument(parser, f"where to write the report (default: {DEFAULT_NAME} in the run folder); "
                                "the PNG goes beside it", metavar="REPORT.md", old=("--out",))
    parser.set_defaults(handler=main)


@job_command  # SIGTERM/SIGHUP end it as Ctrl-C does: no temporary output left behind
def main(args) -> int:
    from auditor.record.run_folder import RunRecordError, load
    if args.output:
        _check_output_name(Path(args.output), [Path(run) for run in args.runs])
    if len(args.runs) == 1 and _multi_rank(Path(args.runs[0])):
        return _ranks_report(Path(args.runs[0]), args.output)
    loaded = []
    for run in args.runs:
        try:
            loaded.append((load(run, from_events=True), Path(run) if Path(run).is_dir() else Path(run).parent))
        except RunRecordError as error:
            raise UsageError(f"{error}; give a run.json written by `auditor run` or its run folder") from None
    for _, folder in loaded:
        warn_of_damaged_lines(folder)
    training = [(record.annotations.get("workload") or {}).get("job") == "train-step" for record, _ in loaded]
    if len(loaded) > 1 and not all(training):
        raise UsageError("several runs make one report only when all are `auditor train-step` runs")
    run_folder = loaded[0][1]
    out = Path(args.output) if args.output else run_folder / DEFAULT_NAME
    _check_writable(out)
    try:
        if all(training):
            from auditor.renderers import train_step_markdown
            from auditor.report_models.train_step import train_step_report
            # in the order the configurations ran, whatever order a shell glob gave them in
            in_order = sorted(loaded, key=lambda pair: pair[0].started_at or "")
            train_step_markdown.write(train_step_report([record for record, _ in in_order]), out,
                                      folders=[folder for _, folder in in_order],
                                      command=shlex.join(args.command_line))
        else:
            from auditor.renderers import markdown
            from auditor.report_models.run import run_report
            markdown.write(run_report(loaded[0][0]), out, run_folder=run_folder)
    except OSError as error:
        raise UsageError(f"cannot write the report to {str(out)!r}: {error.strerror or error}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise UsageError(f"run record {args.runs[0]!r} is malformed ({type(error).__name__}: {error})") from None
    print(out)
    return 0


def _multi_rank(run: Path) -> bool:
    from auditor.analysis.ranks.merged import is_multi_rank
    return is_multi_rank(run)


def _ranks_report(folder: Path, out: str | None) -> int:
    """The merged report of a multi-rank run folder (RUN/rank-N/, one record per rank)."""
    from auditor.analysis.ranks.merged import merge_ranks
    from auditor.facts import safe_files
    from auditor.record.run_folder import RunRecordError, rank_folder_name, rank_folders
    from auditor.renderers import ranks_markdown
    try:
        merged = merge_ranks(folder)
    except RunRecordError as error:
        raise UsageError(f"{error}; give a run folder written by `auditor run` under torchrun") from None
    for rank in rank_folders(folder):
        warn_of_damaged_lines(folder / rank_folder_name(rank), f"rank {rank}: ")
    target = Path(out) if out else folder / DEFAULT_NAME
    _check_writable(target)
    try:
        safe_files.write_text(target, ranks_markdown.render(merged))  # a link planted there is replaced
    except OSError as error:
        raise UsageError(f"cannot write the report to {str(target)!r}: {error.strerror or error}") from None
    print(target)
    return 0


def warn_of_damaged_lines(folder: Path, who: str = "") -> None:
    """On stderr, each damaged line skipped in the event log a record was assembled from (the
    record's warnings say it too; auditor.record.event_log)."""
    from auditor.record.event_log import damaged_lines
    from auditor.record.run_folder import EVENTS_FILE, RUN_FILE
    if (folder / EVENTS_FILE).is_file() and not (folder / RUN_FILE).exists():
        for warning in damaged_lines(folder):
            print(f"auditor: warning: {who}{str(folder)!r}: {warning}", file=sys.stderr)


def _check_output_name(out: Path, runs: list[Path]) -> None:
    """One line unless `out` (and the PNGs beside it) is a markdown file apart from every run
    record's own files."""
    from auditor.record.run_folder import record_file_clash
    for file in (out, out.with_name(out.stem + "-timeline.png"), out.with_name(out.stem + "-components.png")):
        if len(os.fsencode(file.name)) > NAME_MAX:
            raise UsageError(f"output {str(out)!r} would write {file.name[:24]}..., a name over {NAME_MAX} bytes "
                             "(the file system's limit); give a shorter name")
        clash = record_file_clash(file)
        if clash:
            which = f"output {str(out)!r}" if file == out else f"output {str(out)!r} would write {file.name}, which"
            raise UsageError(f"{which} {clash}; give a .md file such as {str(out.with_name(DEFAULT_NAME))!r}")
    for run in runs:
        if out.exists() and run.exists() and out.samefile(run):
            raise UsageError(f"output {str(out)!r} is the run record being rendered; give a .md "
                             f"file such as {str(out.with_name(DEFAULT_NAME))!r}")
    if out.suffix.lower() != ".md" and not out.is_dir():
        raise UsageError(f"output {str(out)!r} is not a .md file: the report is markdown (its "
                         f"PNG goes beside it); give a name such as {str(out.with_suffix('.md'))!r}")


def _check_writable(out: Path) -> None:
    """One line unless `out` and the PNG beside it can be written; creates nothing."""
    if out.is_dir():
        raise UsageError(f"output {str(out)!r} is a folder; give a file name such as {str(out / DEFAULT_NAME)!r}")
    for plot in (out.with_name(out.stem + "-timeline.png"), out.with_name(out.stem + "-components.png")):
        if plot.is_dir():  # found only when the PNG is written, after the work
            raise UsageError(f"cannot write the report to {str(out)!r}: its PNG {str(plot)!r} is a folder; "
                             "give another name with -o")
    check_file_writable(out, f"cannot write the report to {str(out)!r}")
