"""memray's section names the stage open at its high-water moment (found by time from its
memory snapshots, not borrowed from the RSS peak) and never shows the auditor's frames."""
from __future__ import annotations

import time

import pytest
import torch

import auditor
from auditor.capture.probes import memray_trace
from auditor.facts import allocation_sites

MiB = 1 << 20


def _hold_a_buffer(nbytes: int, seconds: float) -> None:
    buffer = torch.ones(nbytes // 4)  # SITE: memray's high-water allocation
    time.sleep(seconds)  # long beside the ~10 ms between memray's snapshots
    del buffer


def test_memrays_stage_is_the_one_open_at_its_high_water_time(tmp_path):
    pytest.importorskip("memray")
    untouched = torch.empty(160 * MiB // 4)  # allocated before the trace, its pages not yet touched
    with auditor.Audit(tmp_path / "run", memray=True, census=True) as audit:
        for step in range(3):  # censuses (~1 s under memray) before the peak: out of the audit's clock
            with auditor.stage(f"warm#{step}"):
                torch.ones(1000)
        with auditor.stage("allocate"):
            _hold_a_buffer(64 * MiB, 0.3)
        with auditor.stage("touch"):
            untouched.fill_(1.0)  # RSS grows by 160 MiB; memray, which saw no allocation, does not
    record = audit.record
    memray = record["memray"]
    stages = {s["path"]: s for s in record["stages"]}
    allocate = stages["allocate"]
    assert stages["touch"]["rss"]["peak"] > allocate["rss"]["peak"]  # the RSS peak is elsewhere ...
    assert record["peak"]["stage"] != "allocate"
    assert memray["stage"] == "allocate"  # ... memray's high-water is here, found by time
    assert memray["stage_basis"] == memray_trace.TIME_BASIS
    # memray stamps whole milliseconds (truncated), and the record rounds to them
    assert allocate["start_s"] - 0.0015 <= memray["at_s"] <= allocate["end_s"]
    top = memray["sites"][0]
    assert top["location"].startswith(f"{__file__}:") and top["function"] == "_hold_a_buffer"
    assert 64 * MiB <= top["bytes"] < 65 * MiB
    assert not any(s["location"].startswith(memray_trace.AUDITOR) for s in memray["sites"])
    assert isinstance(memray["auditor_bytes"], int) and memray["auditor_bytes"] >= 0
    del untouched


def test_the_auditors_own_frames_are_never_a_site():
    auditor_file = memray_trace.AUDITOR + "census.py"
    user_file = __file__
    torch_ops = torch.__file__.replace("__init__.py", "_ops.py")
    meter = memray_trace.AUDITOR + "probes/live_tensors.py"
    # made by the auditor, called from the user's code: the auditor's (summed apart)
    assert memray_trace.site_frame([("sweep", auditor_file, 10), ("main", user_file, 5)])[1] == auditor_file
    # a user's operator run through the live-tensor meter's dispatch: the user's
    stack = [("__call__", torch_ops, 1), ("__torch_dispatch__", meter, 104), ("step", user_file, 7)]
    assert memray_trace.site_frame(stack) == ("step", user_file, 7)
    # the meter's own bookkeeping in its dispatch frame, with no operator below: the auditor's
    assert memray_trace.site_frame([("__torch_dispatch__", meter, 106), ("step", user_file, 7)])[1] == meter
    # a staged library function: the wrapper the auditor put around it hands the call on
    wrapper = memray_trace.AUDITOR + "targets.py"
    library = torch.__file__.replace("__init__.py", "functional.py")
    stack = [("stft", library, 3), ("staged_call", wrapper, 200), ("main", user_file, 9)]
    assert memray_trace.site_frame(stack) == ("main", user_file, 9)


def test_plumbing_frames_recorded_in_another_checkout_pass_through_too():
    # a report re-made in a fresh clone reads frames recorded under the first checkout's path
    elsewhere = "/elsewhere/checkout/auditor/"
    assert allocation_sites.passes_through("__torch_dispatch__", elsewhere + "probes/live_tensors.py")
    assert allocation_sites.passes_through("staged_call", elsewhere + "targets.py")
    assert not allocation_sites.passes_through("take_census", elsewhere + "census.py")
    assert not allocation_sites.passes_through("__torch_dispatch__", "/elsewhere/my_auditor/probes/live_tensors.py")


def test_plumbing_frames_pass_through_where_the_modules_live_now():
    """The auditor's modules moved into capture/ (issue 29): frames recorded at the new places
    pass through as those at the old places (committed records) still do."""
    here = memray_trace.AUDITOR
    assert allocation_sites.passes_through("__torch_dispatch__", here + "capture/probes/live_tensors.py")
    assert allocation_sites.passes_through("__torch_dispatch__", here + "capture/tracing/data_dependent.py")
    assert allocation_sites.passes_through("dispatch", here + "capture/tracing/dispatch_mode.py")
    assert allocation_sites.passes_through("staged_call", here + "capture/staging/targets.py")
    assert allocation_sites.passes_through("staged", here + "capture/stage.py")
    assert not allocation_sites.passes_through("take", here + "capture/census/take.py")
    from auditor.capture import stage
    from auditor.capture.probes import live_tensors
    from auditor.capture.staging import targets
    from auditor.capture.tracing import data_dependent, dispatch_mode
    for module in (live_tensors, data_dependent, dispatch_mode, targets, stage):  # the places are real
        assert allocation_sites._in_package(module.__file__, {**allocation_sites._DISPATCH_MODES,
                                                              **allocation_sites._WRAPPERS})


def test_the_stage_at_a_time_is_the_innermost_open():
    stages = [{"id": 1, "path": "prune", "parent": None, "start_s": 0.0, "end_s": 10.0},
              {"id": 2, "path": "prune/layer#1", "parent": 1, "start_s": 1.0, "end_s": 4.0},
              {"id": 3, "path": "prune/layer#2", "parent": 1, "start_s": 5.0, "end_s": 9.0}]
    assert memray_trace.stage_at(stages, 2.0)["path"] == "prune/layer#1"
    assert memray_trace.stage_at(stages, 4.5)["path"] == "prune"
    assert memray_trace.stage_at(stages, 11.0) is None


def test_a_snapshot_stamped_just_before_a_stage_began_is_placed_in_it():
    """memray truncates snapshot times to whole milliseconds: a moment 0.4 ms into a stage
    that began 0.1 ms after the stamp's millisecond belongs to that stage, not to the gap
    before it or to the sibling that ended just before."""
    stages = [{"id": 1, "path": "quiet", "parent": None, "start_s": 0.0300, "end_s": 0.0302,
               "rss": {"peak": 10}},
              {"id": 2, "path": "spike", "parent": None, "start_s": 0.0306, "end_s": 0.0560,
               "rss": {"peak": 10**8}}]
    assert memray_trace.stage_at(stages, 0.030)["path"] == "spike"
    assert memray_trace.stage_at(stages, 0.040)["path"] == "spike"
    assert memray_trace.stage_at(stages, 0.0575) is None  # well after both: unstaged


def test_a_snapshot_whose_heap_was_recorded_late_is_placed_up_to_the_next_stamp():
    """memray's sampler stamps the time, then waits for the trace's lock before it records the
    heap: on a busy machine the heap is from later, up to the next snapshot's stamp. A stamp in
    the quiet stage before the spike, with the next stamp 12 ms later inside the spike, is the
    spike's (the quiet stage overlaps the window more, but memory stood higher in the spike)."""
    stages = [{"id": 1, "path": "quiet", "parent": None, "start_s": 0.0300, "end_s": 0.0400,
               "rss": {"peak": 10}},
              {"id": 2, "path": "spike", "parent": None, "start_s": 0.0402, "end_s": 0.0430,
               "rss": {"peak": 10**8}}]
    assert memray_trace.stage_at(stages, 0.031)["path"] == "quiet"  # without the next stamp
    assert memray_trace.stage_at(stages, 0.031, 0.043)["path"] == "spike"
    assert memray_trace.stage_at(stages, 0.031, 0.039)["path"] == "quiet"  # ended before the spike
