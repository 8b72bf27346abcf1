"""The validation report shows a scaled figure exactly where the run report would print one:
a scaled projection its drivers do not explain has no peak figure in the Peaks table (it says
"not shown" and why), and its unexplained stages and components none in theirs. Made from a
committed validation record (benchmarks/projection_validation_runs.py)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

from auditor.analysis.projection.validation import check_targets
from auditor.renderers.validation_markdown import render, tables
from auditor.report_models.validation import validation_report

RECORD = Path(__file__).resolve().parents[1] / "reports" / "projection-validation-variants-runs" / "sparse-state.json"


def _result() -> dict:
    return json.loads(RECORD.read_text())["result"]


def test_a_scaled_projection_that_prints_no_number_shows_no_peak():
    result = _result()
    assert result["projections"]["scaled"]["explained"] is False  # the record this holds for
    report = validation_report(result)
    for line in report.peaks:
        scaled = line.figure.projected["scaled"]
        assert scaled.bytes is None and scaled.error is None
        assert scaled.withheld == "not explained by its drivers: the report prints no number (see traced)"
        assert line.figure.projected["traced"].bytes is not None  # the traced one is shown
    headers, rows = tables(report)["peaks"]
    scaled_column = headers.index("scaled")
    assert all(row[scaled_column].startswith("not shown: not explained by its drivers") for row in rows)
    assert all(row[scaled_column + 1] == "-" for row in rows)
    text = render(report)
    peaks = text.split("## Peaks", 1)[1].split("## Stages", 1)[0]
    assert peaks.count("GiB | not shown: not explained by its drivers: the report prints no number (see traced) "
                       "| - |") == 2


def test_unexplained_stages_show_no_scaled_figure_and_explained_ones_do():
    result = _result()
    unexplained = set(result["projections"]["scaled"]["unexplained_stages"])
    report = validation_report(result)
    assert {s.path for s in report.stages} > unexplained
    for stage in report.stages:
        scaled = stage.tensors.projected["scaled"]
        if stage.path in unexplained:
            assert scaled.bytes is None and scaled.withheld == "not explained by its drivers" and scaled.miss > 0
            assert stage.rss.projected["scaled"].bytes is None
        else:
            assert scaled.bytes is not None and scaled.withheld is None and scaled.error is not None


def test_a_scaled_projection_explained_everywhere_shows_every_figure():
    result = copy.deepcopy(_result())
    scaled = result["projections"]["scaled"]
    scaled["explained"] = True  # as the same projection would read had its calibration runs agreed
    for stage in scaled["stages"]:
        stage["explained"] = True
        for item in stage["components"].values():
            item["explained"] = True
    result["targets"] = check_targets(result)
    report = validation_report(result)
    assert all(line.figure.projected["scaled"].bytes == result["peak"]["scaled"][key]
               for line, key in zip(report.peaks, ("live_tensors", "rss"), strict=False))
    assert all(s.tensors.projected["scaled"].withheld is None for s in report.stages)
    assert "not shown" not in render(report)
