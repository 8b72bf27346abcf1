"""Opt-in and automatic probes: tracemalloc, CUDA (absent on CPU), memray guard, census hook."""
from __future__ import annotations

import importlib.util
import sys
import tracemalloc

import pytest
import torch

import auditor
from auditor import AuditorWarning

COUNT = 1_000_000
HAS_CENSUS = importlib.util.find_spec("auditor.capture.census.take") is not None


def test_python_heap_readings_for_a_big_list(tmp_path):
    assert not tracemalloc.is_tracing()
    with auditor.Audit(tmp_path / "run", tracemalloc=True) as audit:
        with auditor.stage("keep"):
            kept = list(range(10**6, 10**6 + COUNT))  # distinct ints: one object each
        with auditor.stage("transient"):
            list(range(10**6, 10**6 + COUNT))
    assert not tracemalloc.is_tracing()  # stopped what it started
    keep = next(s for s in audit.record["stages"] if s["name"] == "keep")["py_heap"]
    transient = next(s for s in audit.record["stages"] if s["name"] == "transient")["py_heap"]
    per_item = 8 + sys.getsizeof(10**6)  # a list slot and an int object
    grown = keep["end"] - keep["start"]
    assert COUNT * per_item * 0.95 <= grown <= COUNT * (8 + 32) * 1.05
    assert keep["peak"] >= keep["end"]
    assert transient["peak"] - transient["start"] >= COUNT * per_item * 0.95
    assert abs(transient["end"] - transient["start"]) < COUNT * per_item * 0.05
    assert audit.record["probes"]["python_heap"]["state"] == "on"
    assert audit.record["peak"]["py_heap"] >= keep["end"]
    del kept


def test_tracemalloc_started_by_the_user_is_left_running(tmp_path):
    tracemalloc.start()
    try:
        with auditor.Audit(tmp_path / "run", tracemalloc=True):
            pass
        assert tracemalloc.is_tracing()
    finally:
        tracemalloc.stop()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_cuda_is_reported_absent_on_cpu(tmp_path):
    with (pytest.warns(AuditorWarning, match="CUDA memory history absent"),
          auditor.Audit(tmp_path / "run", cuda_history=True) as audit, auditor.stage("cpu only")):
        torch.ones(10)
    probes = audit.record["probes"]
    assert probes["cuda"]["state"] == "absent" and probes["cuda"]["reason"]
    assert probes["cuda_history"]["state"] == "absent" and probes["cuda_history"]["reason"]
    assert audit.record["stages"][0]["cuda"] is None
    assert audit.record["device"] == "cpu"
    assert "cuda_history" not in audit.record["files"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_stage_readings(tmp_path):
    n = 256 * 2**20
    with auditor.Audit(tmp_path / "run", cuda_history=True) as audit, auditor.stage("outer"):
        with auditor.stage("spike"):
            x = torch.ones(n // 4, device="cuda")
            del x
        with auditor.stage("keep"):
            kept = torch.ones(n // 4, device="cuda")
    stages = {s["path"]: s["cuda"] for s in audit.record["stages"]}
    assert stages["outer/spike"]["peak_allocated"] - stages["outer/spike"]["allocated_start"] >= n
    assert stages["outer"]["peak_allocated"] >= stages["outer/spike"]["peak_allocated"]
    assert stages["outer/keep"]["allocated_end"] - stages["outer/keep"]["allocated_start"] >= n
    assert audit.record["probes"]["cuda"]["state"] == "on"
    assert (tmp_path / "run" / audit.record["files"]["cuda_history"]).exists()
    del kept


def test_memray_is_absent_when_another_tracker_is_active(tmp_path):
    memray = pytest.importorskip("memray")
    tracker = memray.Tracker(tmp_path / "outside.bin")
    try:
        tracker.__enter__()
    except RuntimeError:
        pytest.skip("a memray tracker is already active (pytest --memray?)")
    try:
        with (pytest.warns(AuditorWarning, match="memray absent"),
              auditor.Audit(tmp_path / "run", memray=True) as audit, auditor.stage("a")):
            pass
    finally:
        tracker.__exit__(None, None, None)
    assert audit.record["probes"]["memray"]["state"] == "absent"
    assert "another memray tracker" in audit.record["probes"]["memray"]["reason"]
    assert audit.record["memray"] is None
    assert not (tmp_path / "run" / "memray.bin").exists()
    assert audit.record["stages"][0]["status"] == "ok"


@pytest.mark.skipif(HAS_CENSUS, reason="auditor.capture.census.take exists")
def test_census_without_the_module_warns_and_goes_on(tmp_path):
    with pytest.warns(AuditorWarning, match="census absent"), auditor.Audit(tmp_path / "run", census=True) as audit:
        auditor.track("weights", torch.ones(10))
        with auditor.stage("a"):
            pass
    assert audit.record["probes"]["census"]["state"] == "absent"
    assert audit.record["stages"][0]["components"] is None


class Holder:
    def __init__(self):
        self.weights = torch.ones(1_000_000)

    def grow(self):
        self.extra = torch.ones(500_000)


@pytest.mark.skipif(not HAS_CENSUS, reason="auditor.capture.census.take not written yet")
def test_census_components_per_stage_and_weak_roots(tmp_path):
    import gc
    import weakref
    scratch = torch.ones(250_000)
    scratch_ref = weakref.ref(scratch)
    holder = Holder()
    with auditor.Audit(tmp_path / "run", census=True, stage_targets=[Holder.grow]) as audit:
        auditor.track("scratch", scratch)
        del scratch
        gc.collect()
        assert scratch_ref() is None  # tracking does not keep it alive
        holder.grow()  # staged: registers `holder` as the root "Holder"
        with auditor.stage("after"):
            pass
    entry = audit.record["stages"][0]
    assert entry["name"] == "Holder.grow"
    held = {name: c for name, c in entry["components"].items() if name.startswith("Holder.")}
    assert sum(c["bytes"] for c in held.values()) >= 6_000_000  # weights 4 MB + extra 2 MB
    assert not any(name.startswith("scratch") for name in entry["components"])
    assert entry["tensors"]["live_bytes"] >= 6_000_000
    assert audit.record["probes"]["census"]["state"] == "on"


def _allocate_known_block() -> float:
    block = torch.ones(30_000_000)  # KNOWN LINE: the largest allocation alive at the peak
    return float(block[-1])


@pytest.mark.parametrize("record_sizes", [False, True])
def test_memray_sites_from_the_python_api_name_the_user_line(tmp_path, record_sizes):
    """Started inside Audit.__enter__, a few frames below the user's code: the user's frames
    must still be in the stacks (memray hides frames that were live at its start). With the
    recorder of data-dependent sizes on, its dispatch frame is plumbing, not the site."""
    pytest.importorskip("memray")
    import inspect
    source, first = inspect.getsourcelines(_allocate_known_block)
    line = first + next(i for i, text in enumerate(source) if "KNOWN LINE" in text)
    with auditor.Audit(tmp_path / "run", memray=True, live_tensors=True, record_sizes=record_sizes) as audit:
        with auditor.stage("quiet"):
            torch.ones(1000)
        with auditor.stage("spike"):
            _allocate_known_block()
    top = audit.record["memray"]["sites"][0]
    assert top["location"] == f"{__file__}:{line}"
    assert top["function"] == "_allocate_known_block"
    assert top["code"] == source[line - first].strip() and "KNOWN LINE" in top["code"]
    assert 120_000_000 <= top["bytes"] < 121_000_000
    assert audit.record["memray"]["stage"] == "spike"
    spike = next(s for s in audit.record["stages"] if s["path"] == "spike")
    assert spike["memray_sites"][0]["location"] == top["location"]
