"""Findings that name what grew, judge retention after a call returns, and come with remedies
and what they would save; validated remedies from a committed comparison.

Records built by hand with known answers (the fields of the run-record contract), and the
GradProbe job's `validated_remedies` read from the committed reports/compare-tinystories-33m.json.
"""
from __future__ import annotations

import copy
import json
import shutil

import pytest

from auditor.analysis.findings.rules import RULES, evaluate, findings
from auditor.comparison.verdict import summarise
from auditor.facts import units
from auditor.record.schema import RunRecord
from auditor.renderers.markdown import render
from auditor.report_models.run import run_report

MiB, GiB = 2**20, 2**30
BASE = 400 * MiB
WEIGHTS = 64 * MiB
INPS = 32 * MiB
TEMPORARY = 256 * MiB
CYCLE = 128 * MiB
KEPT = 40 * MiB


def _stage(id_, path, start, end, rss, components, live=None, call=None):
    entry = {"id": id_, "name": path.rpartition("/")[2], "path": path,
             "parent": path.rpartition("/")[0] or None, "status": "ok", "start_s": start, "end_s": end,
             "rss": dict(zip(("start", "end", "peak"), rss, strict=False)), "components": components}
    if live is not None:
        entry["live_tensors"] = live
    if call is not None:
        entry["call"] = call
    return entry


def _record(stages, peak_stage, **more) -> dict:
    peak = max(s["rss"]["peak"] for s in stages)
    return {"schema": "auditor.run/1", "name": "by-hand", "command": "x", "started_at": "t", "device": "cpu",
            "environment": {}, "process": {"rss_at_start": BASE, "rss_at_end": stages[-1]["rss"]["end"]},
            "stages": stages, "peak": {"rss": peak, "stage": peak_stage}, "exit": {"status": "ok"}, **more}


WEIGHTS_ONLY = {"model.parameters": {"category": "weights", "bytes": WEIGHTS}}


def spike_record(at_peak: bool = True) -> dict:
    """`calibrate` builds the calibration buffer (kept) and a 256 MiB temporary (freed inside it)
    while the weights, loaded before, stay as they are."""
    live = None
    if at_peak:
        rows = [{"owner": None, "category": "activations and temporaries", "created_in": "calibrate",
                 "op": "aten::cat", "bytes": TEMPORARY, "tensors": 8, "alive_at_end": False},
                {"owner": "model.parameters", "category": "weights", "created_in": None, "op": None,
                 "bytes": WEIGHTS, "tensors": 4, "alive_at_end": True},
                {"owner": "calib.inps", "category": "activations and temporaries", "created_in": "calibrate",
                 "op": "aten::zeros", "bytes": INPS, "tensors": 1, "alive_at_end": True}]
        live = {"start": WEIGHTS, "end": WEIGHTS + INPS, "peak": WEIGHTS + INPS + TEMPORARY,
                "at_peak": {"bytes": WEIGHTS + INPS + TEMPORARY, "rows": rows, "rows_left_out": 0,
                            "bytes_left_out": 0}}
    stages = [
        _stage(1, "load", 0.0, 1.0, (BASE, BASE + WEIGHTS, BASE + WEIGHTS), dict(WEIGHTS_ONLY)),
        _stage(2, "calibrate", 1.0, 2.0, (BASE + WEIGHTS, BASE + WEIGHTS + INPS, BASE + WEIGHTS + INPS + TEMPORARY),
               {**WEIGHTS_ONLY, "calib.inps": {"category": "activations and temporaries", "bytes": INPS}}, live)]
    return _record(stages, "calibrate")


def cycle_record(projections: bool = False) -> dict:
    """`prune_fn` (a staged call) returns leaving a buffer alive through a closure cycle and a
    helper's buffer; its census holds no weights (a census of the weights was taken before)."""
    stages = [
        _stage(1, "load", 0.0, 1.0, (BASE, BASE + WEIGHTS, BASE + WEIGHTS), dict(WEIGHTS_ONLY)),
        _stage(2, "prune_fn", 1.0, 3.0, (BASE + WEIGHTS, BASE + WEIGHTS + CYCLE + KEPT, BASE + WEIGHTS + CYCLE + KEPT),
               {"unreachable.cycles": {"category": "retained by a reference cycle", "bytes": CYCLE},
                "helper.buffer": {"category": "other", "bytes": KEPT}},
               call={"target": "prune_fn", "index": 1, "label": None})]
    more = {}
    if projections:
        more["projections"] = [{"method": "scaled", "target": "llama-7b", "stages": [
            {"path": "prune_fn", "components": {"unreachable.cycles": {"bytes": CYCLE, "projected": 4 * GiB},
                                                "helper.buffer": {"bytes": KEPT, "projected": GiB}}},
            {"path": "load", "components": {"model.parameters": {"bytes": WEIGHTS, "projected": 13 * GiB}}}]}]
    return _record(stages, "prune_fn", **more)


def typed(record: dict) -> RunRecord:
    """The hand-made JSON as the auditor reads a record (its fields checked)."""
    return RunRecord.from_json(record, "a record made by hand")


def fired(record, rule):
    return [f for f in findings(typed(record)) if f.rule == rule]


# -- evidence names what grew ------------------------------------------------------------------

def test_transient_names_what_grew_at_its_high_not_the_weights():
    [found] = fired(spike_record(), "transient-spike")
    assert found.evidence["growers"] == {"temporaries from `aten::cat` in `calibrate`": TEMPORARY,
                                         "calib.inps": INPS}
    assert "model.parameters" not in found.statement and "weights" not in found.statement.split(";", 1)[1]
    assert (f"made inside it and alive at its live-tensor high: temporaries from `aten::cat` in "
            f"`calibrate` {units.size(TEMPORARY)} (activations and temporaries, freed before its end), "
            f"`calib.inps` {units.size(INPS)} (activations and temporaries)") in found.statement
    assert "samples in chunks" in found.remedy  # temporaries made the spike (no backward: an inference pass)
    assert found.saving["bytes"] == TEMPORARY


def test_without_a_live_composition_the_census_difference_names_the_growers():
    [found] = fired(spike_record(at_peak=False), "transient-spike")
    assert found.evidence["growers"] == {"calib.inps": INPS}  # the weights did not grow
    assert "what it added by its end (census before it to the one at its end" in found.statement
    assert "model.parameters" not in found.statement


# -- retention: what is alive after a call returns, and cycles ---------------------------------

def test_retention_after_a_call_returns_is_judged_against_the_run_s_weights():
    record = cycle_record()
    [kept] = fired(record, "retained-at-end")  # the last census holds no weights: still judged
    assert kept.evidence["components"] == {"helper.buffer": KEPT}  # the cycle is its own finding
    assert kept.evidence["left_by"] == {"helper.buffer": "prune_fn"}
    assert kept.evidence["ratio_to_weights"] == pytest.approx(KEPT / WEIGHTS)
    assert "`helper.buffer` 40.0 MiB (other, left by `prune_fn`)" in kept.statement
    [cycle] = fired(record, "reference-cycle")
    assert cycle.severity == "high" and cycle.evidence["bytes"] == CYCLE
    assert cycle.statement.startswith(f"{units.size(CYCLE)} of tensors stay alive after `prune_fn` returned "
                                      "only through a reference cycle")
    assert "freed only by the cycle collector" in cycle.statement
    assert cycle.remedy.startswith("Break the reference cycle")


def test_a_small_cycle_still_fires_and_none_is_silent():
    """A leak is a leak: the census checks storages of 1 MiB or more, and any it finds is reported."""
    record = cycle_record()
    record["stages"][1]["components"]["unreachable.cycles"]["bytes"] = int(0.009 * record["peak"]["rss"])
    assert len(fired(record, "reference-cycle")) == 1
    for stage in record["stages"]:
        (stage.get("components") or {}).pop("unreachable.cycles", None)
    assert fired(record, "reference-cycle") == []


# -- remedies and savings ------------------------------------------------------------------------

def test_every_rule_has_a_remedy_in_plain_words():
    assert all(rule.remedy and rule.remedy.endswith(".") for rule in RULES)
    for outcome in evaluate(typed(cycle_record())):
        for found in outcome.findings:
            assert found.remedy


def test_savings_here_and_at_each_projection_target():
    record = cycle_record(projections=True)
    [cycle] = fired(record, "reference-cycle")
    assert cycle.saving == {"bytes": CYCLE, "projected": [{"target": "llama-7b", "method": "scaled", "bytes": 4 * GiB}],
                            "basis": "the evidence's components at stage `prune_fn`"}
    [kept] = fired(record, "retained-at-end")
    assert kept.saving["projected"][0]["bytes"] == GiB
    text = render(run_report(typed(record)))
    assert f"({units.size(WEIGHTS)} of parameters the most a census saw)" in text  # none in the peak stage's
    assert (f"  - Remedy: {cycle.remedy} Saves up to {units.size(CYCLE)} here; "
            f"{units.size(4 * GiB)} at llama-7b (scaled)." in text)
    assert "no projection in this record" in render(run_report(typed(cycle_record())))


def test_rules_without_a_saving_say_none():
    record = copy.deepcopy(cycle_record())
    record["stages"][1]["status"] = "failed"
    [failed] = fired(record, "failed-stage")
    assert failed.saving is None and failed.remedy.startswith("Fix the failure")


def test_a_validated_remedy_is_cited_with_its_measured_saving():
    record = cycle_record()
    record["validated_remedies"] = [
        {"variant": "no-closure", "what": "the closure deleted before returning", "components": ["unreachable.cycles"],
         "rules": [], "peak_saving": 120 * MiB, "claims_saving": True, "agreement": "identical", "runs": 3,
         "architecture": "tiny-llama", "source": "reports/compare-tiny-llama.json"},
        {"variant": "unrelated", "components": ["model.grad"], "peak_saving": MiB, "claims_saving": True}]
    [cycle] = fired(record, "reference-cycle")
    assert [v["variant"] for v in cycle.validated] == ["no-closure"]
    assert fired(record, "retained-at-end")[0].validated == ()
    text = render(run_report(typed(record)))
    fixes = text.split("## Fixes", 1)[1].split("\n## ", 1)[0]
    [cited] = [line for line in fixes.splitlines() if line.startswith("| **high** reference-cycle")]
    assert cited.endswith("| `no-closure` |")  # named in the fix's row, described once below it
    assert ("- `no-closure`: the closure deleted before returning; 120.0 MiB less peak RSS, result identical."
            in fixes)
    assert ("each measured as whole-run peak RSS against the baseline, tiny-llama, 3 runs a side, by "
            "`reports/compare-tiny-llama.json`") in fixes
    assert text.count("the closure deleted before returning") == 1 and "`unrelated`" not in text


# -- the GradProbe job: validated remedies from the committed comparison -----------------------

def gradprobe_record(remedies) -> dict:
    """GradProbe's state as the census names it: a full copy and dense gradients, to the end."""
    parts = {**WEIGHTS_ONLY, "pruner.saved_state": {"category": "saved copies", "bytes": WEIGHTS},
             "model.grad": {"category": "gradients", "bytes": WEIGHTS}}
    stages = [_stage(1, "prune/save_state", 0.0, 1.0, (BASE, BASE + 3 * WEIGHTS, BASE + 3 * WEIGHTS), parts),
              _stage(2, "prune/decide", 1.0, 2.0, (BASE + 3 * WEIGHTS,) * 3, parts)]
    for stage in stages:
        stage["parent"] = "prune"
    return _record(stages, "prune/save_state", validated_remedies=remedies)


def test_gradprobe_job_annotates_the_variants_its_comparison_measured():
    from auditor.jobs.gradprobe import REPORTS, Settings, validated_remedies
    comparison = json.loads((REPORTS / "compare-tinystories-33m.json").read_text())
    measured = {v["name"]: v for v in summarise(comparison)["variants"]}
    remedies = validated_remedies(Settings())
    assert {r["variant"] for r in remedies} == set(measured) - {"low-precision"}
    for item in remedies:
        assert item["peak_saving"] == measured[item["variant"]]["peak_saving"]
        assert item["source"] == "reports/compare-tinystories-33m.json" and item["runs"] == 3
    by_name = {r["variant"]: r for r in remedies}
    assert "pruner.saved_state" in by_name["sparse-state"]["components"]
    assert "model.grad" in by_name["grad-in-backward"]["components"]
    found = {f.evidence.get("component"): f for f in findings(typed(gradprobe_record(remedies)))}
    assert [v["variant"] for v in found["pruner.saved_state"].validated] == ["lean", "sparse-state"]
    assert [v["variant"] for v in found["model.grad"].validated] == ["lean", "grad-in-backward"]


def test_no_validated_remedies_for_another_model_or_variant(tmp_path):
    from auditor.jobs.gradprobe import REPORTS, Settings, validated_remedies
    assert validated_remedies(Settings(variant="lean")) == []  # the comparison's savings are the baseline's
    assert validated_remedies(Settings(overrides={"layers": 1})) == []  # another size: not measured
    assert validated_remedies(Settings(architecture="gpt-neo-125m")) == []  # no comparison
    shutil.copy(REPORTS / "compare-tinystories-33m.json", tmp_path / "compare-tinystories-33m.json")
    assert validated_remedies(Settings(), reports=tmp_path)
    (tmp_path / "compare-tinystories-33m.json").write_text("{not json")
    assert validated_remedies(Settings(), reports=tmp_path) == []
