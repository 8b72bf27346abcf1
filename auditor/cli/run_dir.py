"""--run-dir: the folder a job command (gradprobe, validate-projection) writes its runs into,
checked before any work.

    check_new_run_dir(args.run_dir)     # UsageError (one line) unless new or empty, and creatable

A folder that holds anything would mix an old run's files with the new one's, fail half-way
when a child finds its folder taken, or have an old record read back as the new run's. A run
folder is never reused; nothing is created here.
"""
from __future__ import annotations

from pathlib import Path

from auditor.cli import UsageError


def check_new_run_dir(run_dir: str | Path | None) -> None:
    from auditor.record import check_run_folder
    if run_dir is None:
        return
    folder = Path(run_dir)
    if folder.is_dir() and any(folder.iterdir()):
        raise UsageError(f"--run-dir {str(run_dir)!r} is not empty (a run folder is never reused); "
                         "choose a new --run-dir")
    try:
        check_run_folder(folder)
    except ValueError as error:
        raise UsageError(f"--run-dir: {error}") from None
