"""Data-dependent sizes: observed in a real run, estimated in a traced one, never silently empty.

The algorithm below keeps a value-dependent fraction of its rows four ways (nonzero, boolean
indexing, masked_select, a count read back and allocated with); a traced run at 8x the rows
must match a real run there within 2% on peak live tensors once given the small run's ratios.
"""
from __future__ import annotations

import pytest
import torch

import auditor
from auditor import expect_fraction
from auditor.analysis.projection.estimated_bytes import estimate_note, estimated_bytes
from auditor.analysis.projection.traced import project_traced
from auditor.capture.audit import Audit
from auditor.record.schema import SCHEMA, RunRecord

WIDTH = 64


def select_rows(rows: int, seed: int = 0) -> tuple:
    """About 31% of rows (score > 0.5), their indices, a copy made from a count read back, and
    the elements above 1 (about 16%)."""
    g = torch.Generator().manual_seed(seed)
    with auditor.stage("build"):
        weights = torch.randn(rows, WIDTH, generator=g) if not _tracing() else torch.empty(rows, WIDTH)
    with auditor.stage("select"):
        chosen = weights[:, 0] > 0.5
        where = torch.nonzero(chosen).squeeze(1)
        picked = weights[chosen]
        large = torch.masked_select(weights, weights > 1.0)
        copy = torch.empty(int(torch.count_nonzero(chosen)), WIDTH)
        copy.copy_(picked)
    return where, picked, large, copy


def _tracing() -> bool:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    return any(isinstance(m, FakeTensorMode) for m in _get_current_dispatch_mode_stack())


def _peaks(record: RunRecord) -> dict:
    return {s.path: s.live_tensors.peak for s in record.stages}


def _run(tmp_path, name: str, rows: int, **options) -> RunRecord:
    with Audit(out=tmp_path / name, live_tensors=True, **options) as run:
        result = select_rows(rows)
        del result
    return RunRecord.from_json(run.record, name)


def _record(stages: list[dict], name: str = "r", **annotations) -> RunRecord:
    """A run record of these stages (their own fields as given) and annotations; what else a
    record must hold is filled with values the analysis under test does not read."""
    return RunRecord.from_json({"schema": SCHEMA, "name": name, "command": "test", "started_at": "2026-01-01T00:00:00",
                                "device": "cpu", "environment": {}, "process": {},
                                "stages": [_stage(s) for s in stages], "peak": {"rss": None}, **annotations})


def _stage(fields: dict) -> dict:
    stage = {"name": fields["path"], "parent": None, "status": "ok", "start_s": 0.0, "end_s": 1.0, **fields}
    stage["rss"] = {"start": 0, "end": 0, "peak": 0, **fields.get("rss", {})}
    at_peak = (fields.get("live_tensors") or {}).get("at_peak")
    if at_peak is not None:  # the rows' tensor counts and their total
        rows = [{"tensors": 1, **row} for row in at_peak["rows"]]
        stage["live_tensors"] = {**fields["live_tensors"],
                                 "at_peak": {"bytes": sum(row["bytes"] for row in rows), **at_peak, "rows": rows}}
    return stage


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("small"), "run", 4000, record_sizes=True)


def test_real_run_records_each_site_with_its_aggregate_ratio(small):
    sizes = {(s["op"], s["site"].split(" ")[1]): s for s in small.annotations["data_dependent_sizes"]}
    assert {op for op, _ in sizes} == {"aten::nonzero", "aten::index", "aten::masked_select",
                                       "aten::count_nonzero"}
    for entry in small.annotations["data_dependent_sizes"]:
        assert entry["site"].startswith("tests/test_data_dependent.py:")
        assert entry["calls"] == 1
        assert entry["ratio"] == entry["output_numel"] / entry["input_numel"]
    chosen = sizes["aten::nonzero", "select_rows"]
    assert 0.25 < chosen["ratio"] < 0.37  # P(N(0,1) > 0.5) = 0.31
    assert sizes["aten::index", "select_rows"]["output_numel"] == chosen["output_numel"]
    assert sizes["aten::count_nonzero", "select_rows"]["output_numel"] == chosen["output_numel"]
    assert 0.13 < sizes["aten::masked_select", "select_rows"]["ratio"] < 0.19


def test_traced_run_sized_by_observed_ratios_matches_a_real_run_8x_larger(small, tmp_path):
    real = _run(tmp_path, "real", 32000)
    traced = _run(tmp_path, "traced", 32000, traced=True, observed_sizes=small.annotations["data_dependent_sizes"])
    lower = _run(tmp_path, "lower", 32000, traced=True, estimate_sizes=False)
    peak_real, peak_traced = _peaks(real)["select"], _peaks(traced)["select"]
    assert abs(peak_traced / peak_real - 1) < 0.02
    assert _peaks(lower)["select"] < 0.85 * peak_real  # empty selections: what tracing alone gives
    sites = traced.annotations["traced"]["estimated_sizes"]
    assert {s["source"] for s in sites} == {"observed"} and len(sites) == 4
    assert not any(s["conflicts"] for s in sites)
    measured = estimated_bytes(traced, lower)
    select = next(s for s in measured["stages"] if s["path"] == "select")
    assert select["peak_rise"] == _peaks(traced)["select"] - _peaks(lower)["select"] > 0
    assert select["peak_rise"] <= select["live_tensors"] <= _peaks(traced)["select"]


def test_declared_fraction_sizes_a_site_no_real_run_observed(tmp_path):
    with Audit(out=tmp_path / "declared", live_tensors=True, traced=True) as run:
        weights = torch.empty(10000, WIDTH)
        with expect_fraction(0.25):
            picked = weights[weights[:, 0] > 0]
        assert picked.shape == (2500, WIDTH)
    (site,) = run.record["traced"]["estimated_sizes"]
    assert site["source"] == "declared" and site["ratio"] == 0.25


def test_declaration_is_a_no_op_in_a_real_run():
    weights = torch.arange(10.0)
    with expect_fraction(0.9):
        assert weights[weights > 6].numel() == 3
    with pytest.raises(ValueError, match="fraction from 0 to 1"), expect_fraction(1.5):
        pass


def test_unknown_site_is_empty_and_named(tmp_path):
    with Audit(out=tmp_path / "unknown", live_tensors=True, traced=True) as run:
        weights = torch.empty(1000, WIDTH)
        assert torch.nonzero(weights > 0).shape == (0, 2)
    (site,) = run.record["traced"]["estimated_sizes"]
    assert site["source"] == "unknown" and site["output_numel"] == 0
    projection = project_traced(_record([]), RunRecord.from_json({**run.record, "workload": {"architecture": "x"}}))
    note = estimate_note(projection)
    assert "unknown" in note and site["site"] in note and "lower bound" in note


def test_one_mask_read_twice_gets_one_count(tmp_path):
    """A count read back and the selection it sizes agree, even with ratios of other sites."""
    observed = [{"site": "elsewhere", "op": "aten::index", "ratio": 0.5}]
    with Audit(out=tmp_path / "one", live_tensors=True, traced=True, observed_sizes=observed) as run:
        weights = torch.empty(1000, WIDTH)
        chosen = weights[:, 0] > 0
        with expect_fraction(0.2):
            count = int(torch.count_nonzero(chosen))
        with expect_fraction(0.7):  # the same mask: its count stands
            picked = weights[chosen]
        torch.empty(count, WIDTH).copy_(picked)
    assert count == 200 and picked.shape[0] == 200
    assert not any(s["conflicts"] for s in run.record["traced"]["estimated_sizes"])


def test_estimate_that_disagrees_with_the_program_yields_to_it_and_is_counted(tmp_path):
    """A buffer sized by one count and filled from a selection sized at another site's ratio
    (two masks): the program's buffer wins, the conflict is counted, the run goes on."""
    with Audit(out=tmp_path / "conflict", live_tensors=True, traced=True) as run:
        weights = torch.empty(1000)
        with expect_fraction(0.1):
            count = int(torch.count_nonzero(weights > 0))
        with expect_fraction(0.3):
            picked = weights[weights < 0]
        buffer = torch.zeros(count)
        torch.maximum(buffer, picked, out=buffer)
    assert buffer.shape == (100,)
    assert sum(s["conflicts"] for s in run.record["traced"]["estimated_sizes"]) == 1


def test_one_quantity_estimated_in_two_passes_is_reconciled_and_counted(tmp_path):
    """Sizes that reach tensors through Python ints (a count read back, then a buffer; a record
    written to a file and read back) carry no mark: estimated in two passes a few elements
    apart, the first input's size is taken, the conflict counted. With nothing estimated in the
    run, a shape mismatch is the program's own error."""
    with Audit(out=tmp_path / "twice", live_tensors=True, traced=True) as run:
        weights = torch.empty(1000)
        with expect_fraction(0.101):
            first = torch.zeros(int(torch.count_nonzero(weights > 0)))
        with expect_fraction(0.1):
            second = torch.zeros(int(torch.count_nonzero(weights > 0.5)))
        decided = first <= second * 3.0
    assert decided.shape == first.shape == (101,) and second.shape == (100,)
    assert sum(s["conflicts"] for s in run.record["traced"]["estimated_sizes"]) == 1
    with pytest.raises(RuntimeError), Audit(out=tmp_path / "plain", live_tensors=True, traced=True):
        _ = torch.zeros(101) <= torch.zeros(100)


def test_projection_carries_estimated_bytes_per_stage_and_component():
    traced = _record(name="t", workload={"architecture": "big"},
                     traced={"estimated_sizes": [{"site": "a.py:1 f", "op": "aten::index", "calls": 2,
                                                  "output_numel": 10, "ratio": 0.1, "source": "observed"}]},
                     stages=[{"path": "s", "status": "ok", "live_tensors": {"peak": 1000, "at_peak": {"rows": [
                         {"owner": "state", "category": "saved copies", "bytes": 600},
                         {"owner": "weights", "category": "weights", "bytes": 400}]}},
                         "components": {"state": {"category": "saved copies", "bytes": 600}}}])
    lower = _record([{"path": "s", "status": "ok", "live_tensors": {"peak": 500, "at_peak": {"rows": [
                        {"owner": "state", "category": "saved copies", "bytes": 100},
                        {"owner": "weights", "category": "weights", "bytes": 400}]}},
                      "components": {"state": {"category": "saved copies", "bytes": 100}}}])
    traced.annotations["estimated_bytes"] = estimated_bytes(traced, lower)
    real = _record([{"path": "s", "rss": {"peak": 2000}, "live_tensors": {"peak": 100}}])
    projection = project_traced(real, traced)
    (stage,) = projection["stages"]
    assert stage["estimated"] == 500 and stage["components"]["state"]["estimated"] == 500
    assert projection["peak"]["estimated"] == 500
    assert "500 B rest on data-dependent sizes estimated from observed ratios at 1 site" in estimate_note(projection)


def distinct_tokens(tokens: torch.Tensor) -> tuple:
    values, inverse, counts = torch.unique(tokens, return_inverse=True, return_counts=True)
    return values, inverse, counts


def test_unique_is_sized_by_its_own_ratio(tmp_path):
    with Audit(out=tmp_path / "real", record_sizes=True) as real:
        distinct_tokens(torch.arange(1000) % 250)
    (site,) = real.record["data_dependent_sizes"]
    assert site["op"] == "aten::_unique2" and site["ratio"] == 0.25
    with Audit(out=tmp_path / "traced", traced=True, observed_sizes=real.record["data_dependent_sizes"]):
        tokens = torch.empty(8000, dtype=torch.long)
        values, inverse, counts = distinct_tokens(tokens)
        assert values.shape == (2000,) and counts.shape == (2000,) and inverse.shape == (8000,)
        assert torch.nonzero(tokens).shape == (0, 1)  # the same tensor's nonzero: not unique's count


def test_report_views_carry_the_estimates():
    from auditor.analysis.projection.views import projection_views
    traced = _record(name="t", workload={"architecture": "big"},
                     traced={"estimated_sizes": [{"site": "a.py:1 f", "op": "aten::index", "calls": 1,
                                                  "output_numel": 10, "ratio": 0.1, "source": "observed"}]},
                     stages=[{"path": "s", "status": "ok", "live_tensors": {"peak": 1000},
                              "components": {"state": {"category": "saved copies", "bytes": 600}}}],
                     estimated_bytes={"stages": [{"path": "s", "live_tensors": 600, "components": {"state": 600}}]})
    real = _record([{"path": "s", "rss": {"peak": 2000}, "live_tensors": {"peak": 100}}])
    (view,) = projection_views(_record([], projections=[project_traced(real, traced)]))
    assert view.stages["s"].estimated == {"state": 600}
    assert "600 B rest on data-dependent sizes" in view.estimates
