"""Known answers on pruning code written in the style of third-party repositories (not this
project's examples): tests/third_party_style/tp_pruners/sparsegpt.py, audited from outside as
a new user would, staged at its top-level function and its one per-layer method.

Sizes by hand, from the driver's settings (hidden 128, intermediate 344, 4 samples of 64
tokens, 2 layers): each Hessian is cols x cols fp32 (128 * 128 * 4 = 65,536 B for q, k, v, o,
gate, up; 344 * 344 * 4 = 473,344 B for down), each calibration buffer 4 * 64 * 128 * 4 =
131,072 B.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import audit_script

from auditor.analysis.run import source_paths
from auditor.record.schema import RunRecord

HERE = Path(__file__).resolve().parent / "third_party_style"
PRUNER = HERE / "tp_pruners" / "sparsegpt.py"
HIDDEN, INTERMEDIATE, SAMPLES, LENGTH, LAYERS = 128, 344, 4, 64, 2
H_SMALL, H_DOWN = HIDDEN * HIDDEN * 4, INTERMEDIATE * INTERMEDIATE * 4
BUFFER = SAMPLES * LENGTH * HIDDEN * 4
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.fixture(scope="module")
def staged_at_fasterprune(tmp_path_factory):
    """prune_sparsegpt and SparseGPT.fasterprune staged (fasterprune deletes its own Hessian:
    no call of the helper ever sees its Hessian at a stage end, only its siblings')."""
    folder = tmp_path_factory.mktemp("tp") / "run"
    return audit_script(folder, ["--census", "--live-tensors", "--stage", "tp_pruners.sparsegpt:prune_sparsegpt",
                                 "--stage", "tp_pruners.sparsegpt:SparseGPT.fasterprune", "prune_tiny.py"], HERE)


def test_hessians_of_helpers_not_called_yet_are_named_by_their_linear(staged_at_fasterprune):
    record, report = staged_at_fasterprune
    first = next(s for s in record["stages"] if s["call"] and s["call"]["target"] == "SparseGPT.fasterprune")
    assert first["call"]["label"] == "model.layers.0.self_attn.q_proj"
    hessians = {name: c["bytes"] for name, c in first["components"].items() if name.endswith("].H")}
    # q_proj's own Hessian is deleted by the call; the six others are alive, each under its linear
    assert hessians == {f"SparseGPT[model.layers.0.{n}].H": H_DOWN if n == "mlp.down_proj" else H_SMALL
                        for n in LINEARS[1:]}
    init = _line(PRUNER, "self.H = torch.zeros(")
    lumped = f"allocated at tp_pruners/sparsegpt.py:{init} __init__"
    assert not any(lumped in (s.get("components") or {}) for s in record["stages"])
    row = next(line for line in report.splitlines() if line.startswith("| `SparseGPT.H`"))
    assert f"({H_DOWN:,} B) × 2" in row and f"({H_SMALL:,} B) × 10" in row
    assert f"`SparseGPT[model.layers.1.mlp.down_proj].H` | {H_DOWN:,}" in report


def test_calibration_buffers_and_the_catcher_cycle(staged_at_fasterprune):
    record, _ = staged_at_fasterprune
    first = next(s for s in record["stages"] if s["call"] and s["call"]["target"] == "SparseGPT.fasterprune")
    inps = _line(PRUNER, "inps = torch.zeros(")
    outs = _line(PRUNER, "outs = torch.zeros_like(inps)")
    allocated = first["components"]
    assert allocated[f"allocated at tp_pruners/sparsegpt.py:{inps} prepare_calibration_input"]["bytes"] == BUFFER
    assert allocated[f"allocated at tp_pruners/sparsegpt.py:{outs} prepare_calibration_input"]["bytes"] == BUFFER
    assert record["process"]["cwd"] == str(HERE)


def test_report_paths_are_shown_from_the_working_folder_without_the_auditors_frames():
    """The auditor's own frames in memray's stacks (the staged-call wrapper, the console
    script) are not the audited code: with them, the common folder was '/' and the report
    showed `trial/thirdparty/sparsegpt.py` and an absolute `--out` path."""
    import auditor
    own = Path(auditor.__file__).resolve().parent
    site = {"location": "/tmp/trial/thirdparty/sparsegpt.py:39",
            "python_stack": ["fasterprune at /tmp/trial/thirdparty/sparsegpt.py:39",
                             f"staged_call at {own}/targets.py:215",
                             "main at main.py:28", "<module> at /venv/bin/auditor:8"]}
    record = {"schema": "auditor.run/1", "name": "sg1", "started_at": "t", "device": "cpu", "environment": {},
              "stages": [], "peak": {"rss": None}, "memray": {"sites": [{**site, "bytes": 1, "allocations": 1}]},
              "process": {"cwd": "/tmp/trial"}, "command": "auditor run --out /tmp/trial/runs/sg1 --memray main.py"}
    root = source_paths.code_root(RunRecord.from_json(record))
    assert root == "/tmp/trial"
    assert source_paths.shown_path(site["location"], root) == "thirdparty/sparsegpt.py:39"
    assert source_paths.shown_command(record["command"], root) == "auditor run --out runs/sg1 --memray main.py"
    record["process"] = {}  # an older record: the common folder of the audited code's files
    assert source_paths.code_root(RunRecord.from_json(record)) == "/tmp/trial/thirdparty"
    record["memray"]["sites"] = []
    assert source_paths.code_root(RunRecord.from_json({**record, "process": {"cwd": "/tmp/trial"}})) == "/tmp/trial"
