"""The run record on disk: written as the run goes, rebuilt after a kill, load errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import auditor
from auditor.record import run_folder as run_record
from auditor.record.run_folder import RunRecordError


def test_events_are_on_disk_before_the_run_ends(tmp_path):
    folder = tmp_path / "run"
    with auditor.Audit(folder):
        with auditor.stage("first"):
            pass
        lines = (folder / "events.jsonl").read_text().splitlines()
        assert [json.loads(line)["event"] for line in lines] == [  # unstaged: the time before it
            "run_started", "unstaged", "stage_started", "stage_finished"]
        assert not (folder / "run.json").exists()
    assert (folder / "run.json").exists()
    assert run_record.rebuild(folder, write=False) == auditor.load(folder).to_json()


def test_a_killed_run_is_recovered_from_its_event_log(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent("""
        import os
        import auditor

        with auditor.stage("load"):
            data = bytearray(50_000_000)
        with auditor.stage("work"):
            more = bytearray(10_000_000)
        with auditor.stage("doomed"):
            os.kill(os.getpid(), 9)
    """))
    folder = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "auditor", "run", "--out", str(folder), str(script)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == -9, result.stderr
    assert not (folder / "run.json").exists()
    with pytest.raises(RunRecordError, match="no run.json"):
        auditor.load(folder)
    record = auditor.rebuild(folder)
    assert [(s["path"], s["status"]) for s in record["stages"]] == [
        ("load", "ok"), ("work", "ok"), ("doomed", "open")]
    load = record["stages"][0]
    assert load["rss"]["end"] - load["rss"]["start"] > 45_000_000
    assert record["stages"][2]["end_s"] is None and record["stages"][2]["rss"]["peak"] is None
    assert record["exit"]["status"] == "unfinished"
    assert record["peak"]["stage"] in ("load", "work")
    assert auditor.load(folder).to_json() == record  # rebuild wrote run.json


def test_a_half_written_last_event_is_dropped(tmp_path):
    folder = tmp_path / "run"
    with auditor.Audit(folder), auditor.stage("a"):
        pass
    events = (folder / "events.jsonl").read_text().splitlines()
    # Cut inside the run_finished event, as a kill mid-write would.
    (folder / "events.jsonl").write_text("\n".join(events[:-1]) + "\n" + events[-1][:25])
    record = auditor.rebuild(folder, write=False)
    assert record["exit"]["status"] == "unfinished"
    assert [s["status"] for s in record["stages"]] == ["ok"]


@pytest.mark.parametrize("content, message", [
    (None, "no run record"),
    ("", "is empty"),
    ('{"schema": "auditor.run/1", "name": "x"', "truncated"),
    ("not json at all", "not valid JSON"),
    ('{"schema": "something/9"}', "unknown schema 'something/9'"),
    ('[1, 2]', "expected a JSON object"),
    ('{"schema": "auditor.run/1", "name": "x"}', "missing field(s)"),
])
def test_load_errors_are_one_line(tmp_path, content, message):
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(RunRecordError) as caught:
        auditor.load(path)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_rebuild_errors(tmp_path):
    with pytest.raises(RunRecordError, match="no event log"):
        auditor.rebuild(tmp_path)
    (tmp_path / "events.jsonl").write_text('{"event": "stage_started"}\n')
    with pytest.raises(RunRecordError, match="run_started"):
        auditor.rebuild(tmp_path)
    (tmp_path / "events.jsonl").write_text('garbage\n{"event": "run_started"}\n')
    with pytest.raises(RunRecordError, match="line 1 is not JSON"):
        auditor.rebuild(tmp_path)


def test_run_json_is_replaced_atomically(tmp_path):
    folder = tmp_path / "run"
    with auditor.Audit(folder):
        pass
    assert sorted(os.listdir(folder)) == ["events.jsonl", "run.json"]  # no .tmp left behind
