"""Default report paths never replace a committed report: a run whose settings differ from the
defaults names what differs (reports/gradprobe-tinystories-33m-layers1-hidden64.md), so a
scaled-down smoke test leaves reports/gradprobe-tinystories-33m.md and its PNG as they were.

Real processes of the commands, each in a folder holding a copy of the committed reports.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPORTS = Path(__file__).resolve().parent.parent / "reports"
SMALL = ["--layers", "1", "--hidden", "64", "--vocab", "256", "--heads", "4", "--seq-len", "16"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def auditor(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "auditor", *args], cwd=folder, capture_output=True,
                          text=True, timeout=timeout, env=ENV)


def default_path(folder: Path, *args: str) -> str:
    """The report path the command would write by default, read from its own refusal: that path
    is made a folder first, which the command refuses in one line before any work."""
    done = auditor(folder, *args, timeout=60)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert line.startswith("auditor: error: cannot write the report to '") and "it is a folder" in line, line
    return line.split("'")[1]


@pytest.mark.parametrize("args, expected", [
    (["gradprobe"], "reports/gradprobe-tinystories-33m.md"),
    (["gradprobe", "--arch", "tinystories-33m", "--target", "mistral-7b", "--threads", "2",
      "--run-dir", "runs/x"], "reports/gradprobe-tinystories-33m.md"),  # the committed report's command
    (["gradprobe", "--layers", "1", "--hidden", "64"], "reports/gradprobe-tinystories-33m-layers1-hidden64.md"),
    (["gradprobe", "--variant", "lean", "--strategy", "wanda"], "reports/gradprobe-tinystories-33m-lean-wanda.md"),
    (["gradprobe", "--seq-len", "512", "--sparsity", "0.2", "--no-trace"],
     "reports/gradprobe-tinystories-33m-seq-len512-sparsity0.2-no-trace.md"),
    (["gradprobe", "--no-memray", "--target", "llama-2-7b"],
     "reports/gradprobe-tinystories-33m-targets-llama-2-7b-no-memray.md"),
    (["train-step"], "reports/train-step-tinystories-33m.md"),
    (["train-step", "--optimizer", "sgd", "--batch-size", "4", "--steps", "3"],
     "reports/train-step-tinystories-33m-batch-size4-steps3-sgd.md"),
    (["train-step", "--arch", "tinystories-33m", "gpt-neo-125m", "--seq-len", "128", "512", "--amp", "bf16"],
     "reports/train-step-tinystories-33m-gpt-neo-125m-seq-len128-512-precision-amp-bf16.md"),
])
def test_the_default_name_says_every_setting_that_differs(tmp_path, args, expected):
    (tmp_path / expected).mkdir(parents=True)  # so the command names its default path, and stops
    assert default_path(tmp_path, *args) == expected


def _committed_copy(folder: Path, names: list[str]) -> dict[str, bytes]:
    (folder / "reports").mkdir(exist_ok=True)
    for name in names:
        source = REPORTS / name
        target = folder / "reports" / name
        shutil.copyfile(source, target) if source.exists() else target.write_text(f"# committed {name}\n")
    return {name: (folder / "reports" / name).read_bytes() for name in names}


def test_a_scaled_down_gradprobe_audit_leaves_the_committed_report_alone(tmp_path):
    committed = _committed_copy(tmp_path, ["gradprobe-tinystories-33m.md", "gradprobe-tinystories-33m-timeline.png"])
    done = auditor(tmp_path, "gradprobe", "--arch", "tinystories-33m", *SMALL, "--batches", "1",
                   "--no-trace", "--no-memray", "--threads", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert {name: (tmp_path / "reports" / name).read_bytes() for name in committed} == committed
    written = ("reports/gradprobe-tinystories-33m-layers1-hidden64-vocab256-heads4-seq-len16-batches1-"
               "no-trace-no-memray.md")
    assert (tmp_path / written).is_file() and f"report: {written}" in done.stdout


@pytest.mark.slow
def test_a_scaled_down_training_step_leaves_the_committed_report_alone(tmp_path):
    committed = _committed_copy(tmp_path, ["train-step-tinystories-33m.md"])
    done = auditor(tmp_path, "train-step", *SMALL, "--steps", "1", "--no-memray")
    assert done.returncode == 0, done.stderr[-3000:]
    assert ((tmp_path / "reports" / "train-step-tinystories-33m.md").read_bytes()
            == committed["train-step-tinystories-33m.md"])
    written = "reports/train-step-tinystories-33m-layers1-hidden64-vocab256-heads4-seq-len16-steps1-no-memray.md"
    assert (tmp_path / written).is_file() and f"report: {written}" in done.stdout
