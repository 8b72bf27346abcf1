"""Unstaged intervals: the time between stage boundaries that no stage covers at its depth is
measured like a stage, and the run's peak is located in it when it falls there."""
from __future__ import annotations

import mmap
import threading

import torch

import auditor
from auditor.record import run_folder as run_record

MiB = 1 << 20


def _zeros(nbytes: int) -> torch.Tensor:
    return torch.zeros(nbytes // 4)


def _spike(nbytes: int) -> None:
    """A transient that always shows in RSS (fresh pages from the kernel, returned at once; a
    tensor's could reuse memory that earlier tests freed) and in the live-tensor meter."""
    with mmap.mmap(-1, nbytes) as pages:
        for offset in range(0, nbytes, mmap.PAGESIZE):
            pages[offset] = 1
        tensor = _zeros(nbytes)
        del tensor


def _gaps(record) -> list[tuple]:
    return [(u["parent"], u["after"], u["before"]) for u in record["unstaged"]]


def test_a_spike_between_two_stages_is_located_there(tmp_path):
    with auditor.Audit(out=tmp_path / "run", live_tensors=True) as audit:
        with auditor.stage("A"):
            kept = _zeros(MiB)
        _spike(64 * MiB)
        with auditor.stage("B"):
            kept += 1
    record = audit.record
    assert _gaps(record) == [(None, None, "A"), (None, "A", "B"), (None, "B", None)]
    between = record["unstaged"][1]
    live = between["live_tensors"]
    assert live["peak"] - live["start"] == 64 * MiB and live["end"] == live["start"]
    assert between["rss"]["peak"] - between["rss"]["start"] >= 60 * MiB
    assert between["rss"]["peak"] == record["peak"]["rss"]
    assert record["peak"]["where"] == {"kind": "unstaged", "parent": None, "after": "A", "before": "B"}
    assert record["peak"]["stage"] is None  # outside every stage, and now located
    for stage in record["stages"]:  # each stage's peak is its own, not the gap's
        assert stage["rss"]["peak"] < record["peak"]["rss"]
    assert record["unstaged"][0]["start_s"] <= record["unstaged"][0]["end_s"] <= between["start_s"]


def test_every_kind_of_gap_inside_a_parent_and_the_parent_folds_them_in(tmp_path):
    with auditor.Audit(out=tmp_path / "run", live_tensors=True) as audit, auditor.stage("P"):
        with auditor.stage("C1"):
            small = _zeros(8 * MiB)
            del small
        _spike(32 * MiB)  # between the children: the parent's peak
        with auditor.stage("C2"):
            pass
    record = audit.record
    assert _gaps(record) == [(None, None, "P"), ("P", None, "P/C1"), ("P", "P/C1", "P/C2"),
                             ("P", "P/C2", None), (None, "P", None)]
    stages = {s["path"]: s for s in record["stages"]}
    parent, between = stages["P"], record["unstaged"][2]
    assert between["live_tensors"]["peak"] - between["live_tensors"]["start"] == 32 * MiB
    assert parent["live_tensors"]["peak"] == between["live_tensors"]["peak"]
    assert stages["P/C1"]["live_tensors"]["peak"] - stages["P/C1"]["live_tensors"]["start"] == 8 * MiB
    inside = [s["rss"]["peak"] for s in (stages["P/C1"], stages["P/C2"])]
    inside += [u["rss"]["peak"] for u in record["unstaged"] if u["parent"] == "P"]
    assert parent["rss"]["peak"] == max(inside)  # unchanged meaning: everything inside it
    assert record["peak"]["where"] == {"kind": "unstaged", "parent": "P", "after": "P/C1",
                                       "before": "P/C2"}
    assert record["peak"]["stage"] == "P" and record["peak"]["stage_id"] == parent["id"]
    assert all(u["parent_id"] == parent["id"] for u in record["unstaged"] if u["parent"] == "P")


def test_a_peak_in_a_stage_of_its_own_is_located_in_that_stage(tmp_path):
    with auditor.Audit(out=tmp_path / "run") as audit, auditor.stage("outer"), auditor.stage("spike"):
        _spike(64 * MiB)
    record = audit.record
    assert record["peak"]["where"] == {"kind": "stage", "stage": "outer/spike"}
    assert record["peak"]["stage"] == "outer/spike"
    assert record["unstaged"][0]["live_tensors"] is None  # that meter was off


def test_stages_on_several_threads_keep_their_own_gaps(tmp_path):
    def worker():
        for step in range(3):
            with auditor.stage(f"worker {step}"):
                _zeros(MiB)

    with auditor.Audit(out=tmp_path / "run", live_tensors=True) as audit:
        thread = threading.Thread(target=worker, name="worker")
        thread.start()
        for step in range(3):
            with auditor.stage(f"main {step}"):
                _zeros(MiB)
        thread.join()
    record = audit.record
    assert not record["warnings"]
    assert {s["status"] for s in record["stages"]} == {"ok"} and len(record["stages"]) == 6
    by_thread = {}
    for item in record["unstaged"]:
        by_thread.setdefault(item["thread"], []).append((item["after"], item["before"]))
    main = threading.main_thread().name
    # The worker's time before its first stage and after its last is no gap: its span is unknown.
    assert [gap for gap in by_thread.get("worker", []) if None in gap] == []
    assert by_thread[main][-1] == ("main 2", None)
    assert record["peak"]["where"] is not None


def test_a_new_thread_never_continues_an_ended_threads_gap(tmp_path):
    """Thread ids are reused once a thread ends: the second thread's first stage is no gap
    after the first thread's last one."""
    def work(name):
        with auditor.stage(name):
            pass

    with auditor.Audit(out=tmp_path / "run") as audit:
        for name in ("first", "second"):
            thread = threading.Thread(target=work, args=(name,), name=name)
            thread.start()
            thread.join()
    assert [u["thread"] for u in audit.record["unstaged"]] == [threading.main_thread().name]


def test_a_rebuild_from_events_gives_the_same_record(tmp_path):
    folder = tmp_path / "run"
    with auditor.Audit(out=folder, live_tensors=True, census=True) as audit:
        with auditor.stage("A"):
            kept = _zeros(4 * MiB)
        _zeros(16 * MiB)
        with auditor.stage("B"):
            pass
        audit.track("kept", kept)
    assert run_record.rebuild(folder, write=False) == auditor.load(folder).to_json() == audit.record


def test_a_killed_run_keeps_the_gaps_that_ended(tmp_path):
    folder = tmp_path / "run"
    with auditor.Audit(out=folder, live_tensors=True):
        with auditor.stage("A"):
            pass
        _spike(64 * MiB)
        with auditor.stage("B"):
            pass
    events = run_record.read_events(folder)
    opened_b = next(i for i, e in enumerate(events)
                    if e["event"] == "stage_started" and e["stage"]["path"] == "B")
    record = run_record.assemble(events[:opened_b + 1])  # killed inside B
    assert record["exit"]["status"] == "unfinished"
    assert _gaps(record) == [(None, None, "A"), (None, "A", "B")]
    spike = record["unstaged"][1]["live_tensors"]
    assert spike["peak"] - spike["start"] == 64 * MiB
    # A killed run's peak is still the highest finished stage's, located like any other.
    assert record["peak"]["rss"] == record["stages"][0]["rss"]["peak"]
    assert record["peak"]["where"] is not None


def test_older_records_without_gaps_still_name_their_peak_stage():
    stage = {"id": 1, "path": "s", "parent": None, "status": "ok", "end_s": 1.0,
             "rss": {"start": 1, "end": 1, "peak": 5}}
    assert run_record.locate_peak([stage], [], 5) is None
    assert run_record.peak_stage([stage], 5) is stage
