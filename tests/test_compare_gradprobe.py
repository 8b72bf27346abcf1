"""`auditor compare` with GradProbe sides, end to end on a tiny GPT-Neo (real gradprobe processes)."""
from __future__ import annotations

import json

import pytest

from auditor.cli import main
from auditor.comparison import Comparison

TINY = ["--arch", "tinystories-33m", "--layers", "2", "--hidden", "64", "--vocab", "256", "--heads", "4",
        "--seq-len", "16", "--threads", "1"]
FLAGS = ("--variant", "--masks-out", "--summary-json")


def _missing_flags() -> list[str]:
    from gradprobe.cli import build_parser
    text = build_parser().format_help()
    return [flag for flag in FLAGS if flag not in text]


pytestmark = pytest.mark.skipif(bool(_missing_flags()), reason=f"gradprobe's CLI lacks {_missing_flags()} "
                                "(auditor compare runs GradProbe sides through them)")


@pytest.mark.slow
def test_lean_against_the_baseline_gives_identical_masks(tmp_path, monkeypatch, capsys):
    # A local gradprobe/ (an upstream clone, say) must not be what the sides run.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gradprobe").mkdir()
    (tmp_path / "gradprobe" / "__init__.py").write_text("raise ImportError('the local decoy was imported')\n")
    out = tmp_path / "gradprobe.md"
    status = main(["compare", "--baseline", "baseline", "--variant", "lean", "--repeats", "1",
                   "-o", str(out), "--", *TINY])
    assert status == 0, capsys.readouterr().err
    record = json.loads(out.with_suffix(".json").read_text())
    assert [side["name"] for side in record["sides"]] == ["baseline", "lean"]
    first, second = record["runs"]
    for run in (first, second):
        reported = run["reported"]["gradprobe"]
        assert run["result"]["kind"] == "file"  # the masks file, one tensor per parameter
        assert run["result"]["elements"] == reported["parameters"]
        assert run["loaded_rss"] == reported["rss_after_build"]
        assert 0 < run["loaded_rss"] < run["peak_rss"]
        assert "--masks-out" in run["command"] and "--variant" in run["command"]
    assert second["result"]["differing_elements"] == 0
    assert first["result"]["digest"] == second["result"]["digest"]
    assert first["result_digest"] == second["result_digest"]  # gradprobe's own mask digest
    variant = Comparison(record).summary["variants"][0]
    assert variant["agreement"]["status"] == "identical"
    assert "| lean " in out.read_text()


def test_gradprobe_argument_mistakes_are_usage_errors(tmp_path, capsys):
    status = main(["compare", "--variant", "lean", "--repeats", "1", "-o", str(tmp_path / "x.md"),
                   "--", *TINY, "--seq-len", "1"])
    assert status == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("auditor: error: gradprobe: error:"), lines
    assert "--seq-len" in lines[0]
