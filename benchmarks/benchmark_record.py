"""A benchmark's record: what one run of a benchmark measured, kept as JSON beside its report so
the report is made again from it alone (`--from RECORD`), byte for byte, like `auditor report`
does from a run folder. The record holds what the report prints and nothing of this machine's
paths: each benchmark cleans its outputs before they go in.

    path = benchmark_record.beside(report)          # reports/x.md -> reports/x.json
    benchmark_record.write(path, {"command": ..., ...})
    record = benchmark_record.read(path)            # one-line error for a file that is not one
    text = benchmark_record.fill("reports/x.md", {"table": ...})  # a hand-written report's measured blocks
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


def beside(report: str | Path) -> Path:
    """Where a report's record lives: the report's name with .json."""
    return Path(report).with_suffix(".json")


def write(path: str | Path, record: dict) -> Path:
    path = Path(path)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def read(path: str | Path, keys: tuple[str, ...] = ()) -> dict:
    """The record at `path`; one line and exit status 2 for a file that is not one, or that lacks
    one of `keys` (what the script reads of it)."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        refuse(f"{path}: not a benchmark record ({error})")
    if not isinstance(record, dict):
        refuse(f"{path}: not a benchmark record (a JSON object is expected)")
    missing = [key for key in keys if key not in record]
    if missing:
        refuse(f"{path}: not this benchmark's record (no {', '.join(missing)})")
    return record


def refuse(message: str) -> NoReturn:
    """Bad input to a benchmark: one line on stderr, exit status 2, nothing measured or written."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def fill(report: str | Path, blocks: dict[str, str]) -> str:
    """A hand-written report with its measured parts made from the record: each block between
    `<!-- begin NAME: made from its record -->` and `<!-- end NAME -->` is replaced by
    `blocks[NAME]`, the prose around them kept. A report without such blocks is refused: the
    record cannot say where its figures go. A report not yet written gets the blocks alone."""
    if not Path(report).exists():  # a new report: the blocks alone, ready for prose around them
        return "\n".join(f"<!-- begin {name}: made from its record -->\n{body.rstrip()}\n<!-- end {name} -->\n"
                         for name, body in blocks.items())
    text = Path(report).read_text()
    for name, body in blocks.items():
        begin, end = f"<!-- begin {name}: made from its record -->\n", f"<!-- end {name} -->"
        if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
            refuse(f"{report}: no block '{name}' to fill (write {begin.strip()} ... {end} where it goes)")
        head, rest = text.split(begin)
        text = head + begin + body.rstrip("\n") + "\n" + end + rest.split(end, 1)[1]
    return text


def add_options(parser: argparse.ArgumentParser) -> None:
    """-o REPORT and --from RECORD, as every benchmark that prints its output into a report has them."""
    parser.add_argument("-o", "--output", metavar="REPORT", help="fill the report's `output` block with what "
                        "this prints, and write the record beside it (REPORT.json)")
    parser.add_argument("--from", dest="record", metavar="RECORD",
                        help="print (and with -o, fill) from a record this script wrote, measuring nothing")


def publish(args: argparse.Namespace, measure: Callable[[], dict], output: Callable[[dict], str]) -> None:
    """Measure (or read --from), print the output, and with -o fill the report's `output` block
    and keep the new record beside it."""
    record = read(args.record) if args.record else measure()
    text = output(record)
    print(text)
    if args.output:
        Path(args.output).write_text(fill(args.output, {"output": f"```\n{text}```"}))
        if not args.record:
            write(beside(args.output), record)
