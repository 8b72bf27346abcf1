"""What was alive at a live-tensor peak: each storage's bytes, the stage it was created in,
the operator that created it and, for those still alive at the end, its census owner."""
from __future__ import annotations

import weakref

import torch

import auditor
from auditor.capture.census.ownership import ACTIVATIONS
from auditor.record import run_folder as run_record

MiB = 1 << 20


def _floats(nbytes: int, make=torch.zeros) -> torch.Tensor:
    return make(nbytes // 4)


# a storage no census names is named by the program's line that allocated it
SITE = f"allocated at tests/test_peak_composition.py:{_floats.__code__.co_firstlineno + 1} _floats"


def _stages(record) -> dict:
    return {s["path"]: s for s in record["stages"]}


def _rows(at_peak, created_in) -> dict:
    """(op, alive_at_end) -> row, for the rows created in one stage (or before the audit: None)."""
    return {(r["op"], r["alive_at_end"]): r for r in at_peak["rows"] if r["created_in"] == created_in}


def _consistent(live: dict) -> None:
    at_peak = live["at_peak"]
    assert at_peak["bytes"] == live["peak"]
    assert sum(r["bytes"] for r in at_peak["rows"]) + at_peak["bytes_left_out"] == at_peak["bytes"]
    assert [r["bytes"] for r in at_peak["rows"]] == sorted((r["bytes"] for r in at_peak["rows"]),
                                                           reverse=True)


class Holder:
    pass


def test_a_temporary_and_a_kept_tensor_at_the_stage_peak(tmp_path):
    weight = _floats(MiB, torch.ones)  # before the audit: seeded, no stage, no operator
    holder = Holder()
    with auditor.Audit(out=tmp_path / "run", live_tensors=True) as audit, auditor.stage("work"):
        holder.kept = _floats(4 * MiB)
        temporary = _floats(16 * MiB)
        del temporary
    live = _stages(audit.record)["work"]["live_tensors"]
    _consistent(live)
    assert live["peak"] - live["start"] == 20 * MiB
    rows = _rows(live["at_peak"], "work")
    assert rows.keys() == {("aten::zeros", False), ("aten::zeros", True)}
    freed, kept = rows["aten::zeros", False], rows["aten::zeros", True]
    assert (freed["bytes"], freed["tensors"], freed["owner"], freed["category"]) == (
        16 * MiB, 1, SITE, ACTIVATIONS)
    assert (kept["bytes"], kept["tensors"], kept["owner"]) == (4 * MiB, 1, None)
    assert kept["category"] == "unknown (no census)"  # census off: nobody to name an owner
    before = _rows(live["at_peak"], None)
    assert before[None, True]["bytes"] >= weight.untyped_storage().nbytes()
    assert "at_peak" in audit.record["probes"]["live_tensors"]["method"]


def test_storages_alive_at_the_end_are_named_by_the_census(tmp_path):
    holder = Holder()
    folder = tmp_path / "run"
    with auditor.Audit(out=folder, live_tensors=True, census=True) as audit:
        audit.track("holder", holder)
        with auditor.stage("work"):
            holder.kept = _floats(4 * MiB)
            temporary = _floats(16 * MiB)
            del temporary
        between = _floats(2 * MiB, torch.ones)  # a gap: its owners come from the next census
        holder.between = between
        del between
        with auditor.stage("next"):
            pass
    record = audit.record
    rows = _rows(_stages(record)["work"]["live_tensors"]["at_peak"], "work")
    assert rows["aten::zeros", True]["owner"] == "holder.kept"
    assert rows["aten::zeros", False]["owner"] == SITE
    gap = next(u for u in record["unstaged"] if u["after"] == "work")
    _consistent(gap["live_tensors"])
    made = _rows(gap["live_tensors"]["at_peak"], None)["aten::ones", True]
    assert made["owner"] == "holder.between" and made["bytes"] == 2 * MiB
    assert run_record.rebuild(folder, write=False) == auditor.load(folder).to_json() == record


def test_the_composition_is_the_set_alive_at_the_high_not_later_or_earlier(tmp_path):
    with auditor.Audit(out=tmp_path / "run", live_tensors=True) as audit, auditor.stage("work"):
        first = _floats(8 * MiB, torch.zeros)
        second = _floats(8 * MiB, torch.ones)   # 16 MiB: a high, then first goes
        del first
        third = torch.full((12 * MiB // 4,), 2.0)  # 20 MiB: the peak
        del third, second
        _floats(MiB, torch.rand)  # after the peak: not part of it
    live = _stages(audit.record)["work"]["live_tensors"]
    _consistent(live)
    assert live["peak"] - live["start"] == 20 * MiB
    rows = _rows(live["at_peak"], "work")
    assert {(op, r["bytes"]) for (op, _), r in rows.items()} == {("aten::ones", 8 * MiB),
                                                                  ("aten::full", 12 * MiB)}


def test_a_parent_takes_the_composition_of_the_child_that_held_its_peak(tmp_path):
    with auditor.Audit(out=tmp_path / "run", live_tensors=True) as audit, auditor.stage("P"):
        with auditor.stage("C1"):
            big = _floats(16 * MiB)
            del big
        with auditor.stage("C2"):
            small = _floats(8 * MiB, torch.ones)
            del small
    stages = _stages(audit.record)
    for stage in stages.values():
        _consistent(stage["live_tensors"])
    parent = stages["P"]["live_tensors"]["at_peak"]
    assert _rows(parent, "P/C1")["aten::zeros", False]["bytes"] == 16 * MiB
    assert not _rows(parent, "P/C2")
    second = stages["P/C2"]["live_tensors"]["at_peak"]
    assert _rows(second, "P/C2")["aten::ones", False]["bytes"] == 8 * MiB
    assert not _rows(second, "P/C1")


def test_an_unstaged_spike_has_its_composition(tmp_path):
    with auditor.Audit(out=tmp_path / "run", live_tensors=True) as audit:
        with auditor.stage("A"):
            pass
        spike = _floats(32 * MiB, torch.ones)
        del spike
        with auditor.stage("B"):
            pass
    gap = next(u for u in audit.record["unstaged"] if u["after"] == "A")
    _consistent(gap["live_tensors"])
    row = _rows(gap["live_tensors"]["at_peak"], None)["aten::ones", False]
    assert (row["bytes"], row["category"], row["owner"]) == (32 * MiB, ACTIVATIONS, SITE)


def test_rows_are_capped_and_what_is_left_out_is_counted(tmp_path):
    kept = []
    with auditor.Audit(out=tmp_path / "run", live_tensors=True) as audit, auditor.stage("P"):
        for index in range(30):
            with auditor.stage(f"c{index}"):
                kept.append(_floats((index + 1) * 4096))
    live = _stages(audit.record)["P"]["live_tensors"]
    _consistent(live)
    at_peak = live["at_peak"]
    assert len(at_peak["rows"]) == 25 and at_peak["rows_left_out"] >= 5
    mine = {r["created_in"]: r["bytes"] for r in at_peak["rows"] if r["created_in"]}
    assert mine["P/c29"] == 30 * 4096  # the largest of them first


def test_no_tensor_is_kept_alive_by_the_meter(tmp_path):
    with auditor.Audit(out=tmp_path / "run", live_tensors=True), auditor.stage("work"):
        temporary = _floats(4 * MiB)
        gone = weakref.ref(temporary)
        del temporary
        assert gone() is None  # freed at once, while its row is part of the peak


def test_state_freed_before_the_end_keeps_the_owner_a_census_saw(tmp_path):
    """A Hessian-like state: made by the parent, used by a staged call (whose end takes a
    census), freed before the parent ends: the parent's peak still names it."""
    holder = Holder()
    with auditor.Audit(out=tmp_path / "run", live_tensors=True, census=True) as audit:
        audit.track("pruner", holder)
        with auditor.stage("layer"):
            holder.H = _floats(16 * MiB)
            with auditor.stage("add_batch"):
                holder.H += 1
            holder.H = None
    at_peak = _stages(audit.record)["layer"]["live_tensors"]["at_peak"]
    row = _rows(at_peak, "layer")["aten::zeros", False]
    assert (row["owner"], row["bytes"], row["alive_at_end"]) == ("pruner.H", 16 * MiB, False)
    assert row["category"] == audit.record["stages"][1]["components"]["pruner.H"]["category"]
