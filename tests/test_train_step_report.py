"""The training-step report's model, built from the committed sweep's records, says what the
records say."""
from __future__ import annotations

from pathlib import Path

import pytest

from auditor.record.run_folder import load
from auditor.report_models.train_step import Calculator, train_step_report

RUNS = Path(__file__).resolve().parents[1] / "reports" / "train-step-cpu-runs"


@pytest.fixture(scope="module")
def records():
    loaded = [load(folder, from_events=True) for folder in RUNS.iterdir() if folder.is_dir()]
    return sorted(loaded, key=lambda record: record.started_at or "")  # sweep order, as `auditor report` does


def test_the_report_has_one_configuration_per_record_in_sweep_order(records):
    report = train_step_report(records)
    settings = [r.annotations["workload"]["settings"] for r in records]
    assert [(c.architecture, c.sequence_length, c.precision) for c in report.configurations] == [
        (s["architecture"], s["sequence_length"], s["precision"]) for s in settings]
    assert report.architectures == list(dict.fromkeys(s["architecture"] for s in settings))
    assert report.intro.batch_size == settings[0]["batch_size"]
    assert report.intro.sweep_command == records[0].annotations["workload"]["sweep_command"]
    assert report.environment.device == records[0].device
    assert all(c.unfinished is None and c.study is not None for c in report.configurations)  # all finished


def test_components_steps_and_sites_come_from_the_record(records):
    record = records[0]
    configuration = train_step_report(records).configurations[0]
    study = configuration.study
    assert study is not None
    measured, expected = record.annotations["measured"], record.annotations["workload"]["expected"]
    rows = {row.name: row for row in study.components}
    assert rows["parameters"].measured == measured["parameters"] == expected["parameters"]
    assert rows["parameters"].exact is True
    assert rows["optimizer state"].measured == measured["optimizer_state"]
    finished = [s for s in record.stages if s.parent is None and s.name.startswith("step ") and s.status == "ok"]
    assert study.steps == [int(s.name.split()[1]) for s in finished]
    assert study.series["live_tensors"] == [s.live_tensors.peak for s in finished]
    assert study.series["rss"] == [s.rss.peak for s in finished]
    assert isinstance(study.calculator, Calculator)
    assert study.calculator.measured_total == measured["saved_tensors"]["activations"]
    assert [line.site for line in configuration.sites.lines] == record.memray.sites


def test_the_sweep_row_holds_the_forward_only_and_full_step_peaks(records):
    row = train_step_report(records).sweep.rows[0]
    forward_only = next(s for s in records[0].stages if s.path == "forward only")
    steps = [s for s in records[0].stages if s.parent is None and s.name.startswith("step ")]
    assert row.forward["live_tensors"] == forward_only.live_tensors.peak
    assert row.step["live_tensors"] == max(s.live_tensors.peak for s in steps)
    assert row.ending is None
    assert row.saved_activations == records[0].annotations["measured"]["saved_tensors"]["activations"]


def test_a_configuration_without_a_finished_step_is_left_out_of_the_comparisons(records):
    # the fp32 runs were cut off before their first step ended: no sentence compares against them,
    # and the mixed-precision ones are still compared with each other across contexts
    import copy

    from auditor.analysis.training import step as training
    cut = [copy.deepcopy(r) for r in records]
    for record in cut:
        if record.annotations["workload"]["settings"]["precision"] == "fp32":
            record.stages = [s for s in record.stages if not s.name.startswith("step ")]
    rows = training.sweep_rows(cut)
    assert any(r["precision"] == "fp32" and "step_live_tensors" not in r for r in rows)
    lines = training.sweep_commentary(rows)
    assert lines and not any("fp32" in line for line in lines)
