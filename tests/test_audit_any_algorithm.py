"""Known answers on code written like third-party per-layer pruners (examples/pruning/), audited
from outside as a new user would: `auditor run --stage ...` on its top-level functions and its
one per-layer method, then `auditor report`.

Sizes are computed by hand from the example's settings: each Hessian is cols x cols fp32, each
calibration buffer samples x length x hidden fp32, the leaked features one such buffer.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import audit_script

pytestmark = pytest.mark.slow  # module fixtures run real audits (15-26 s)

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
HIDDEN, INTERMEDIATE, SAMPLES, LENGTH, LAYERS, VOCAB = 256, 688, 8, 128, 2, 32000
LINEARS = 7  # q, k, v, o, gate, up, down per layer
BUFFER = SAMPLES * LENGTH * HIDDEN * 4          # 1 MiB: what enters a layer, for every sample
LOGITS = SAMPLES * LENGTH * VOCAB * 4           # 125 MiB: the unstaged evaluation's logits
H_SMALL, H_DOWN = HIDDEN * HIDDEN * 4, INTERMEDIATE * INTERMEDIATE * 4
STAGES = ["pruning.layer_inputs:capture_layer_inputs", "pruning.hessian:prune_with_hessians",
          "pruning.hessian:HessianStat.add_batch", "pruning.leaky:collect_features"]


def _line(path: Path, text: str) -> int:
    """The line number of `text` in `path` (the tests name lines by content, not by number)."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """One audited run of the Hessian pruner, with the leak and the unstaged evaluation after
    it (the run's peak), and its rendered report."""
    folder = tmp_path_factory.mktemp("any") / "run"
    return audit_script(folder, [
        "--census", "--live-tensors", *[a for s in STAGES for a in ("--stage", s)],
        str(EXAMPLES / "prune_tiny_llama.py"), "--method", "hessian", "--leak", "--eval", "--vocab", str(VOCAB),
        "--layers", str(LAYERS), "--hidden", str(HIDDEN), "--intermediate", str(INTERMEDIATE),
        "--samples", str(SAMPLES), "--length", str(LENGTH)], REPO)


def test_every_staged_method_is_a_stage_and_repeated_calls_fold_into_one_row(audited):
    record, report = audited
    names = [s["name"] for s in record["stages"]]
    assert names.count("prune_with_hessians") == 1 and names.count("collect_features") == 1
    # capture_layer_inputs is imported by name into both callers: both calls are stages
    assert [s["path"] for s in record["stages"] if s["call"]["target"] == "capture_layer_inputs"] == \
        ["collect_features/capture_layer_inputs", "prune_with_hessians/capture_layer_inputs#2"]
    calls = [s for s in record["stages"] if s["call"]["target"] == "HessianStat.add_batch"]
    assert len(calls) == SAMPLES * LINEARS * LAYERS
    assert "HessianStat.add_batch × 112" in report
    assert "HessianStat.add_batch#57 " not in report  # folded, still in the record


def test_each_call_is_named_by_the_linear_it_worked_on(audited):
    record, _ = audited
    labels = [s["call"]["label"] for s in record["stages"] if s["call"]["target"] == "HessianStat.add_batch"]
    assert labels[:LINEARS] == [f"model.layers.0.{n}" for n in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
    assert labels[-1] == "model.layers.1.mlp.down_proj"


def test_each_hessian_is_shown_with_its_exact_size(audited):
    record, report = audited
    seen = {}
    for stage in record["stages"]:
        for name, component in (stage.get("components") or {}).items():
            if name.endswith("].H"):
                seen[name] = max(seen.get(name, 0), component["bytes"])
    assert len(seen) == LINEARS * LAYERS
    assert seen["HessianStat[model.layers.1.mlp.down_proj].H"] == H_DOWN
    assert seen["HessianStat[model.layers.0.self_attn.q_proj].H"] == H_SMALL
    row = next(line for line in report.splitlines() if line.startswith("| `HessianStat.H`"))
    assert f"({H_DOWN:,} B) × 2" in row and f"({H_SMALL:,} B) × 12" in row
    assert f"`HessianStat[model.layers.1.mlp.down_proj].H` | {H_DOWN:,}" in report
    # the wrapper's `self.layer` does not make it the owner of the model's weights
    assert not any(".layer.parameters" in n for s in record["stages"] for n in (s.get("components") or {}))


def test_calibration_buffers_are_named_by_the_line_that_allocated_them(audited):
    record, report = audited
    inputs = _line(EXAMPLES / "pruning" / "layer_inputs.py", "inputs = torch.zeros(")
    outputs = _line(EXAMPLES / "pruning" / "hessian.py", "outputs = torch.zeros_like(")
    inputs_name = f"allocated at examples/pruning/layer_inputs.py:{inputs} capture_layer_inputs"
    outputs_name = f"allocated at examples/pruning/hessian.py:{outputs} prune_with_hessians"
    first_call = next(s for s in record["stages"] if s["call"]["target"] == "HessianStat.add_batch")
    components = first_call["components"]
    assert components[outputs_name]["bytes"] == BUFFER
    assert components[inputs_name]["bytes"] % BUFFER == 0  # the layer inputs (and the leak, below)
    assert f"`{inputs_name}`" in report and f"`{outputs_name}`" in report


def test_the_leak_through_a_reference_cycle_is_found_after_the_call_returns(audited):
    record, report = audited
    collect = next(s for s in record["stages"] if s["path"] == "collect_features")
    assert collect["components"]["unreachable.cycles"]["bytes"] == BUFFER
    assert "(reference-cycle)" in report and "freed only by the cycle collector" in report


def test_a_peak_in_code_no_stage_covers_is_located_and_its_contents_named(audited):
    record, report = audited
    assert record["peak"]["where"] == {"kind": "unstaged", "parent": None,
                                       "after": "prune_with_hessians", "before": None}
    summary = next(line for line in report.splitlines() if line.startswith("| peak RSS |"))
    assert "after the last stage (`prune_with_hessians`)" in summary
    assert "outside every stage" not in report
    logits = _line(EXAMPLES / "pruning" / "evaluation.py", "logits = model(")
    section = report.split("### What was alive at the run's peak, after the last stage")[1]
    row = next(line for line in section.splitlines()
               if f"`allocated at examples/pruning/evaluation.py:{logits} perplexity`" in line)
    assert "| 125.0 MiB |" in row and LOGITS == 125 * 2**20


@pytest.fixture(scope="module")
def activation_norm_run(tmp_path_factory):
    """The Wanda-style pruner: a statistic per linear (its inputs' squared norms) and the two
    calibration buffers, staged at its top-level function and its per-linear method."""
    folder = tmp_path_factory.mktemp("norms") / "run"
    record, _ = audit_script(folder, [
        "--census", "--live-tensors", "--stage", "pruning.activation_norm:prune_by_activation_norm",
        "--stage", "pruning.activation_norm:InputNorms.add_batch", str(EXAMPLES / "prune_tiny_llama.py"),
        "--method", "activation-norm", "--layers", str(LAYERS), "--hidden", str(HIDDEN),
        "--intermediate", str(INTERMEDIATE), "--samples", str(SAMPLES), "--length", str(LENGTH)], REPO)
    return record


def test_an_activation_norm_pruner_shows_each_statistic_and_both_buffers(activation_norm_run):
    record = activation_norm_run
    calls = [s for s in record["stages"] if s["call"]["target"] == "InputNorms.add_batch"]
    assert len(calls) == SAMPLES * LINEARS * LAYERS
    sizes = {}
    for stage in record["stages"]:
        for name, component in (stage.get("components") or {}).items():
            if name.startswith("InputNorms[") and name.endswith("].sq_norms"):
                sizes[name] = component["bytes"]
    assert len(sizes) == LINEARS * LAYERS
    assert sizes["InputNorms[model.layers.0.mlp.down_proj].sq_norms"] == INTERMEDIATE * 4
    assert sizes["InputNorms[model.layers.1.self_attn.q_proj].sq_norms"] == HIDDEN * 4
    inputs = _line(EXAMPLES / "pruning" / "layer_inputs.py", "inputs = torch.zeros(")
    outputs = _line(EXAMPLES / "pruning" / "activation_norm.py", "outputs = torch.zeros_like(")
    last = calls[-1]["components"]
    assert last[f"allocated at examples/pruning/layer_inputs.py:{inputs} capture_layer_inputs"]["bytes"] == BUFFER
    outputs_name = f"allocated at examples/pruning/activation_norm.py:{outputs} prune_by_activation_norm"
    assert last[outputs_name]["bytes"] == BUFFER
