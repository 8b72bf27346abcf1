"""The band around a traced projection's RSS (auditor.analysis.projection.rss_band): computed from the audited
run's own readings, ordered low <= point <= high, holding a real held-out run at a larger size,
and printed beside the figure in the report's projection section."""
from __future__ import annotations

import sys
import textwrap
import uuid

import pytest
from conftest import TINY_LLAMA_SCRIPT

import auditor
from auditor.analysis.findings.noise_band import rss_band
from auditor.analysis.projection.rss_band import Retention, band_targets, beyond_tensors, where
from auditor.analysis.projection.scaled import json_stage_keys, stage_keys
from auditor.capture.tracing.model_from import TargetModel
from auditor.facts import units
from auditor.jobs.program_validation import validate_program
from auditor.jobs.script_projection import Program

# A pruner keeping a statistic per linear and every layer's activations for a second pass, so the
# heap holds more at the target than audited.
ALGORITHM = TINY_LLAMA_SCRIPT + """

def calibrate(model, samples):
    kept = []
    hooks = [m.register_forward_hook(lambda m, i, o: kept.append(i[0].detach().clone()))
             for m in model.modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for sample in samples:
            model(sample)
    for hook in hooks:
        hook.remove()
    return kept


def prune(model, kept):
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            norms = sum(x.reshape(-1, x.shape[-1]).pow(2).sum(0) for x in kept
                        if x.shape[-1] == module.in_features)
            score = module.weight.abs() * norms.sqrt()
            module.weight.data[score <= score.median()] = 0
"""
SCRIPT = """
import torch
from {module} import get_llm, calibrate, prune

model = get_llm()
samples = [torch.randint(0, 256, (2, 64)) for _ in range(2)]
prune(model, calibrate(model, samples))
"""
TARGET = TargetModel("llama-2-7b", {"layers": 2, "hidden": 128, "intermediate": 352, "heads": 4, "vocab": 512})


@pytest.fixture(scope="module")
def validation(tmp_path_factory):
    folder = tmp_path_factory.mktemp("band")
    module = f"banded_{uuid.uuid4().hex[:8]}"
    (folder / f"{module}.py").write_text(textwrap.dedent(ALGORITHM))
    (folder / "prune.py").write_text(textwrap.dedent(SCRIPT.format(module=module)))
    try:
        result = validate_program(Program(script=str(folder / "prune.py"), cwd=str(folder), path=[str(folder)]),
                                  f"{module}:get_llm", TARGET, [f"{module}:calibrate", f"{module}:prune"],
                                  folder / "validation", threads=2)
    finally:
        sys.modules.pop(module, None)
    return {"result": result, "small": auditor.load(folder / "validation" / "small"),
            "target": auditor.load(folder / "validation" / "target"), "folder": folder / "validation"}


def test_the_band_is_computed_from_the_audited_record(validation):
    small, traced = validation["small"], validation["result"]["projections"]["traced"]
    retention = Retention(small)
    finished = [s for s in small.stages if s.status != "open"]
    assert retention.floor == min(beyond_tensors(s) for s in finished)
    assert retention.noise == round(rss_band(small, 0, "").margin) > 0
    audited = stage_keys(small)
    for key, stage in json_stage_keys(traced).items():
        band, measured = stage["rss_band"], stage["beyond_measured"]
        assert measured == beyond_tensors(audited[key])  # every stage of the program ran audited
        assert band["low"] == max(stage["tensor_peak"] + measured - retention.noise, 0)
        assert band["retained"] == max(measured - retention.floor, 0)
        grown = max(band["retained"] * (band["grown_by"] - 1), stage["allocator_growth_range"][1])
        assert band["grown"] == pytest.approx(grown, rel=1e-3, abs=1)
        assert band["high"] == stage["tensor_peak"] + measured + band["grown"] + retention.noise
    peak = traced["peak"]["rss_band"]
    assert peak["low"] == max(s["rss_band"]["low"] for s in traced["stages"])
    assert peak["high"] == max(s["rss_band"]["high"] for s in traced["stages"])
    assert "retention" in peak["basis"] and ". " not in peak["basis"]  # one plain sentence


def test_every_band_is_ordered_around_its_figure(validation):
    traced = validation["result"]["projections"]["traced"]
    for stage in traced["stages"]:
        assert stage["rss_band"]["low"] <= stage["rss_peak"] <= stage["rss_band"]["high"], stage["path"]
    band = traced["peak"]["rss_band"]
    assert band["low"] <= traced["peak"]["rss"] <= band["high"]
    assert band["low"] < band["high"]


def test_a_real_held_out_run_at_a_larger_size_falls_inside_the_band(validation):
    result, real = validation["result"], validation["target"]
    assert result["scale_up"] > 8
    band = result["projections"]["traced"]["peak"]["rss_band"]
    assert band["low"] <= real.peak.rss <= band["high"], (band, real.peak.rss)
    checked = {t["what"]: t for t in result["targets"] if "band" in t["what"]}
    assert checked["peak RSS inside its band"]["met"] and checked["peak RSS inside its band"]["error"] == 0.0
    every = checked["RSS inside its band, every stage"]
    assert every["met"] and every["stages"] == len(real.stages), every


def test_a_reading_outside_the_band_is_missed_with_its_distance(validation):
    result = dict(validation["result"])
    band = result["projections"]["traced"]["peak"]["rss_band"]
    assert where(band["high"] * 2, band) == pytest.approx(-0.5, abs=1e-6)
    assert where(band["low"] // 2, band) > 0.99
    result["peak"] = {**result["peak"], "real": {**result["peak"]["real"], "rss": band["high"] * 2}}
    peak = next(t for t in band_targets(result) if t["what"] == "peak RSS inside its band")
    assert peak["met"] is False and peak["error"] == pytest.approx(-0.5, abs=1e-6)


def test_the_report_prints_each_traced_rss_with_its_band_and_basis_once(validation, tmp_path):
    import json

    from auditor.cli import main
    folder = validation["folder"]
    small = folder / "small"
    (small / "projections.json").write_text(json.dumps([validation["result"]["projections"]["traced"]]))
    try:
        assert main(["report", str(small), "-o", str(tmp_path / "report.md")]) == 0
    finally:
        (small / "projections.json").unlink()
    text = (tmp_path / "report.md").read_text()
    section = text[text.index("### Projection to llama-2-7b"):]
    assert section.count("RSS band: low is the tensors") == 1
    band = validation["result"]["projections"]["traced"]["peak"]["rss_band"]
    assert f"(band {units.size(band['low'])} to " in section
    assert section.count("(band ") >= 2  # each stage's row
