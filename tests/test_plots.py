"""The PNGs a reader looks at, drawn from committed real records: the timeline names nested stages
and always the peak's, stacks the components under the RSS line, and no text of any chart (run
timeline, components, training-step chart, comparison chart) leaves its figure or overlaps
another stage name."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import auditor
from auditor.analysis.run.timeline import timeline
from auditor.renderers import components_plot, timeline_plot
from auditor.report_models.run import run_report

ROOT = Path(__file__).resolve().parents[1]
GRADPROBE = ROOT / "reports" / "gradprobe-tinystories-33m-runs" / "audit"    # nested, census, staged peak
HESSIAN = ROOT / "reports" / "example-hessian-pruner-runs" / "run"          # 224 narrow nested calls, unstaged peak
WORKERS = ROOT / "reports" / "dataloader-workers-cpu-runs" / "run"          # 79 narrow stages, no census
TRAIN_STEP = ROOT / "reports" / "train-step-cpu-runs"
COMPARISON = ROOT / "reports" / "compare-tinystories-33m.json"
PEAK_RED = "#c62828"


def drawn(figure):
    figure.canvas.draw()
    return figure.canvas.get_renderer()


def texts_of(figure) -> list:
    """Every text the figure shows: titles, axis and tick labels in view, legends, annotations."""
    from matplotlib.text import Text
    renderer = drawn(figure)
    hidden = set()  # ticks matplotlib keeps but does not draw: outside the view
    for axes in figure.axes:
        for axis in (axes.xaxis, axes.yaxis):
            low, high = sorted(axis.get_view_interval())
            slack = 1e-9 * (high - low)
            hidden |= {id(label) for tick in axis.majorTicks + axis.minorTicks
                       if not low - slack <= tick.get_loc() <= high + slack for label in (tick.label1, tick.label2)}
    return [(text, text.get_window_extent(renderer)) for text in figure.findobj(Text)
            if text.get_visible() and text.get_text().strip() and id(text) not in hidden]


def assert_inside_the_figure(figure) -> None:
    box = figure.bbox
    shown = texts_of(figure)
    assert shown
    for text, extent in shown:
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and box.y0 <= extent.y0 and extent.y1 <= box.y1, \
            (text.get_text()[:60], extent.extents, box.extents)


def stage_names(figure) -> dict[str, object]:
    """The stage rows' names (the second axes) by their text."""
    return {t.get_text(): t for t in figure.axes[1].texts}


def assert_names_fit_their_rows(figure) -> None:
    """Each stage name lies inside the rows' axes and no two names in one row overlap."""
    renderer = drawn(figure)
    band = figure.axes[1]
    placed = [(t.get_position()[1], t.get_window_extent(renderer)) for t in band.texts]
    for _, extent in placed:
        assert band.bbox.x0 <= extent.x0 and extent.x1 <= band.bbox.x1, extent.extents
    for i, (row, a) in enumerate(placed):
        for other, b in placed[i + 1:]:
            assert row != other or a.x1 <= b.x0 or b.x1 <= a.x0, (a.extents, b.extents)


@pytest.fixture(scope="module")
def gradprobe():
    return run_report(auditor.load(GRADPROBE))


def test_the_analysis_carries_nested_stages_and_compositions():
    line = timeline(auditor.load(GRADPROBE))
    assert [s.label for s in line.spans] == ["build model", "prune"]
    assert [s.label for s in line.nested][:2] == ["GradProbe.save_state", "GradProbe.record_original_gradients"]
    assert {s.depth for s in line.nested} == {1}
    workers = timeline(auditor.load(WORKERS))
    assert len(workers.compositions) == len(workers.spans) == 79  # each innermost stage's peak
    assert all(sum(c.by_category.values()) > 0 for c in workers.compositions)


def test_the_timeline_names_nested_stages_and_the_peak_stage(gradprobe):
    figure = timeline_plot.draw(gradprobe)
    names = stage_names(figure)
    assert {"build model", "prune", "GradProbe.record_original_gradients"} <= set(names)
    peak = names["GradProbe.record_reduced_gradients"]  # the run's peak stage, in red
    assert peak.get_color() == PEAK_RED and peak.get_position()[1] == 1.5  # the nested row
    labels = {s.label for s in gradprobe.timeline.line.spans} | {s.label for s in gradprobe.timeline.line.nested}
    # a name too long for its span is shortened (the class dropped, then cut with "…"), never changed
    shortened = labels | {label.rsplit(".", 1)[-1] for label in labels}
    assert all(name in shortened or (name.endswith("…") and any(s.startswith(name[:-1]) for s in shortened))
               for name in names)
    assert_names_fit_their_rows(figure)
    assert_inside_the_figure(figure)
    assert_peak_label_clear_of_the_lines(figure)


def assert_peak_label_clear_of_the_lines(figure) -> None:
    renderer, axes = drawn(figure), figure.axes[0]
    label = next(t for t in axes.texts if t.get_text().startswith("peak "))
    box = label.get_window_extent(renderer)
    for line in axes.lines:
        if len(line.get_xdata()) > 1:
            assert not line.get_transform().transform_path(line.get_path()).intersects_bbox(box, filled=False), \
                line.get_label()


def test_the_timeline_stacks_the_census_components_under_the_rss_line(gradprobe):
    figure = timeline_plot.draw(gradprobe)
    axes = figure.axes[0]
    stacked = {c.get_label(): c for c in axes.collections if c.get_label() and not c.get_label().startswith("_")}
    top = [item.name for item in gradprobe.components.over_the_run[:timeline_plot.TOP]]
    assert set(top) <= set(stacked)
    rest = len(gradprobe.components.over_the_run) - timeline_plot.TOP
    smaller = f"{rest} smaller one" + ("s" if rest > 1 else "")
    assert smaller in stacked
    # the stack's top edge reaches the census total at the peak stage's end, in GiB
    height = max(max(y for _, y in c.get_paths()[0].vertices) for c in stacked.values()
                 if c.get_label() in top or c.get_label() == smaller)
    census = max(sum(v[i][1] for v in (item.series for item in gradprobe.components.over_the_run))
                 for i in range(len(gradprobe.components.over_the_run[0].series)))
    assert height == pytest.approx(census / 2**30, rel=1e-6)
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert "pruner.saved_state" in legend and legend[0].startswith("RSS")


def test_a_peak_stage_too_narrow_for_its_name_is_still_named():
    figure = timeline_plot.draw(run_report(auditor.load(WORKERS)))
    names = stage_names(figure)
    assert names["train_step#76"].get_color() == PEAK_RED  # a 24 ms stage of a 4.8 s run
    assert len(names) == 1, "79 stages a few pixels wide: only the peak's is named"
    assert_names_fit_their_rows(figure)
    assert_inside_the_figure(figure)
    assert_peak_label_clear_of_the_lines(figure)
    labels = [c.get_label() for c in figure.axes[0].collections]
    assert "activations and temporaries" in labels  # no census: the live tensors at each peak, stacked


def test_a_peak_in_unstaged_time_is_named_as_such_and_narrow_calls_are_left_unnamed():
    report = run_report(auditor.load(HESSIAN))
    assert len(report.timeline.line.nested) == 224
    figure = timeline_plot.draw(report)
    names = stage_names(figure)
    assert names["peak: no stage"].get_color() == PEAK_RED
    assert "prune_with_hessians" in names and not any("add_batch" in name for name in names)
    assert_names_fit_their_rows(figure)
    assert_inside_the_figure(figure)


def test_the_components_chart_keeps_its_text_inside(gradprobe):
    figure = components_plot.draw(gradprobe)
    assert figure is not None
    assert_inside_the_figure(figure)


@pytest.mark.parametrize("count", [1, 8])
def test_the_training_step_chart_keeps_its_title_inside(count):
    from auditor.renderers import train_step_chart
    from auditor.report_models.train_step import train_step_report
    folders = sorted(p for p in TRAIN_STEP.iterdir() if p.is_dir())[:count]
    figure = train_step_chart.draw(train_step_report([auditor.load(f) for f in folders]))
    assert figure.axes[0].get_title().startswith("Components of one training step")
    assert_inside_the_figure(figure)


@pytest.mark.parametrize("name", [None, "a comparison with a very long name " * 6])
def test_the_comparison_chart_keeps_its_text_inside(name):
    from auditor.comparison import Comparison
    from auditor.renderers import comparison_chart
    from auditor.report_models.comparison import comparison_report
    comparison = Comparison.load(COMPARISON)
    report = comparison_report(comparison.record, comparison.summary)
    if name is not None:
        report.name = name
    figure = comparison_chart.draw(report)
    assert_inside_the_figure(figure)
    title = figure.get_suptitle()
    if name is None:
        assert title.startswith(json.loads(COMPARISON.read_text())["name"] + ":")
    else:
        assert "\n" in title, "a long name is wrapped, not cut by the figure's edge"


def test_deeper_stages_share_the_last_row_and_a_failed_stage_says_so(tmp_path):
    try:
        with auditor.Audit(tmp_path / "run", name="deep and failed"), auditor.stage("outer"):
            with auditor.stage("middle"), auditor.stage("inner"), auditor.stage("innermost"):
                kept = bytearray(b"x" * 60_000_000)
                del kept
            with auditor.stage("broken"):
                raise ValueError("the program's own error")
    except ValueError:
        pass
    figure = timeline_plot.draw(run_report(auditor.load(tmp_path / "run")))
    names = stage_names(figure)
    assert names["innermost"].get_color() == PEAK_RED and names["innermost"].get_position()[1] == 2.5
    assert "outer [failed]" in names and names["middle"].get_position()[1] == 1.5
    assert [t.get_text() for t in figure.axes[1].get_yticklabels()] == ["stages", "nested", "nested 2+ deep"]
    assert_names_fit_their_rows(figure)
    assert_inside_the_figure(figure)
