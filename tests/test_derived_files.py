"""Derived results (projections.json, calibration.json) are typed record files: checked against
their types when written and when loaded, every problem named by its path, and a key no code
writes cannot be read (mypy refuses it)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import auditor
from auditor.record import derived
from auditor.record.run_folder import write_derived

ROOT = Path(__file__).parents[1]
MAIN_RUN = ROOT / "reports" / "gradprobe-tinystories-33m-runs" / "audit"


def test_every_committed_run_record_loads_its_derived_files_as_their_types():
    folders = sorted({p.parent for p in (ROOT / "reports").rglob("projections.json")})
    assert folders
    for folder in folders:
        record = auditor.load(folder)
        assert derived.projections(record.annotations["projections"], str(folder))


def test_a_projection_of_the_wrong_shape_fails_at_load_naming_each_fault(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(MAIN_RUN / "run.json", run / "run.json")
    projections = json.loads((MAIN_RUN / "projections.json").read_text())
    projections[0]["stages"][0]["rss_peak"] = "12 MiB"
    del projections[1]["peak"]["stage"]
    projections[1]["stages"] = {"not": "a list"}
    (run / "projections.json").write_text(json.dumps(projections))
    with pytest.raises(auditor.RunRecordError) as error:
        auditor.load(run)
    message = str(error.value)
    assert "projections.json" in message and "\n" not in message
    assert "[0].stages[0].rss_peak should be a whole number, found '12 MiB'" in message
    assert "[1].stages should be a list" in message


def test_a_result_of_the_wrong_shape_is_never_written(tmp_path):
    with pytest.raises(auditor.RunRecordError, match=r"\[0\]\.live_tensor_peak should be a whole number"):
        write_derived(tmp_path, "projections", [{"method": "scaled", "target": "x", "live_tensor_peak": 1.5}])
    assert not (tmp_path / "projections.json").exists()
    write_derived(tmp_path, "projections", [{"method": "scaled", "target": "x", "live_tensor_peak": 3}])
    assert json.loads((tmp_path / "projections.json").read_text())[0]["live_tensor_peak"] == 3


def test_a_key_no_code_writes_cannot_be_read(tmp_path):
    """The bug this replaced: a reader waited on a key ("estimates") that no code wrote, and the
    report printed a wrong sentence. With the projection typed, mypy refuses such a read (a
    subscript; `.get` of an unknown key is allowed by mypy, so readers subscript what is
    always written)."""
    reader = tmp_path / "reader.py"
    reader.write_text("from auditor.record.derived import Projection\n\n\n"
                      "def lower_bound(projection: Projection) -> bool:\n"
                      "    return bool(projection['data_dependent_ops']) and not projection['estimates']\n")
    found = subprocess.run([sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports",
                            str(reader)], capture_output=True, text=True, cwd=ROOT)
    assert found.returncode == 1, found.stdout
    assert 'TypedDict "Projection" has no key "estimates"' in found.stdout
