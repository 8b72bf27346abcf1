"""Stages and the RSS probe, with known answers: real allocations of known size."""
from __future__ import annotations

import json
import mmap
import threading
import time

import numpy as np
import pytest
import torch

import auditor

MB = 10**6
N = 200 * MB  # within the brief's 50..500 MB: large against noise, small for a shared machine


def keep_tensor(n_bytes: int) -> torch.Tensor:
    """A float32 tensor on fresh pages, every one touched, unmapped when the tensor is freed. A
    torch.ones could take a free heap block an earlier test in this process left, partly
    resident already: in two CI runs a 100 MB one raised RSS by 81.7 MB, the same both times."""
    x = torch.frombuffer(mmap.mmap(-1, n_bytes), dtype=torch.float32)  # the tensor keeps the map
    x.fill_(1.0)
    return x


def transient_tensor(n_bytes: int) -> float:
    """A tensor on fresh pages, unmapped on return (a torch.ones could reuse a free heap block
    an earlier test in this process left, and never raise RSS)."""
    with mmap.mmap(-1, n_bytes) as pages:
        x = torch.frombuffer(pages, dtype=torch.float32)
        x.fill_(1.0)  # touches every page
        value = float(x[-1])
        del x
    return value


def stage_by_path(record: dict, path: str) -> dict:
    matches = [s for s in record["stages"] if s["path"] == path]
    assert len(matches) == 1, [s["path"] for s in record["stages"]]
    return matches[0]


def test_kept_torch_tensor_shows_in_end_minus_start(tmp_path):
    with auditor.Audit(tmp_path / "run") as audit, auditor.stage("keep"):
        kept = keep_tensor(N)
    rss = stage_by_path(audit.record, "keep")["rss"]
    assert abs((rss["end"] - rss["start"]) - N) < 0.05 * N
    assert rss["peak"] >= rss["end"]
    del kept


def test_kept_numpy_array_shows_in_end_minus_start(tmp_path):
    with auditor.Audit(tmp_path / "run") as audit, auditor.stage("keep"):
        kept = np.ones(N // 8)  # float64
    rss = stage_by_path(audit.record, "keep")["rss"]
    assert abs((rss["end"] - rss["start"]) - N) < 0.05 * N
    del kept


def test_transient_peak_is_caught_where_boundary_readings_miss_it(tmp_path):
    with auditor.Audit(tmp_path / "run") as audit, auditor.stage("spike"):
        transient_tensor(N)
    rss = stage_by_path(audit.record, "spike")["rss"]
    assert rss["peak"] >= rss["start"] + 0.95 * N
    assert abs(rss["end"] - rss["start"]) < 0.05 * N
    # What readings taken only at the stage's boundaries would have called its peak:
    boundary_only = max(rss["start"], rss["end"])
    assert boundary_only - rss["start"] < 0.05 * N
    assert rss["peak"] - boundary_only >= 0.9 * N
    assert audit.record["peak"]["stage"] == "spike"
    assert audit.record["peak"]["rss"] == rss["peak"]


def test_nested_stages_keep_the_parent_peak(tmp_path):
    with auditor.Audit(tmp_path / "run") as audit, auditor.stage("outer"):
        with auditor.stage("spike"):
            transient_tensor(N)
        with auditor.stage("calm"):  # resets the high-water mark: must not erase outer's
            time.sleep(0.01)
    record = audit.record
    outer, spike, calm = (stage_by_path(record, p) for p in ("outer", "outer/spike", "outer/calm"))
    assert [s["path"] for s in record["stages"]] == ["outer", "outer/spike", "outer/calm"]
    assert (outer["parent"], spike["parent"], calm["parent"]) == (None, "outer", "outer")
    assert spike["rss"]["peak"] >= spike["rss"]["start"] + 0.95 * N
    assert outer["rss"]["peak"] >= spike["rss"]["peak"]
    assert calm["rss"]["peak"] < calm["rss"]["start"] + 0.05 * N
    assert record["peak"]["stage"] == "outer/spike"  # the deepest stage holding the peak
    assert outer["start_s"] <= spike["start_s"] <= spike["end_s"] <= calm["start_s"] <= outer["end_s"]


def test_decorator_stages_every_call(tmp_path):
    @auditor.stage("step")
    def step(x):
        return x + 1

    assert step(1) == 2  # no audit: just the function
    with auditor.Audit(tmp_path / "run") as audit:
        assert step(1) == 2
        with auditor.stage("loop"):
            step(2)
    assert [s["path"] for s in audit.record["stages"]] == ["step", "loop", "loop/step"]


def test_threads_have_their_own_stage_stacks(tmp_path):
    barrier = threading.Barrier(2)

    def work(name):
        with auditor.stage(name):
            barrier.wait()  # both outer stages are open at once
            with auditor.stage("inner"):
                barrier.wait()

    with auditor.Audit(tmp_path / "run") as audit:
        threads = [threading.Thread(target=work, args=(f"t{i}",), name=f"worker-{i}") for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    paths = sorted(s["path"] for s in audit.record["stages"])
    assert paths == ["t0", "t0/inner", "t1", "t1/inner"]
    assert all(s["status"] == "ok" for s in audit.record["stages"])
    assert {s["thread"] for s in audit.record["stages"]} == {"worker-0", "worker-1"}


def test_marks_are_point_readings_under_the_current_stage(tmp_path):
    with auditor.Audit(tmp_path / "run") as audit:
        auditor.mark("start")
        with auditor.stage("load"):
            kept = keep_tensor(N // 2)
            auditor.mark("loaded")
    marks = audit.record["marks"]
    assert [(m["name"], m["stage"]) for m in marks] == [("start", None), ("loaded", "load")]
    assert marks[1]["rss"] - marks[0]["rss"] > 0.9 * N // 2
    assert all(s["path"] != "loaded" for s in audit.record["stages"])  # marks are not stages
    del kept


def test_record_fields_and_run_json_on_disk(tmp_path):
    with auditor.Audit(tmp_path / "run", name="fields") as audit, auditor.stage("a"):
        pass
    record = audit.record
    for key in ("schema", "name", "command", "started_at", "device", "environment", "process",
                "stages", "peak", "probes", "marks", "exit"):
        assert key in record
    assert record["schema"] == "auditor.run/1" and record["name"] == "fields"
    assert set(record["environment"]) >= {"python", "torch", "transformers", "threads"}
    assert record["environment"]["threads"] == torch.get_num_threads()
    assert record["process"]["rss_at_start"] > 0
    entry = record["stages"][0]
    assert set(entry) >= {"name", "path", "parent", "status", "start_s", "end_s", "rss",
                          "py_heap", "cuda", "components"}
    assert entry["py_heap"] is None and entry["cuda"] is None and entry["components"] is None
    assert record["probes"]["rss"] == {"state": "on", "method": "clear_refs"}
    assert record["exit"] == {"status": "ok", "code": 0, "error": None}
    assert json.loads((tmp_path / "run" / "run.json").read_text()) == record
    assert auditor.load(tmp_path / "run").to_json() == record


def test_an_exception_fails_open_stages_and_still_writes_the_record(tmp_path):
    with (pytest.raises(KeyError), auditor.Audit(tmp_path / "run") as audit, auditor.stage("outer"),
          auditor.stage("inner")):
        raise KeyError("boom")
    record = auditor.load(tmp_path / "run")
    assert [(s.path, s.status) for s in record.stages] == [("outer", "failed"), ("outer/inner", "failed")]
    assert record.stages[1].error == "KeyError: 'boom'"
    assert record.exit.status == "failed" and record.exit.error == "KeyError: 'boom'"
    assert audit.record == record.to_json()
    assert auditor.active_audit() is None


def test_keyboard_interrupt_is_recorded_as_interrupted(tmp_path):
    with pytest.raises(KeyboardInterrupt), auditor.Audit(tmp_path / "run"), auditor.stage("long"):
        raise KeyboardInterrupt
    record = auditor.load(tmp_path / "run")
    assert record.stages[0].status == "failed"
    assert record.exit.status == "interrupted"


def test_a_nested_audit_joins_the_active_one_and_each_is_entered_once(tmp_path):
    first = auditor.Audit(tmp_path / "a")
    with first, auditor.Audit(tmp_path / "b", name="inner"), auditor.stage("x"):
        pass  # never an error: joined (tests/test_faults_nested.py)
    assert [s.path for s in auditor.load(tmp_path / "a").stages] == ["inner", "inner/x"]
    assert [s.path for s in auditor.load(tmp_path / "b").stages] == ["x"]
    with pytest.raises(RuntimeError, match="runs once"), first:
        pass


def test_output_folder_errors_create_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="not a folder"):
        auditor.Audit(blocker / "run")
    finished = tmp_path / "done"
    with auditor.Audit(finished):
        pass
    with pytest.raises(ValueError, match="already holds a run record"):
        auditor.Audit(finished)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done", "file"]


def test_no_op_cost_without_an_audit():
    assert auditor.active_audit() is None
    rounds = 20_000
    began = time.perf_counter()
    for _ in range(rounds):
        with auditor.stage("x"):
            pass
    per_stage = (time.perf_counter() - began) / rounds
    assert per_stage < 20e-6, f"{per_stage * 1e6:.2f} us per no-op stage"
    auditor.mark("nothing")  # no audit: nothing happens, nothing fails
    auditor.track("nothing", object())


def test_sampler_fallback_where_clear_refs_is_unavailable(tmp_path, monkeypatch):
    from auditor.capture.probes import rss as rss_probe
    monkeypatch.setattr(rss_probe, "_CLEAR_REFS", str(tmp_path / "no-clear-refs"))  # as off Linux
    with (pytest.warns(auditor.AuditorWarning, match="sampling every 2 ms"),
          auditor.Audit(tmp_path / "run") as audit, auditor.stage("spike")):
        x = keep_tensor(N)
        time.sleep(0.2)  # a sampler needs the spike to last many intervals (busy machine)
        del x
    rss = stage_by_path(audit.record, "spike")["rss"]
    assert audit.record["probes"]["rss"]["method"] == "sampler"
    assert rss["peak"] >= rss["start"] + 0.95 * N
    assert abs(rss["end"] - rss["start"]) < 0.05 * N
    assert not any(t.name == "auditor-rss-sampler" for t in threading.enumerate())
