"""The auditor's dispatch modes leave torch._dynamo unloaded (torch would load it, with inductor,
sympy and numpy, at the first operator: memory the program never asked for), and still keep
dynamo out of their frames once the program loads it."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import auditor

PROGRAM = """
    import sys, torch
    x = torch.ones(1000) * 2
    print("dynamo loaded:", "torch._dynamo" in sys.modules, "sympy loaded:", "sympy" in sys.modules)
"""


def _run(tmp_path, *options) -> str:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(PROGRAM))
    done = subprocess.run([sys.executable, "-m", "auditor", "run", "--run-dir", str(tmp_path / "run"),
                           *options, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_live_tensor_meter_loads_no_dynamo(tmp_path):
    assert "dynamo loaded: False sympy loaded: False" in _run(tmp_path, "--live-tensors", "--census")


def test_a_compiled_function_under_the_meter_is_counted_and_right(tmp_path):
    import torch

    def double(x):
        return x * 2

    compiled = torch.compile(double, backend="eager")
    with auditor.Audit(out=tmp_path / "run", live_tensors=True) as audit, auditor.stage("compiled"):
        result = compiled(torch.ones(250_000))
    assert torch.equal(result, torch.full((250_000,), 2.0))
    assert "torch._dynamo" in sys.modules
    stage = audit.record["stages"][0]["live_tensors"]
    assert stage["end"] - stage["start"] == 1_000_000
