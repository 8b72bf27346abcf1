"""The projection validation's real runs: the GradProbe job for real, each in a fresh process
(auditor.capture.fresh_process), so its RSS holds nothing of the validating process's.

    record = real_audit(Settings(overrides={"hidden": 256}), folder / "small", threads=2)

The validation (auditor.jobs.projection_validation) starts them; the comparison is analysis
(auditor.analysis.projection.validation): it reads the records these runs leave.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from auditor.jobs.gradprobe import Settings
from auditor.record.schema import RunRecord


def real_audit(settings: Settings, out: Path, threads: int | None = None,
               timeout_s: int = 3600) -> RunRecord:
    """The job for real in a fresh process; its run record. RuntimeError (one line, saying how
    the child ended) when it did not finish."""
    from auditor.capture.fresh_process import run_module
    child = run_module("auditor.jobs.validation_run", json.dumps(asdict(settings)), str(out),
                       str(threads or 0), run_folder=out, timeout_s=timeout_s)
    if not child.ok or child.record is None:
        raise RuntimeError(child.failure(f"real run of {label(settings)}"))
    return child.record


def label(settings: Settings) -> str:
    extra = ", ".join(f"{k} {v}" for k, v in settings.overrides.items())
    return settings.architecture + (f" ({extra})" if extra else "")


def _main(settings: dict, out: Path, threads: int) -> None:
    import torch

    from auditor.jobs.gradprobe import audit
    if threads:
        torch.set_num_threads(threads)
    audit(Settings(**settings), out)


if __name__ == "__main__":  # python -m auditor.jobs.validation_run SETTINGS OUT THREADS
    _main(json.loads(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
