"""Capture writes the record's types: each stage, unstaged interval and mark of the event log
is made as auditor.record.schema's part and written in the log's own key order, nulls included,
so reading the log back into those types loses and adds nothing."""
from __future__ import annotations

import json

import pytest
import torch

import auditor
from auditor.capture.stage_book import MARK_KEYS, STAGE_KEYS, UNSTAGED_KEYS
from auditor.record import run_folder as run_record
from auditor.record.schema import Mark, Readings, Stage, TensorTotals, Unstaged, _read, written_as

PARTS = {"stage_finished": ("stage", Stage, STAGE_KEYS), "unstaged": ("unstaged", Unstaged, UNSTAGED_KEYS),
         "mark": ("mark", Mark, MARK_KEYS)}


def _events(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / run_record.EVENTS_FILE).read_text().splitlines()]


@pytest.mark.parametrize("options", [{}, {"tracemalloc": True, "census": True, "live_tensors": True}])
def test_logged_parts_are_the_record_types_in_the_log_order(tmp_path, options):
    folder = tmp_path / "run"
    with auditor.Audit(folder, **options) as audit:
        model = torch.nn.Linear(16, 16)
        audit.track("model", model)
        with auditor.stage("outer"):
            x = torch.randn(8, 16)
            with auditor.stage("inner"):
                y = model(x)
            auditor.mark("between")
            del y
        with pytest.raises(ValueError), auditor.stage("failing"):
            raise ValueError("boom")
    seen = set()
    for event in _events(folder):
        if event["event"] not in PARTS:
            continue
        key, kind, keys = PARTS[event["event"]]
        written = event[key]
        assert tuple(written) == keys, (event["event"], list(written))
        problems: list[str] = []
        part = _read(kind, written, key, problems)
        assert problems == [] and part.to_json() == written
        seen.add(event["event"])
        if event["event"] == "stage_finished":
            assert list(written["rss"]) == ["start", "end", "peak"]
            if options:
                assert list(written["live_tensors"]) == ["start", "end", "peak", "allocator_threshold",
                                                         "heap_high_water", "at_peak"]
                rows = written["live_tensors"]["at_peak"]["rows"]
                assert rows and all(list(row) == ["owner", "category", "created_in", "op", "bytes", "tensors",
                                                  "alive_at_end"] for row in rows)
                assert list(written["components"]["model.parameters"]) == ["category", "bytes", "tensors"]
            else:
                assert written["py_heap"] is None and written["components"] is None
    assert seen == set(PARTS)
    record = run_record.load(folder)
    assert [(stage.path, stage.status) for stage in record.stages] == [
        ("outer", "ok"), ("outer/inner", "ok"), ("failing", "failed")]


def test_written_as_keeps_its_keys_then_what_was_set_since():
    totals = written_as(TensorTotals(live_bytes=10), ("live_bytes",))
    assert totals.to_json() == {"live_bytes": 10}  # a null it was not given is not written
    totals.cycle_check = {"cycles": 0}
    assert list(totals.to_json()) == ["live_bytes", "cycle_check"]
    readings = written_as(Readings(start=1, end=2, peak=3), ("peak", "start", "end"))
    assert list(readings.to_json()) == ["peak", "start", "end"]


def test_written_as_refuses_a_key_that_is_no_field():
    part = written_as(Readings(start=1), ("start", "bogus"))
    with pytest.raises(TypeError, match="Readings has no field.* bogus"):
        part.to_json()
