"""--run-dir: the folder a job command (gradprobe, validate-projection) writes its runs into,
checked before any work.

    check_new_run_dir(args.run_dir)     # UsageError (one line) unless new or empty, and creatable

A folder that holds anything would mix an old run's files with the new one's, fail half-way
when a child finds its folder taken, or have an old record read back as the new run's. A run
folder is never reused; nothing is created here. Under torchrun the ranks share --run-dir, each
writing into its own RUN/rank-N/ (auditor.capture.ranks), which must be new.
"""
from __future__ import annotations

from pathlib import Path

from auditor.cli import UsageError


def check_new_run_dir(run_dir: str | Path | None) -> None:
    from auditor.capture import ranks
    rank = ranks.identity()
    if rank is not None and run_dir is not None:  # ranks share it, each in its own rank-N
        try:
            ranks.rank_run_folder(run_dir, rank)
        except ValueError as error:
            raise UsageError(f"--run-dir: {error}") from None
        return
    if run_dir is not None:
        check_unused_folder(Path(run_dir), taken=f"--run-dir {str(run_dir)!r} is not empty (a run "
                            "folder is never reused); choose a new --run-dir", problem="--run-dir")


def check_unused_folder(folder: Path, *, taken: str, problem: str) -> None:
    """UsageError `taken` if `folder` holds anything; `problem: ...` if it could not be created."""
    from auditor.record.run_folder import check_run_folder
    if folder.is_dir() and any(folder.iterdir()):
        raise UsageError(taken)
    try:
        check_run_folder(folder)
    except ValueError as error:
        raise UsageError(f"{problem}: {error}") from None
