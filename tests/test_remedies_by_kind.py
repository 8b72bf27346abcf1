"""Remedies fit the program's kind: a training loop with AdamW, a pruner and an inference loop,
each a small real program (tests/program_kinds/) audited from outside as a user would
(`auditor run --census --live-tensors --stage ...`, then `auditor report`). The kind is decided
from the record's evidence (auditor.analysis.findings.program_kind), never from names; the remedies come
from auditor.analysis.findings.remedies by (rule, kind, category).

Known answers: the MLP has 256*512 + 512 + 512*256 + 256 = 262,912 parameters, 1,051,648 B in
fp32; AdamW keeps two values a parameter, 2,103,296 B.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import audit_script

from auditor.analysis.findings.program_kind import program_kind
from auditor.analysis.findings.remedies import GENERIC, TEXTS, remedy
from auditor.analysis.findings.rules import findings
from auditor.record.schema import RunRecord

HERE = Path(__file__).resolve().parent / "program_kinds"
WEIGHTS = (256 * 512 + 512 + 512 * 256 + 256) * 4
PRUNER_WORDS = ("pruner", "calibration", "candidates", "restored")
OPTIMIZER_WORDS = ("optimizer", "AdamW8bit", "ZeRO", "zero_grad")


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """Each program audited once: {name: (typed record, report markdown)}."""
    runs = {"training": ["--stage", "train_loop:train_step", "train_loop.py"],
            "inference": ["--stage", "infer_loop:evaluate", "infer_loop.py"],
            "pruning": ["--stage", "prune_loop:prune", "--stage", "prune_loop:score",
                        "--stage", "prune_loop:apply_masks", "prune_loop.py"]}
    done = {}
    for name, args in runs.items():
        folder = tmp_path_factory.mktemp(name) / "run"
        record, report = audit_script(folder, ["--census", "--live-tensors", *args], HERE)
        done[name] = (RunRecord.from_json(record, str(folder / "run.json")), report)
    return done


def _remedies(record: RunRecord) -> list[str]:
    return [f.remedy for f in findings(record) if f.remedy]


@pytest.mark.parametrize("kind", ["training", "inference", "pruning"])
def test_each_program_is_taken_for_its_kind_from_the_record(audited, kind):
    record, report = audited[kind]
    found = program_kind(record)
    assert found.kind == kind, found.evidence
    assert found.evidence in report.replace("`", "") or found.evidence.replace("`", "") in report.replace("`", "")


def test_adamw_training_gets_optimizer_state_remedies_and_no_pruner_words(audited):
    record, report = audited["training"]
    evidence = program_kind(record).evidence
    # AdamW's state is twice the weights: named by the census, or made by zeros_like and kept
    assert "optimizer state" in evidence or "2x the weights" in evidence
    texts = _remedies(record)
    assert texts and any("Shard or shrink" in t and "AdamW8bit" in t for t in texts)
    for text in texts:
        assert not any(word in text for word in PRUNER_WORDS), text
    fixes = report.split("## Fixes", 1)[1].split("\n## ", 1)[0]
    assert "Remedies are for a training step" in fixes and "Shard or shrink" in fixes


def test_a_pruner_gets_pruner_remedies_and_no_optimizer_words(audited):
    record, report = audited["pruning"]
    texts = _remedies(record)
    assert any(word in text for text in texts for word in PRUNER_WORDS), texts
    for text in texts:
        assert not any(word in text for word in OPTIMIZER_WORDS), text
    assert "Remedies are for a pruner" in report


def test_an_inference_loop_gets_activation_remedies(audited):
    record, report = audited["inference"]
    spikes = [f for f in findings(record) if f.rule == "transient-spike"]
    assert spikes, [f.rule for f in findings(record)]
    assert all("smaller batches" in f.remedy and "inference_mode" in f.remedy for f in spikes)
    for text in _remedies(record):
        assert not any(word in text for word in PRUNER_WORDS + OPTIMIZER_WORDS), text
    assert "Remedies are for an inference loop" in report


def test_the_training_records_optimizer_state_is_twice_the_weights(audited):
    record, _ = audited["training"]
    weights = max(sum(c.bytes for n, c in (s.components or {}).items() if c.category == "weights"
                      and not n.endswith("buffers")) for s in record.stages)
    assert weights == WEIGHTS
    state = [c.bytes for s in record.stages for c in (s.components or {}).values() if c.category == "optimizer state"]
    if state:  # the census names it (optimizers found as roots)
        assert max(state) >= 2 * WEIGHTS
    else:     # else its evidence is the zeros_like state
        assert "exactly 2x the weights" in program_kind(record).evidence


# -- without the evidence: unknown, generic remedies -----------------------------------------

def _bare_record(stages: list[dict]) -> RunRecord:
    return RunRecord.from_json({"schema": "auditor.run/1", "name": "bare", "command": "x", "started_at": "t",
                                "device": "cpu", "environment": {}, "process": {}, "stages": stages,
                                "peak": {"rss": 1}, "exit": {"status": "ok"}}, "a record made here")


def test_without_census_or_meter_the_kind_is_unknown_and_remedies_are_generic():
    stage = {"id": 1, "name": "step", "path": "step", "parent": None, "status": "ok", "start_s": 0.0,
             "end_s": 1.0, "rss": {"start": 1, "end": 1, "peak": 1}}
    found = program_kind(_bare_record([stage]))
    assert found.kind == "unknown" and "no tensor census" in found.evidence
    for rule, text in GENERIC.items():
        assert remedy(rule, "unknown", None) == text
        assert not any(word in text for word in PRUNER_WORDS + ("AdamW8bit",)), rule


def test_the_most_specific_remedy_wins():
    assert remedy("full-copy", "training", "optimizer state") == TEXTS[("full-copy", "training", "optimizer state")]
    assert remedy("full-copy", "training", "weights") == TEXTS[("full-copy", "training", None)]
    assert (remedy("dense-gradients", "pruning", "gradient records")
            == TEXTS[("dense-gradients", None, "gradient records")])
    assert remedy("reference-cycle", "training", None) == GENERIC["reference-cycle"]
    assert remedy("no-such-rule", "training", None) is None
    assert all(text.endswith(".") for text in TEXTS.values())


def test_the_committed_main_report_takes_gradprobe_for_a_pruner():
    root = Path(__file__).resolve().parents[1]
    recorded = root / "reports/gradprobe-tinystories-33m-runs/audit/run.json"
    record = RunRecord.from_json(json.loads(recorded.read_text()), "run.json")
    found = program_kind(record)
    assert found.kind == "pruning" and "saved copies" in found.evidence
