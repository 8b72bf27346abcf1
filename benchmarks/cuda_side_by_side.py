"""GradProbe on CPU against CUDA, made from run records alone: one configuration, its variants
on two devices, side by side (auditor.report_models.device_side_by_side, rendered by
auditor.renderers.device_side_by_side_markdown).

    .venv/bin/python benchmarks/cuda_side_by_side.py RUN_DIR [RUN_DIR ...] -o side-by-side.md

Each RUN_DIR is the --run-dir of one `auditor gradprobe --device DEVICE --variant VARIANT` run of
the same configuration; benchmarks/cuda_check.sh runs them on a lent GPU machine and calls this
at its end. The command line is written in the report as given, so give the folders relative to
the repository (no folder of this machine lands in a committed report).

Exit status: 0 written; 2 bad input (a folder without a run record, runs of another configuration).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from auditor.record.run_folder import load
from auditor.record.schema import RunRecordError
from auditor.renderers.device_side_by_side_markdown import render
from auditor.report_models.device_side_by_side import DeviceSideBySide, SideBySideError, device_side_by_side


def side_by_side(runs: list[str]) -> DeviceSideBySide:
    """The runs' records set side by side (RunRecordError, SideBySideError: one line)."""
    return device_side_by_side([load(run) for run in runs], runs)


def command_line(runs: list[str], output: str) -> str:
    """How the report says it was made: this command, as given."""
    return " ".join(["python benchmarks/cuda_side_by_side.py", *runs, "-o", output])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders of auditor gradprobe")
    parser.add_argument("-o", "--output", required=True, help="markdown report to write")
    args = parser.parse_args(argv)
    try:
        report = side_by_side(args.runs)
    except (RunRecordError, SideBySideError) as error:
        print(f"cuda_side_by_side: {error}", file=sys.stderr)
        return 2
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(render(report, command_line(args.runs, args.output)))
    print(f"side by side of {len(report.runs)} runs: {args.output}")
    for masks in report.devices:
        print(f"  masks within {masks.device}: "
              f"{ {True: 'identical', False: 'DIFFER', None: 'not compared'}[masks.identical] }")
    return 0


if __name__ == "__main__":
    sys.exit(main())
