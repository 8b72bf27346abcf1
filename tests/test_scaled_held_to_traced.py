"""A scaled projection's headline figures are shown only where the traced projection of the same
target bears them out, within the validation matrix's targets for the scaled method; with no
traced projection to hold them to, they are labelled unchecked wherever printed.

Made from the committed GradProbe record (TinyStories-33M projected to Mistral-7B, scaled and
traced), its projections edited in a copy: the scaled one's peak grown, or the traced one removed.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from auditor.analysis.projection.validation import TARGETS
from auditor.analysis.projection.views import UNCHECKED, projection_views
from auditor.cli.gradprobe import _print_summary
from auditor.facts import units
from auditor.record.run_folder import load
from auditor.renderers.markdown import render
from auditor.report_models.run import run_report

ROOT = Path(__file__).resolve().parents[1]
AUDIT = ROOT / "reports" / "gradprobe-tinystories-33m-runs" / "audit"
LIMIT = {t.what: t.limit for t in TARGETS if t.method == "scaled"}


def _copy(tmp_path: Path, edit=None) -> Path:
    """The record's run.json and derived files in a folder of their own, its projections edited."""
    folder = tmp_path / "audit"
    folder.mkdir(parents=True)
    for name in ("run.json", "calibration.json", "projections.json"):
        shutil.copy2(AUDIT / name, folder / name)
    if edit is not None:
        projections = json.loads((folder / "projections.json").read_text())
        (folder / "projections.json").write_text(json.dumps(edit(projections)))
    return folder


def _grown(live: float, rss: float):
    """The scaled projection's peak live tensors and peak RSS multiplied by these factors, at
    its peak and in the stage holding it."""
    def edit(projections: list[dict]) -> list[dict]:
        scaled = next(p for p in projections if p["method"] == "scaled")
        stage = next(s for s in scaled["stages"] if s["path"] == scaled["peak"]["stage"])
        assert (stage["tensor_peak"], stage["rss_peak"]) == (scaled["live_tensor_peak"], scaled["peak"]["rss"])
        scaled["live_tensor_peak"] = stage["tensor_peak"] = round(scaled["live_tensor_peak"] * live)
        scaled["peak"]["live_tensors"] = scaled["live_tensor_peak"]
        scaled["peak"]["rss"] = stage["rss_peak"] = round(scaled["peak"]["rss"] * rss)
        return projections
    return edit


def _sections(text: str) -> tuple[str, str]:
    """The report's opening (title to the summary, headlines all) and its details."""
    head, details = text.split("## Details", 1)
    return head, details


def _views(folder: Path):
    views = projection_views(load(folder))
    return (next(v for v in views if v.method == "scaled"),
            next((v for v in views if v.method == "traced"), None))


def test_the_committed_record_shows_its_scaled_figures_where_the_traced_one_agrees(tmp_path):
    scaled, traced = _views(_copy(tmp_path))
    assert traced is not None and scaled.withheld is None and scaled.unchecked is None
    assert abs(scaled.peak_rss / traced.peak_rss - 1) < LIMIT["peak RSS"]
    text = render(run_report(load(AUDIT)))
    title = text.splitlines()[0]
    assert f"at mistral-7b {units.size(scaled.peak_rss)} (scaled), {units.size(traced.peak_rss)} (traced)" in title
    assert "149.01 GiB (scaled)" in title and "not shown" not in text and "unchecked" not in text
    assert "| at mistral-7b (scaled) | at mistral-7b (traced) |" in text


@pytest.mark.parametrize("what", ["peak live tensors", "peak RSS"])
def test_each_figure_is_held_to_its_own_target_from_the_validation_matrix(tmp_path, what):
    """Just inside its target, shown; just outside, withheld: the limits are TARGETS' own."""
    scaled, traced = _views(_copy(tmp_path / "base"))
    key = "live_tensor_peak" if what == "peak live tensors" else "peak_rss"
    ratio = getattr(traced, key) / getattr(scaled, key)  # scaled * ratio = traced exactly

    def grown(by: float):
        factor = ratio * (1 + by)
        return _grown(factor, 1.0) if what == "peak live tensors" else _grown(1.0, factor)

    inside, _ = _views(_copy(tmp_path / "inside", grown(LIMIT[what] * 0.9)))
    outside, _ = _views(_copy(tmp_path / "outside", grown(LIMIT[what] * 1.1)))
    assert inside.withheld is None
    assert outside.withheld == (f"not shown: differs from the traced projection by "
                                f"{LIMIT[what] * 1.1:+.1%} on {what} (target {LIMIT[what]:.0%})")


def test_a_scaled_projection_the_traced_one_does_not_bear_out_is_withheld_from_every_headline(tmp_path, capsys):
    folder = _copy(tmp_path, _grown(1.10, 1.10))
    scaled, traced = _views(folder)
    assert scaled.withheld is not None
    sentence = scaled.withheld
    assert re.fullmatch(r"not shown: differs from the traced projection by \+10\.\d% on peak live tensors "
                        r"\(target 3%\) and \+10\.\d% on peak RSS \(target 5%\)", sentence), sentence
    record = load(folder)
    head, details = _sections(render(run_report(record)))
    figure = units.size(scaled.peak_rss)  # the grown peak: in no headline, kept in the details
    assert figure not in head and figure in details
    title = head.splitlines()[0]
    assert f"at mistral-7b (scaled) {sentence}, {units.size(traced.peak_rss)} (traced)" in title
    summary = next(line for line in head.splitlines() if line.startswith("| projected (scaled: mistral-7b)"))
    assert sentence in summary and "GiB" not in summary
    peak_row = next(line for line in head.splitlines() if line.startswith("| **peak RSS**"))
    assert f"| {sentence} | **142.14 GiB** |" in peak_row and "142.15 GiB" not in peak_row  # scaled's, withheld
    parameters = next(line for line in head.splitlines() if "`model.parameters`" in line)
    assert parameters.endswith("| - | 26.98 GiB |")  # the whole column is withheld, not only its peak
    assert f"At mistral-7b (scaled): {sentence}; its figures are in the details" in " ".join(head.split())
    fixes = head.split("## Fixes", 1)[1].split("## Summary", 1)[0]
    assert "| 261.4 MiB | not shown¹ | 26.98 GiB |" in fixes and f"¹ {sentence[0].upper()}{sentence[1:]}" in fixes
    # the findings in full keep the saving at the target, with the sentence
    assert (f"26.98 GiB at mistral-7b (scaled; {sentence}); 26.98 GiB at mistral-7b (traced)"
            in " ".join(details.split()))
    assert f"**Its headline figures are {sentence}**" in " ".join(details.split())  # the projection's section
    _print_summary(record, Path("report.md"), folder)
    said = capsys.readouterr().out
    assert f"scaled projection to mistral-7b: {sentence}\n" in said and figure not in said


@pytest.mark.parametrize("how", ["no traced projection", "the traced run failed"])
def test_a_scaled_projection_with_nothing_to_hold_it_to_is_labelled_unchecked_wherever_printed(tmp_path, capsys, how):
    def edit(projections: list[dict]) -> list[dict]:
        if how == "no traced projection":
            return [p for p in projections if p["method"] == "scaled"]
        traced = next(p for p in projections if p["method"] == "traced")
        traced["incomplete"] = "the traced run failed (exit status 1): RuntimeError: out of fake memory"
        traced["failed_stage"] = "prune/GradProbe.decide"
        return projections
    folder = _copy(tmp_path, edit)
    scaled, _ = _views(folder)
    assert scaled.withheld is None and scaled.unchecked == UNCHECKED
    record = load(folder)
    head, details = _sections(render(run_report(record)))
    label = f"scaled, {UNCHECKED}"
    assert f"at mistral-7b {units.size(scaled.peak_rss)} ({label})" in head.splitlines()[0]
    assert f"| at mistral-7b ({label}) |" in head  # the answer's column and the fixes' column
    assert head.count(f"at mistral-7b ({label})") >= 2
    summary = next(line for line in head.splitlines() if line.startswith("| projected (scaled: mistral-7b)"))
    assert f"**{UNCHECKED}**" in summary
    assert f"26.98 GiB at mistral-7b ({label})" in " ".join(details.split())
    _print_summary(record, Path("report.md"), folder)
    assert f"({UNCHECKED})" in capsys.readouterr().out
