"""`auditor report RUN [RUN ...] [-o REPORT.md]`: the markdown memory report of a run, from its
record alone (run.json or its run folder; no live process), with the timeline PNG beside it.
Records of `auditor train-step` give the training-step report instead, one or several
configurations in one report.

Default output: report.md in the run folder. A record that is missing, truncated, not JSON
or of an unknown schema, and an output path that cannot be written, are usage errors: one
line, exit status 2.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path

from auditor.cli import UsageError

DEFAULT_NAME = "report.md"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "report", help="render a markdown memory report from a run record",
        description="Render the memory report of a run from its record alone (run.json or a "
                    "run folder): summary, stages, components, timeline PNG, allocation sites, "
                    "findings, minimum, environment.")
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run.json, or the run folder holding it; several train-step runs "
                             "make one training-step report")
    parser.add_argument("-o", "--out", metavar="REPORT.md",
                        help=f"where to write the report (default: {DEFAULT_NAME} in the run folder); "
                             "the PNG goes beside it")
    parser.set_defaults(handler=main)


def main(args) -> int:
    from auditor.record import RunRecordError, load
    loaded = []
    for run in args.runs:
        try:
            loaded.append((load(run), Path(run) if Path(run).is_dir() else Path(run).parent))
        except RunRecordError as error:
            raise UsageError(f"{error}; give a run.json written by `auditor run` or its run folder") from None
    training = [(record.get("workload") or {}).get("job") == "train-step" for record, _ in loaded]
    if len(loaded) > 1 and not all(training):
        raise UsageError("several runs make one report only when all are `auditor train-step` runs")
    run_folder = loaded[0][1]
    out = Path(args.out) if args.out else run_folder / DEFAULT_NAME
    _check_writable(out)
    try:
        if all(training):
            from auditor.renderers.train_step_markdown import write_report
            write_report(loaded, out, command=shlex.join(args.command_line))
        else:
            from auditor.renderers.markdown import write_report
            write_report(loaded[0][0], out, run_folder=run_folder)
    except OSError as error:
        raise UsageError(f"cannot write the report to {str(out)!r}: {error.strerror or error}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise UsageError(f"run record {args.runs[0]!r} is malformed ({type(error).__name__}: {error})") from None
    print(out)
    return 0


def _check_writable(out: Path) -> None:
    """One line unless `out` and the PNG beside it can be written; creates nothing."""
    if out.is_dir():
        raise UsageError(f"output {str(out)!r} is a folder; give a file name such as {str(out / DEFAULT_NAME)!r}")
    folder = out.parent
    if not folder.is_dir():
        raise UsageError(f"cannot write the report to {str(out)!r}: folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write the report to {str(out)!r}: folder {str(folder)!r} is not writable")
    if out.exists() and not os.access(out, os.W_OK):
        raise UsageError(f"cannot write the report to {str(out)!r}: the file is not writable")
