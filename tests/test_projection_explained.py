"""The scaled projection prints a number only where its drivers explain the calibration runs.

A custom algorithm keeps a Hessian per linear of one decoder layer, in_features x in_features
(as examples/pruning/hessian.py): on a Llama-family model that is 6 x hidden^2 + intermediate^2
floats, a size no driver has. Its records are built by hand at the shapes the calibration job
perturbs (`auditor.jobs.calibration.perturbations`): the fit cannot explain the Hessians, so
the report says so where the number would be, and the headline defers to the traced figure.
"""
from __future__ import annotations

import architectures
from auditor.analysis.projection.drivers import shape_of
from auditor.analysis.projection.scaled import project
from auditor.analysis.projection.side_by_side import by_target, side_by_side
from auditor.jobs.calibration import perturbations
from auditor.jobs.gradprobe import Settings
from auditor.record.schema import RunRecord
from auditor.renderers.markdown import render
from auditor.renderers.projection_markdown import sections as projection_sections
from auditor.report_models.run import run_report

SMALL = dict(layers=2, hidden=64, vocab=256, heads=4, kv_heads=2, intermediate=128)
TOKENS = 32
PROCESS = 300 << 20  # RSS beyond the tensors: interpreter and libraries


def hessian_bytes(overrides: dict) -> int:
    config = architectures.make_config("mistral-7b", **overrides)
    return 4 * (6 * config.hidden_size ** 2 + config.intermediate_size ** 2)


def stage(path: str, components: dict, start: float, parent: str | None = None) -> dict:
    tensors = sum(c["bytes"] for c in components.values())
    return {"path": path, "name": path.rsplit("/", 1)[-1], "parent": parent, "status": "ok",
            "start_s": start, "end_s": start + 1.0, "components": components,
            "live_tensors": {"end": tensors, "peak": tensors},
            "rss": {"start": PROCESS, "end": PROCESS + tensors, "peak": PROCESS + tensors}}


def run_record(overrides: dict, state) -> dict:
    """A run of the custom algorithm at one shape: the model built, then its state beside it."""
    weights = 4 * shape_of("mistral-7b", TOKENS, overrides).parameters
    model = {"model.parameters": {"category": "weights", "bytes": weights}}
    peak = {"rss": PROCESS + weights + state(overrides), "stage": "prune"}
    return {"schema": "auditor.run/1", "name": "hessians", "command": "x", "started_at": "t", "device": "cpu",
            "environment": {}, "process": {}, "peak": peak, "workload": {
                "architecture": "mistral-7b", "overrides": overrides, "tokens": TOKENS,
                "settings": {"batch_size": 1, "sequence_length": TOKENS}},
            "stages": [stage("build model", model, 0.0),
                       stage("prune", {**model, "pruner.hessians": {"category": "other",
                                                                    "bytes": state(overrides)}}, 1.0)]}


def calibrated(state) -> RunRecord:
    """The small run, read as the auditor reads it, with its calibration runs (JSON) beside it."""
    runs = [dict(run_record(s.overrides, state), label=label)
            for label, s in perturbations(Settings(architecture="mistral-7b", overrides=SMALL,
                                                   sequence_length=TOKENS))]
    return RunRecord.from_json(dict(run_record(SMALL, state), calibration=runs))


def traced(record: RunRecord) -> dict:
    """A traced projection's shape (its figures stand in for the scaled ones)."""
    peak = 140 << 30
    return {"method": "traced", "target": "mistral-7b", "target_dtype": None,
            "stages": [{"path": "prune", "components": {}, "tensor_peak": peak, "rss_peak": peak + PROCESS,
                        "beyond_tensors": PROCESS}],
            "peak": {"stage": "prune", "rss": peak + PROCESS, "live_tensors": peak}, "live_tensor_peak": peak}


def summary(text: str) -> str:
    return text.split("## Summary", 1)[1].split("\n## ", 1)[0]


def test_a_hessian_no_driver_explains_is_not_printed_as_a_number():
    record = calibrated(hessian_bytes)
    scaled = project(record, "mistral-7b")
    stages = {s["path"]: s for s in scaled["stages"]}
    hessians = stages["prune"]["components"]["pruner.hessians"]
    assert hessians["explained"] is False and hessians["residual"] > hessians["allowance"]
    assert stages["prune"]["components"]["model.parameters"]["explained"] is True
    assert stages["prune"]["explained"] is False and stages["build model"]["explained"] is True
    assert stages["prune"]["unexplained"][0]["what"] == "pruner.hessians"
    assert scaled["explained"] is False and scaled["unexplained_stages"] == ["prune"]
    assert scaled["miss"] == {"stage": "prune", "bytes": stages["prune"]["miss"], "what": "pruner.hessians"}

    record.annotations["projections"] = [scaled, traced(record)]
    text = render(run_report(record))
    headline = summary(text).split("projected (scaled: mistral-7b)", 1)[1].split("\n", 1)[0]
    assert "not explained by its drivers (miss" in headline and "see traced" in headline
    assert "the traced figure stands for it, 140.29 GiB peak RSS" in headline
    # every table prints the miss where the Hessians' scaled number would be, and no number
    at_peak = text.split("## What was alive at the peak", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in at_peak.splitlines() if line.startswith("| &emsp;`pruner.hessians`")]
    assert [row[3] for row in rows] == ["not explained by its drivers (miss 60.4 KiB): see traced"]
    side = projection_sections(by_target(side_by_side(record))).split("### Projection to mistral-7b", 1)[1]
    for name in ("| `pruner.hessians` |", "| prune |"):  # scaled and traced are columns of one table
        lines = side.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith(name))
        header = next(lines[i] for i in range(at, -1, -1) if lines[i].startswith("| stage |")
                      or lines[i].startswith("| component |")).split(" | ")
        cells = lines[at].split(" | ")
        scaled = [cell for title, cell in zip(header, cells, strict=False) if "scaled" in title]
        assert scaled and all(c == "not explained by its drivers (miss 60.4 KiB): see traced" for c in scaled)


def test_a_state_the_drivers_explain_is_printed():
    def per_layer_weights(overrides):  # one decoder layer's weights: the `layer` driver
        return 4 * shape_of("mistral-7b", TOKENS, overrides).layer
    record = calibrated(per_layer_weights)
    scaled = project(record, "mistral-7b")
    assert scaled["explained"] is True
    assert all(s["explained"] for s in scaled["stages"])
    record.annotations["projections"] = [scaled]
    headline = summary(render(run_report(record))).split("projected (scaled: mistral-7b)", 1)[1].split("\n", 1)[0]
    assert "GiB peak RSS" in headline and "not explained" not in headline


def test_without_calibration_runs_nothing_is_checked_and_the_caveat_stays():
    record = RunRecord.from_json(run_record(SMALL, hessian_bytes))
    scaled = project(record, "mistral-7b")
    assert "explained" not in scaled and all("explained" not in s for s in scaled["stages"])
    record.annotations["projections"] = [scaled]
    headline = summary(render(run_report(record))).split("projected (scaled: mistral-7b)", 1)[1].split("\n", 1)[0]
    assert "uncalibrated" in headline and "not explained" not in headline
