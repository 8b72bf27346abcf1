"""A benchmark's record: what one run of a benchmark measured, kept as JSON beside its report so
the report is made again from it alone (`--from RECORD`), byte for byte, like `auditor report`
does from a run folder. The record holds what the report prints and nothing of this machine's
paths: each benchmark cleans its outputs before they go in.

    path = benchmark_record.beside(report)          # reports/x.md -> reports/x.json
    benchmark_record.write(path, {"command": ..., ...})
    record = benchmark_record.read(path)            # one-line error for a file that is not one
"""
from __future__ import annotations

import json
from pathlib import Path


def beside(report: str | Path) -> Path:
    """Where a report's record lives: the report's name with .json."""
    return Path(report).with_suffix(".json")


def write(path: str | Path, record: dict) -> Path:
    path = Path(path)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def read(path: str | Path) -> dict:
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"--from {path}: not a benchmark record ({error})") from None
    if not isinstance(record, dict):
        raise SystemExit(f"--from {path}: not a benchmark record (a JSON object is expected)")
    return record
