"""A held-out run whose RSS peak falls in time no stage covers (a driver counting sparsity after
its last staged layer): the validation's components are those of the stage holding the run's
highest live tensors, and the report says why, instead of a section titled `None`."""
from __future__ import annotations

import subprocess
import sys

import auditor
from auditor.analysis.projection.validation import compare

SCRIPT = """
import torch
import auditor

with auditor.stage("load"):
    weights = torch.ones(1_000)
with auditor.stage("prune_layer"):
    scores = torch.ones(2_000_000)  # the live-tensor high: 8 MB
    del scores
buffer = bytearray(300 * 2**20)  # after the last stage: the RSS peak, no stage open
buffer[::4096] = b"x" * len(buffer[::4096])
"""


def test_components_come_from_the_live_tensor_high_when_the_rss_peak_is_unstaged(tmp_path):
    (tmp_path / "driver.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, "-m", "auditor", "run", "--run-dir", "run", "--live-tensors",
                           "--census", "driver.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    record = auditor.load(tmp_path / "run")
    assert record.peak.stage is None  # the peak fell between stages
    result = compare(record, record, {})
    assert result["components_stage"] == "prune_layer"
    assert "highest live tensors" in result["components_why"] and "no stage covers" in result["components_why"]
