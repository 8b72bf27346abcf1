"""Tensors kept alive only by an unreachable reference cycle: found by the census, exact
bytes, and nothing collected, freed or finalized by looking."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

import auditor
from auditor.capture.census import reference_cycles
from auditor.capture.census.take import storage_key, take_census

MiB = 1 << 20
BUFFER = 16 * MiB


class Finalized:
    """Counts its __del__ calls: one in a cycle shows whether the check finalized anything."""
    deleted = 0

    def __del__(self):
        Finalized.deleted += 1


@pytest.fixture
def collector_off():
    """No collection between making a cycle and the census (the collector's timing is not
    the test's); earlier tests' garbage collected first, so the bytes found are exact."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.collect()


def calibration_step() -> weakref.ref:
    """A function that returns leaving its buffer in a closure cycle."""
    features = torch.zeros(BUFFER // 4)

    def norm():
        return features.norm()

    norm.again = norm  # the function refers to itself: a cycle through its closure
    norm.marker = Finalized()
    return weakref.ref(features)


def dict_cycle_step() -> None:
    state = {"buffer": torch.ones(BUFFER // 4)}
    state["self"] = state


GLOBAL_BUFFER = None


def cycles(census: dict) -> dict:
    return census["components"].get("unreachable.cycles", {"bytes": 0, "tensors": 0})


def test_a_buffer_left_in_a_closure_cycle_is_found_and_nothing_is_freed(collector_off):
    garbage_before = list(gc.garbage)
    deleted_before = Finalized.deleted
    alive = calibration_step()
    census = take_census({}, find_cycles=True)
    found = census["components"]["unreachable.cycles"]
    assert found == {"category": "retained by a reference cycle", "bytes": BUFFER, "tensors": 1}
    assert census["cycle_check"]["cycles"] == 1  # (tensors other tests left may hit the bounds)
    # nothing was collected, freed or finalized by the check
    assert alive() is not None
    assert gc.garbage == garbage_before
    assert Finalized.deleted == deleted_before
    assert not gc.isenabled()  # the collector's state is the program's, restored
    # the census without the check leaves it with the temporaries
    plain = take_census({})
    assert "unreachable.cycles" not in plain["components"] and "cycle_check" not in plain
    gc.collect()  # the collector does free it: the cycle was the only holder
    assert alive() is None and Finalized.deleted == deleted_before + 1


def test_a_dict_cycle_is_found(collector_off):
    dict_cycle_step()
    assert cycles(take_census({}, find_cycles=True))["bytes"] == BUFFER


def test_held_by_a_module_global_or_a_local_is_not_a_cycle(collector_off):
    global GLOBAL_BUFFER
    GLOBAL_BUFFER = torch.zeros(BUFFER // 4)
    local = torch.zeros(BUFFER // 4)
    in_a_cycle_but_also_local = {"buffer": torch.zeros(BUFFER // 4)}
    in_a_cycle_but_also_local["self"] = in_a_cycle_but_also_local
    try:
        census = take_census({}, find_cycles=True)
        assert "unreachable.cycles" not in census["components"]
        assert census["cycle_check"]["held"] >= 3
        assert census["components"]["unowned"]["bytes"] >= 3 * BUFFER
    finally:
        GLOBAL_BUFFER = None
    del local, in_a_cycle_but_also_local


def test_a_tensor_held_from_cpp_is_not_a_cycle(collector_off):
    """Its Python object sits in a cycle, but the autograd graph of a live output saved it:
    collecting the cycle would not free the storage."""
    def forward() -> torch.Tensor:
        x = torch.randn(BUFFER // 4, requires_grad=True)
        keeper = {"x": x}
        keeper["self"] = keeper
        return x.sin()  # sin saves its input for backward

    out = forward()
    census = take_census({}, find_cycles=True)
    assert "unreachable.cycles" not in census["components"]
    assert census["cycle_check"]["held"] >= 2  # x (held by the graph) and out (a local)
    del out


def test_a_chain_beyond_the_bounds_is_unknown_never_a_cycle(collector_off, monkeypatch):
    buffer = torch.zeros(BUFFER // 4)
    key = storage_key(buffer.untyped_storage(), False)
    holder = [buffer]
    del buffer
    for _ in range(6):
        holder = [holder]

    def keys_of(t: torch.Tensor) -> list:
        return [storage_key(t.untyped_storage(), False)]

    def every_tensor() -> list:
        return [o for o in gc.get_objects() if type(o) is torch.Tensor]

    monkeypatch.setattr(reference_cycles, "MAX_LEVELS", 3)
    check = reference_cycles.check([key], keys_of, every_tensor())
    assert check["verdicts"] == {key: reference_cycles.UNKNOWN} and check["bounded"] is True
    monkeypatch.setattr(reference_cycles, "MAX_LEVELS", 12)
    check = reference_cycles.check([key], keys_of, every_tensor())
    assert check["verdicts"] == {key: reference_cycles.HELD} and check["bounded"] is False
    del holder


def test_the_check_keeps_no_reference(collector_off):
    calibration_step()
    take_census({}, find_cycles=True)
    gc.collect()
    assert "unreachable.cycles" not in take_census({}, find_cycles=True)["components"]


def test_the_audit_checks_at_top_level_stage_ends(collector_off, tmp_path):
    """The leak made in a nested stage is found when its top-level stage ends."""
    with auditor.Audit(tmp_path / "run", census=True) as audit, auditor.stage("calibrate"), auditor.stage("step"):
        alive = calibration_step()
    stages = {s["path"]: s for s in audit.record["stages"]}
    assert "cycle_check" not in stages["calibrate/step"]["tensors"]
    top = stages["calibrate"]
    assert top["components"]["unreachable.cycles"]["bytes"] == BUFFER
    assert top["tensors"]["cycle_check"]["cycles"] == 1
    assert alive() is not None
