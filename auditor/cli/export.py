"""`auditor export RUN [--format chrome-trace] [-o FILE]`: a run record in another tool's format.

chrome-trace: the Trace Event Format, which Perfetto (ui.perfetto.dev) and chrome://tracing
open (auditor/renderers/chrome_trace.py). A run folder with events.jsonl but no run.json (a
killed run) is rebuilt from its event log without writing run.json, and the export says it
comes from an unfinished run.

Default output: trace.json in the run folder. An unreadable record, and an output that is a
folder, is not a .json file, cannot be written, or would replace part of a run record (run.json, events.jsonl, the
memray trace, any file a record names), are usage errors: one line, exit status 2, nothing
written. A damaged line in the middle of an event log is skipped with a warning on stderr.
"""
from __future__ import annotations

from pathlib import Path

from auditor.cli import BAD_INPUT, UsageError, add_output_argument, check_file_writable, epilog
from auditor.cli.stopping import job_command
from auditor.record.schema import RunRecord

DEFAULT_NAMES = {"chrome-trace": "trace.json"}  # format -> file name in the run folder


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export", help="export a run record as a Chrome trace (opens in Perfetto)",
        description="Export a run record (run.json or its run folder) to another tool's format.\n"
                    "chrome-trace: stages as nested spans per thread, RSS / live tensors / Python heap /\n"
                    "CUDA allocated as counters, marks and peaks as instant events; open the file in\n"
                    "Perfetto (ui.perfetto.dev) or chrome://tracing.",
        epilog=epilog(["auditor export runs/20250101-120000-prune -o prune-trace.json"],
                      [(0, "the trace is written (its path is printed)"), BAD_INPUT],
                      "A run folder with events.jsonl but no run.json (a killed run) is rebuilt from its\n"
                      "event log (run.json is not written); stages still open are drawn to its last known time."))
    parser.add_argument("run", metavar="RUN", help="run folder, or its run.json")
    parser.add_argument("--format", choices=sorted(DEFAULT_NAMES), default="chrome-trace",
                        help="output format (default: chrome-trace, the Trace Event Format)")
    add_output_argument(parser, "where to write (default: trace.json in the run folder)")
    parser.set_defaults(handler=main)


@job_command  # SIGTERM/SIGHUP end it as Ctrl-C does: no temporary output left behind
def main(args) -> int:
    from auditor.renderers.chrome_trace import render
    from auditor.report_models.trace import run_trace
    run = Path(args.run)
    record = read_record(run)
    folder = run if run.is_dir() else run.parent
    out = Path(args.output) if args.output else folder / DEFAULT_NAMES[args.format]
    check_output(out, run)
    try:
        text = render(run_trace(record, source=str(run)))
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise UsageError(f"run record {args.run!r} is malformed ({type(error).__name__}: {error})") from None
    write(out, text)
    print(out)
    return 0


def read_record(run: Path) -> RunRecord:
    """The record of a run folder or run.json; a killed run's is assembled from its event
    log, nothing written."""
    from auditor.cli.report import warn_of_damaged_lines
    from auditor.record.run_folder import RunRecordError, load
    try:
        record = load(run, from_events=True)
    except RunRecordError as error:
        raise UsageError(f"{error}; give a run folder or its run.json") from None
    warn_of_damaged_lines(run if run.is_dir() else run.parent)
    return record


def check_output(out: Path, run: Path) -> None:
    """One line unless the export can be written at `out` without touching a record."""
    from auditor.record.run_folder import record_file_clash
    name = DEFAULT_NAMES["chrome-trace"]
    if out.is_dir():
        raise UsageError(f"output {str(out)!r} is a folder; give a file name such as {str(out / name)!r}")
    instead = str(out.with_name(name))
    if out.exists() and run.exists() and out.samefile(run):
        raise UsageError(f"output {str(out)!r} is the run record being exported; give another file, "
                         f"such as {instead!r}")
    # a trace there would replace part of a record (the memray trace, run.json...), or pass for one
    clash = record_file_clash(out)
    if clash:
        raise UsageError(f"output {str(out)!r} {clash}; give another, such as {instead!r}")
    if out.suffix.lower() != ".json":  # a trace written over script.py or notes.md would pass unnoticed
        raise UsageError(f"output {str(out)!r} is not a .json file: the trace is JSON; give a name such as "
                         f"{str(out.with_suffix('.json'))!r}")
    check_file_writable(out, f"cannot write {str(out)!r}")


def write(out: Path, text: str) -> None:
    """Through a temporary file renamed over `out` (auditor.facts.safe_files): a failed write
    leaves nothing behind, a link planted at `out` is replaced, never followed."""
    from auditor.facts import safe_files
    try:
        safe_files.write_text(out, text + "\n")
    except OSError as error:
        raise UsageError(f"cannot write {str(out)!r}: {error.strerror or error}") from None
