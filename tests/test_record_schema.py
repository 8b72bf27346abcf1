"""The typed run record (auditor.record.schema): every committed record reads into it and writes
back exactly; a wrong record fails at load with every wrong field named."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from auditor.record.run_folder import load
from auditor.record.schema import SCHEMA, Readings, RunRecord, RunRecordError, Stage

ROOT = Path(__file__).parents[1]


def committed_records() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*run.json"], cwd=ROOT, capture_output=True, text=True).stdout
    return [ROOT / name for name in listed.split()]


def test_every_committed_record_reads_and_writes_back_exactly():
    paths = committed_records()
    assert len(paths) >= 20  # the report folders' records: several commands' runs
    for path in paths:
        text = path.read_text()
        record = RunRecord.from_json(json.loads(text), str(path))
        # the same JSON, key order included: nothing dropped, nothing added
        assert json.dumps(record.to_json(), indent=1) + "\n" == text, path


def test_fields_are_typed_parts_and_annotations_keep_what_the_job_added():
    record = load(ROOT / "reports/gradprobe-tinystories-33m-runs/audit")
    assert isinstance(record, RunRecord) and all(isinstance(s, Stage) for s in record.stages)
    assert isinstance(record.stages[0].rss, Readings) and record.stages[0].rss.peak > 0
    assert record.peak.rss == max(s.rss.peak for s in record.stages if s.finished)
    # what `auditor gradprobe` annotated, and the derived results beside run.json
    assert {"workload", "result", "projections", "calibration"} <= set(record.annotations)
    assert "projections" not in json.loads((ROOT / "reports/gradprobe-tinystories-33m-runs/audit/run.json").read_text())


def test_an_annotation_added_after_reading_is_written():
    record = RunRecord.from_json(_small_record())
    record.annotations["result"] = {"pruned": 3}
    record.stages[0].error = "ValueError: x"
    out = record.to_json()
    assert out["result"] == {"pruned": 3} and out["stages"][0]["error"] == "ValueError: x"
    assert list(out)[: len(_small_record())] == list(_small_record())  # the order read comes first


def test_every_wrong_field_is_named_in_one_line():
    bad = _small_record()
    bad["name"] = ["x"]
    bad["stages"][0]["rss"]["peak"] = "12"
    bad["stages"][0]["status"] = "done"
    bad["stages"][1]["start_s"] = None
    del bad["stages"][1]["path"]
    bad["peak"]["where"] = {"kind": "somewhere"}
    with pytest.raises(RunRecordError) as caught:
        RunRecord.from_json(bad, "run.json")
    message = str(caught.value)
    assert "\n" not in message
    for problem in ('name should be text, found list ["x"]',
                    'stages[0].rss.peak should be a whole number of bytes, found str "12"',
                    'stages[0].status should be one of ok, failed, open, found str "done"',
                    "stages[1] lacks path",
                    "peak.where.kind should be one of stage, unstaged"):
        assert problem in message
    assert message.count("rss.peak") == 1  # a wrong value is named once, not again as missing


def test_a_finished_stage_needs_its_end_readings_and_an_open_one_may_lack_them():
    record = _small_record()
    record["stages"][0]["rss"]["end"] = None
    with pytest.raises(RunRecordError, match=r"stages\[0\]\.rss\.end should be a whole number of bytes, found null"):
        RunRecord.from_json(record)
    record["stages"][0].update(status="open", end_s=None, rss={"start": 1, "end": None, "peak": None})
    assert not RunRecord.from_json(record).stages[0].finished


def test_another_schema_version_is_refused_by_name():
    record = _small_record()
    record["schema"] = "auditor.run/2"
    with pytest.raises(RunRecordError, match=f"unknown schema 'auditor.run/2' .this auditor reads '{SCHEMA}'"):
        RunRecord.from_json(record, "run.json")


def test_many_problems_are_counted_past_the_first_few():
    record = _small_record()
    record["stages"] = [dict(record["stages"][0], start_s="x") for _ in range(20)]
    with pytest.raises(RunRecordError, match=r"and 12 more$"):
        RunRecord.from_json(record)


def _small_record() -> dict:
    stage = {"id": 1, "name": "load", "path": "load", "parent": None, "status": "ok", "start_s": 0.0,
             "end_s": 1.5, "rss": {"start": 10, "end": 20, "peak": 30}}
    return {"schema": SCHEMA, "name": "tiny", "command": "python x.py", "started_at": "2026-11-24T10:00:00",
            "device": "cpu", "environment": {"python": "3.11"}, "process": {"rss_at_start": 5},
            "stages": [stage, dict(stage, id=2, name="prune", path="prune", start_s=1.5, end_s=2.0,
                                   rss={"start": 20, "end": 20, "peak": 25})],
            "peak": {"rss": 30, "stage": "load"}}


def test_records_are_equal_when_their_json_is_annotations_included():
    first, second = RunRecord.from_json(_small_record()), RunRecord.from_json(_small_record())
    assert first == second
    second.annotations["result"] = {"pruned": 1}
    assert first != second
    second = RunRecord.from_json(_small_record())
    second.stages[1].rss.peak += 1
    assert first != second and first.stages[0] == second.stages[0]
