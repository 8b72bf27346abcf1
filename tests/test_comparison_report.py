"""The comparison report's model, made once from the committed comparison record: what the
markdown report and the chart show, before any formatting."""
from pathlib import Path

from auditor.comparison import Comparison
from auditor.report_models.comparison import comparison_report

RECORD = Path(__file__).resolve().parents[1] / "reports" / "compare-tinystories-33m.json"


def test_the_model_holds_what_the_report_shows():
    comparison = Comparison.load(RECORD)
    report = comparison_report(comparison.record, comparison.summary)
    assert not report.failed and report.rule
    assert [s.name for s in report.sides] == ["baseline", "lean", "sparse-state", "grad-in-backward", "checkpointed"]
    baseline, lean = report.sides[0], report.sides[1]
    assert baseline.runs == 3 and not baseline.marked_baseline  # named "baseline": no mark needed
    assert lean.peak_rss is not None and lean.peak_rss.min <= lean.peak_rss.median <= lean.peak_rss.max
    variant = report.variants[0]
    assert variant.name == "lean" and variant.noise == "saves" and variant.claims_saving
    assert abs(variant.peak_ratio - lean.peak_rss.median / baseline.peak_rss.median) < 1e-12
    assert variant.agreement == "identical" and variant.differing_elements == 0
    assert report.baseline_repeats is not None and not report.baseline_repeats.disagree
    # every run in the order it ran, its overhead over its loaded RSS
    assert [r.order for r in report.runs] == list(range(1, 16))
    first = report.runs[0]
    assert first.overhead == first.peak_rss - first.loaded_rss and first.digest
    # the commands as shown, each side's with its run folder left as `{run_dir}`
    assert report.commands.command.startswith("auditor compare --baseline baseline")
    assert all("{run_dir}" in command for _, command in report.commands.sides)
    assert report.commands.reference == "baseline run 1"
    # what each side reported about itself, its first run's, bytes marked
    fields = {f.name: f for f in report.reported.fields}
    assert fields["gradprobe.variant"].values == report.reported.sides
    assert fields["gradprobe.rss_after_build"].in_bytes and not fields["gradprobe.parameters"].in_bytes
    assert report.setting.order == report.reported.sides and report.setting.busy
    assert report.environment.cpus == 2 and report.environment.executable
