"""Stages inside torch.profiler (with and without an audit), the audit's profiler trace in the
run folder, and TensorBoard's PyTorch Profiler plugin serving it with the stages in it."""
from __future__ import annotations

import gzip
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import uuid

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import auditor
from auditor.capture.staging.targets import Staging
from auditor.cli import main

stage_module = importlib.import_module("auditor.capture.stage")
PLUGIN = "/data/plugin/pytorch_profiler"
TENSORBOARD_WAIT_S = 90


def compute(x):
    """Staged from outside in these tests."""
    return (x @ x).relu().sum()


@auditor.stage("decorated")
def decorated(x):
    return x * 2


def workload():
    """Nested stages, a decorated function, a staged callable called twice, a stage that raises."""
    x = torch.randn(32, 32)
    with auditor.stage("outer"):
        with auditor.stage("inner"):
            compute(x)
        compute(x)
        decorated(x)
    with pytest.raises(ValueError), auditor.stage("raises"):
        torch.ones(8).sum()
        raise ValueError("inside a stage")
    with auditor.stage("after"):
        torch.ones(8).sum()


def ranges(trace: dict) -> list[dict]:
    """The record_function ranges of a chrome trace, in start order."""
    events = [e for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
    return sorted(events, key=lambda e: e["ts"])


def contains(outer: dict, inner: dict) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def assert_nested_as(record_stages: list[dict], trace_ranges: list[dict]) -> None:
    """One range per stage, in the same order, each inside its parent stage's range only."""
    assert [r["name"] for r in trace_ranges] == [s["name"] for s in record_stages]
    opened: dict[str, dict] = {}
    for entry, span in zip(record_stages, trace_ranges, strict=False):
        if entry["parent"] is not None:
            assert contains(opened[entry["parent"]], span), entry["path"]
        for path, other in opened.items():
            if not entry["path"].startswith(path + "/"):
                assert other["ts"] + other["dur"] <= span["ts"], (path, entry["path"])
        opened[entry["path"]] = span


def open_ranges() -> int:
    return stage_module._open_ranges


# -- without an audit --------------------------------------------------------------------

def test_stages_are_ranges_in_a_plain_profiler_session(tmp_path, one_thread):
    staging = Staging([compute])  # a staged callable with no audit active: a range only
    staging.apply()
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            workload()
    finally:
        staging.restore()
    counts = {event.key: event.count for event in prof.key_averages()}
    for name, count in {"outer": 1, "inner": 1, "compute": 2, "decorated": 1, "raises": 1,
                        "after": 1}.items():
        assert counts.get(name) == count, name
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    found = ranges(json.loads((tmp_path / "trace.json").read_text()))
    expected = [("outer", None), ("inner", "outer"), ("compute", "outer/inner"),
                ("compute", "outer"), ("decorated", "outer"), ("raises", None), ("after", None)]
    stages = [{"name": name, "parent": parent, "path": f"{parent}/{name}" if parent else name}
              for name, parent in expected]
    assert_nested_as(stages, found)
    assert open_ranges() == 0


def test_stages_cost_nothing_more_without_a_profiler():
    with auditor.stage("quiet"):
        assert open_ranges() == 0
    assert decorated(torch.ones(2)).tolist() == [2.0, 2.0]


def test_a_stage_entered_before_the_profiler_started_closes_quietly(tmp_path):
    prof = profile(activities=[ProfilerActivity.CPU])
    with auditor.stage("before"):
        prof.start()
        with auditor.stage("during"):
            torch.ones(4).sum()
    prof.stop()
    names = [event.key for event in prof.key_averages()]
    assert "during" in names and "before" not in names
    assert open_ranges() == 0


# -- with an audit -----------------------------------------------------------------------

def run_audit(folder):
    with auditor.Audit(folder, name="profiled", torch_profiler=True,
                       stage_targets=[compute]) as audit:
        workload()
    return audit.record


def trace_of(folder, record: dict) -> dict:
    """The profiler trace a run record (as JSON: `Audit.record`, `.to_json()`) names."""
    return json.loads((folder / record["files"]["torch_profiler"]).read_text())


def test_the_audit_writes_a_profiler_trace_with_every_stage(tmp_path, one_thread):
    folder = tmp_path / "run"
    record = run_audit(folder)
    assert record["probes"]["torch_profiler"]["state"] == "on"
    assert record["options"]["torch_profiler"] is True
    trace_file = record["files"]["torch_profiler"]
    assert trace_file.startswith("profiler/") and trace_file.endswith(".pt.trace.json")
    assert [p.name for p in (folder / "profiler").iterdir()] == [trace_file.split("/")[1]]
    assert [s["path"] for s in record["stages"]] == [
        "outer", "outer/inner", "outer/inner/compute", "outer/compute#2", "outer/decorated",
        "raises", "after"]
    trace = trace_of(folder, record)
    assert_nested_as(record["stages"], ranges(trace))
    assert any(e.get("name") == "[memory]" for e in trace["traceEvents"])  # profile_memory
    assert open_ranges() == 0


def test_an_audit_under_a_running_profiler_goes_on_without_its_own(tmp_path):
    with (profile(activities=[ProfilerActivity.CPU]) as prof,
          pytest.warns(auditor.AuditorWarning, match="torch profiler absent"),
          auditor.Audit(tmp_path / "run", torch_profiler=True) as audit, auditor.stage("work")):
        torch.ones(4).sum()
    assert audit.record["probes"]["torch_profiler"]["state"] == "absent"
    assert "torch_profiler" not in audit.record["files"]
    assert not (tmp_path / "run" / "profiler").exists()
    assert "work" in [event.key for event in prof.key_averages()]  # the user's profiler saw it


def test_auditor_run_torch_profiler(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text(textwrap.dedent("""
        import torch, auditor
        with auditor.stage("work"):
            torch.randn(16, 16).sum()
    """))
    assert main(["run", "--torch-profiler", "--out", "out", "job.py"]) == 0
    record = auditor.load(tmp_path / "out")
    assert record.probes["torch_profiler"].state == "on"
    assert [r["name"] for r in ranges(trace_of(tmp_path / "out", record.to_json()))] == ["work"]
    assert "tensorboard --logdir out/profiler" in capsys.readouterr().err


# -- TensorBoard -------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(base: str, route: str, **query) -> bytes:
    url = f"{base}{PLUGIN}/{route}?" + "&".join(f"{k}={v}" for k, v in query.items())
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
        return gzip.decompress(body) if response.headers.get("Content-Encoding") == "gzip" else body


def get_json(base: str, route: str, **query):
    return json.loads(get(base, route, **query))


def wait_for_run(base: str, server: subprocess.Popen, log) -> list[str]:
    """The plugin's run names once it has loaded them; fails after TENSORBOARD_WAIT_S."""
    deadline = time.monotonic() + TENSORBOARD_WAIT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            break
        try:
            runs = get_json(base, "runs")
            if runs["runs"] and not runs["loading"]:
                return runs["runs"]
        except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
            pass
        time.sleep(0.5)
    log.seek(0)
    pytest.fail(f"TensorBoard listed no profiler run in {TENSORBOARD_WAIT_S} s:\n"
                f"{log.read().decode(errors='replace')[-3000:]}")


@pytest.fixture
def tensorboard(tmp_path):
    """Starts TensorBoard on a run folder's profiler/ and always stops it (its whole group)."""
    for module, package in (("tensorboard", "tensorboard"),
                            ("torch_tb_profiler", "torch-tb-profiler")):
        pytest.importorskip(module, reason=f"{package} is not importable (the test extra has it)",
                            exc_type=ImportError)
    servers = []

    def start(logdir) -> tuple[str, subprocess.Popen, object]:
        port = free_port()
        log = open(tmp_path / f"tensorboard-{port}.log", "w+b")  # noqa: SIM115 (closed at teardown, below)
        server = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--port",
             str(port), "--host", "127.0.0.1", "--load_fast=false"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        servers.append((server, log))
        return f"http://127.0.0.1:{port}", server, log

    yield start
    for server, log in servers:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def test_tensorboard_shows_the_stages(tmp_path, tensorboard, one_thread):
    folder = tmp_path / f"run-{uuid.uuid4().hex[:6]}"
    record = run_audit(folder)
    base, server, log = tensorboard(folder / "profiler")
    assert wait_for_run(base, server, log) == ["profiler"]  # a logdir that is a run: its name
    views = get_json(base, "views", run="profiler")
    assert {"Overview", "Operator", "Trace", "Memory"} <= set(views)
    [worker] = get_json(base, "workers", run="profiler", view="Trace")
    [span] = get_json(base, "spans", run="profiler", worker=worker)
    where = dict(run="profiler", worker=worker, span=span)
    # The Trace view shows the trace as written: every stage a range, nested as in the record.
    assert_nested_as(record["stages"], ranges(json.loads(get(base, "trace", **where))))
    # The plugin itself parses only the operators (its tables leave user ranges out).
    operators = {row["name"] for row in get_json(base, "operation/table", group_by="Operation",
                                                 **where)["data"]}
    assert {"aten::mm", "aten::relu", "aten::sum"} <= operators
    memory = get_json(base, "memory_events", **where)
    assert any(row[0] == "aten::mm" for row in memory["rows"]["CPU"])
