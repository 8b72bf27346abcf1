"""`auditor gradprobe`, the main job: a tiny real run, traced and scaled projections, the
report; and one line with exit status 2 for each mistake on the command line."""
import json
import subprocess
import sys

import pytest

from auditor.facts.units import size
from auditor.record import run_folder as run_record

TINY = ["--arch", "tinystories-33m", "--layers", "2", "--hidden", "64", "--vocab", "256",
        "--heads", "4", "--seq-len", "16"]


def auditor(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "auditor", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


@pytest.mark.slow
def test_audits_projects_and_reports(tmp_path):
    report, run_dir = tmp_path / "report.md", tmp_path / "run"
    done = auditor("gradprobe", *TINY, "--run-dir", str(run_dir), "-o", str(report),
                   "--target", "tinystories-33m")
    assert done.returncode == 0, done.stderr
    # run.json is the audit's own record, exactly what its event log rebuilds; the projections
    # and calibration runs derived from it sit beside it, and load() brings them back
    written = json.loads((run_dir / "run.json").read_text())
    assert written == run_record.rebuild(run_dir, write=False)
    assert "projections" not in written and "calibration" not in written
    assert (run_dir / "projections.json").exists() and (run_dir / "calibration.json").exists()
    record = run_record.load(run_dir)
    phases = [s.path for s in record.stages if s.parent == "prune"]
    assert phases == [f"prune/GradProbe.{p}" for p in (
        "save_state", "record_original_gradients", "select_candidates", "reduce_candidates",
        "record_reduced_gradients", "decide", "apply_masks")]
    components = {s.path: s.components for s in record.stages}["prune/GradProbe.decide"]
    assert components["pruner.saved_state"].category == "saved copies"
    # a copy by provenance (the live-tensor meter saw every parameter copied), not by its name or size
    weights = components["model.parameters"].bytes
    assert components["pruner.saved_state"].weights_copied == weights
    assert components["model.buffers"].category == "buffers"  # GPT-Neo's causal masks: never masks
    from auditor.analysis.findings.rules import findings
    [copy] = [f for f in findings(record) if f.rule == "full-copy"]
    assert copy.evidence["component"] == "pruner.saved_state" and copy.evidence["basis"] == "provenance"
    assert copy.severity == "high" and copy.evidence["weights_copied"] == weights
    assert components["pruner.gradients_original"].category == "gradient records"
    assert record.annotations["workload"]["architecture"] == "tinystories-33m"
    assert record.annotations["minimum"]["total"] > 0
    methods = {(p["method"], p["target"]) for p in record.annotations["projections"]}
    assert methods == {("scaled", "tinystories-33m"), ("traced", "tinystories-33m")}
    traced = next(p for p in record.annotations["projections"] if p["method"] == "traced")
    # the full TinyStories-33M holds S, G0, G1 and .grad besides its weights: > 5x 261 MiB
    assert traced["live_tensor_peak"] > 5 * 68_514_048 * 4
    text = report.read_text()
    for heading in ("## What was alive at the peak", "## Fixes", "## Summary", "## Stages",
                    "### Over the run", "## Findings", "## Environment"):
        assert heading in text
    assert (tmp_path / "report-timeline.png").exists()
    # memray is on by default: the report names the allocation sites of the peak
    assert record.probes["memray"].state == "on" and record.memray.sites
    sites = text.split("## Top allocation sites at the peak", 1)[1].split("\n## ", 1)[0]
    assert "No memray trace" not in sites
    top = record.memray.sites[0]
    assert f"| `{top.function}` | {size(top.bytes)} |" in sites.split("\n| 2 |")[0]
    again = tmp_path / "again.md"  # the report made again from the folder alone
    assert auditor("report", str(run_dir), "-o", str(again)).returncode == 0
    assert again.read_text().replace("again-", "report-") == text


def test_memray_is_on_by_default_and_no_memray_skips_it():
    from auditor.cli import build_parser
    parse = build_parser().parse_args
    assert parse(["gradprobe"]).memray is True
    assert parse(["gradprobe", "--memray"]).memray is True
    assert parse(["gradprobe", "--no-memray"]).memray is False


@pytest.mark.parametrize("args, message", [
    (["--target", "gpt-9"], "unknown architecture 'gpt-9'"),
    (["--arch", "./no/such/folder"], "does not exist"),
    (["--sparsity", "1.5"], "sparsity"),
    (["--variant", "fastest"], "unknown variant"),
    (["--seq-len", "0"], "--seq-len"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    done = auditor("gradprobe", *args, "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "reports").exists()
