"""The `auditor` command. Each subcommand is its own module `auditor/cli/<name>.py` with
`register(subparsers)` (which sets `handler`) and is listed in SUBCOMMANDS; nothing else
changes to add one.

Errors in what the user typed: a subcommand raises UsageError and the user sees one line,
`auditor: error: ...`, exit status 2, no traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

SUBCOMMANDS = ["run", "gradprobe", "train_step", "report", "compare", "validate_projection", "export"]


class UsageError(Exception):
    """Bad input on the command line: one line on stderr, exit status 2."""


def check_writable_report(output) -> None:
    """UsageError (one line) unless the report could be written at `output`; creates nothing."""
    from pathlib import Path
    output = Path(output)
    if not os.access(output.parent if output.parent.exists() else Path("."), os.W_OK):
        raise UsageError(f"cannot write the report to {str(output)!r}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(f"{message}; see '{self.prog} --help'")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="auditor", description="Stage-by-stage memory audits of Python code.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"auditor.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
        args.command_line = ["auditor", *argv]
        return args.handler(args)
    except UsageError as error:
        print(f"auditor: error: {error}", file=sys.stderr)
        return 2
