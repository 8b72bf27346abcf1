"""Committed reports whose records are committed beside them are made again from those records
alone, byte for byte, in a fresh copy of the tracked files (as a fresh clone would)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from auditor.cli import main

ROOT = Path(__file__).resolve().parents[1]
REPORTS = {  # report -> the record folders `auditor report` is given
    "train-step-cpu.md": sorted(f"reports/train-step-cpu-runs/{p.name}"
                                for p in (ROOT / "reports" / "train-step-cpu-runs").iterdir() if p.is_dir()),
    "multi-rank-cpu-2-ranks.md": ["reports/multi-rank-cpu-runs/2-ranks"],
    "multi-rank-cpu-4-ranks.md": ["reports/multi-rank-cpu-runs/4-ranks"],
    # examples/ddp_spawn_train.py under `auditor run`: its spawned workers as ranks, beside their launcher
    "multi-rank-spawn-cpu.md": ["reports/multi-rank-spawn-cpu-runs/run"],
    # examples/dataloader_workers.py under `auditor run`: its DataLoader workers' memory in the banner
    "dataloader-workers-cpu.md": ["reports/dataloader-workers-cpu-runs/run"],
    "gradprobe-tinystories-33m.md": ["reports/gradprobe-tinystories-33m-runs/audit"],  # `make reports`'
    "example-hessian-pruner.md": ["reports/example-hessian-pruner-runs/run"],  # docs/own-script.md's walkthrough
}
COMPARISONS = {  # report -> its comparison record, rendered again by `auditor compare --from`
    "compare-tinystories-33m.md": "reports/compare-tinystories-33m.json",
}


RENDERED = {  # report -> (the benchmark script's arguments that render it again, the records it reads)
    "rank-projection-cpu.md": (["benchmarks/rank_projection.py", "render",
                                "--run-dir", "reports/rank-projection-cpu-runs"],
                               ["reports/rank-projection-cpu-runs"]),
    "projection-validation-matrix.md": (["benchmarks/projection_validation_matrix.py", "--from",
                                         "reports/projection-validation-matrix.json"],
                                        ["reports/projection-validation-matrix.json"]),
    "reliability.md": (["benchmarks/reliability.py", "--from", "reports/reliability.json"],
                       ["reports/reliability.json"]),
    "rss-band-validation.md": (["benchmarks/rss_band_validation.py", "--from", "reports/rss-band-validation.json"],
                               ["reports/rss-band-validation.json"]),
    # third-party-shaped programs against themselves run as written at the target size (docs/projection.md)
    "projection-as-written.md": (["benchmarks/projection_as_written.py",
                                  "--from", "reports/projection-as-written.json"],
                                 ["reports/projection-as-written.json"]),
    # identical runs of one workload: the spread of each figure a finding's rule compares, the findings per run
    "findings-stability.md": (["benchmarks/findings_stability.py", "--from", "reports/findings-stability.json"],
                              ["reports/findings-stability.json"]),
    "peak-composition-overhead.md": (["benchmarks/peak_composition_overhead.py", "--from",
                                      "reports/peak-composition-overhead.json"],
                                     ["reports/peak-composition-overhead.json"]),
    # the streaming column's 7B figure comes from the streaming report's record
    "variants-at-mistral-7b.md": (["benchmarks/variants_at_7b.py", "--from", "reports/variants-at-mistral-7b.json"],
                                  ["reports/variants-at-mistral-7b.json", "reports/gradprobe-streaming.json"]),
    # benchmarks/cuda_check.sh's dry run (DEVICE=cpu): its GradProbe side by side (docs/cuda.md)
    "cuda-check-dry-run.md": (["benchmarks/cuda_side_by_side.py",
                               *(f"reports/cuda-check-dry-run-runs/gradprobe-{side}-{variant}"
                                 for side in ("gpu", "cpu") for variant in ("baseline", "lean"))],
                              ["reports/cuda-check-dry-run-runs"]),
}
FILLED = {  # hand-written report -> (the scripts' arguments that fill its measured blocks, the records they read)
    "multi-rank-cpu.md": ([["benchmarks/multi_rank_cpu.py"]], ["reports/multi-rank-cpu-runs"]),
    "gradprobe-baseline-tinystories-33m.md": (
        [["benchmarks/gradprobe_baseline.py", "--from", "reports/gradprobe-baseline-tinystories-33m.json"]],
        ["reports/gradprobe-baseline-tinystories-33m.json"]),
    "gradprobe-variants-tinystories-33m.md": (
        [["benchmarks/gradprobe_variants.py", "--from", "reports/gradprobe-variants-tinystories-33m.json"]],
        ["reports/gradprobe-variants-tinystories-33m.json"]),
    "sharded-gradprobe-cpu.md": (
        [["benchmarks/sharded_gradprobe.py", "table", "--run-dir",
          *(f"reports/sharded-gradprobe-cpu-runs/{run}" for run in ("tinystories-33m", "mistral-8x512"))]],
        [f"reports/sharded-gradprobe-cpu-runs/{run}" for run in ("tinystories-33m", "mistral-8x512")]),
    "projection-validation-variants.md": ([["benchmarks/projection_validation_runs.py", "fill"]],
                                          ["reports/projection-validation-variants-runs"]),
    "projection-validation.md": ([["benchmarks/projection_validation_runs.py", "fill"]],
                                 ["reports/projection-validation-runs"]),
    "gradprobe-streaming.md": ([["benchmarks/gradprobe_streaming.py", "--from", "reports/gradprobe-streaming.json"]],
                               ["reports/gradprobe-streaming.json"]),
    "audit-overhead.md": (
        [["benchmarks/audit_overhead.py", "--from", "reports/audit-overhead.json"],
         ["benchmarks/stage_cost_ab.py", "--from", "reports/audit-overhead-stage-cost.json"]],
        ["reports/audit-overhead.json", "reports/audit-overhead-stage-cost.json"]),
}
NOT_YET: dict[str, str] = {}  # committed reports whose measured parts have no record yet, and why


def test_every_committed_report_is_made_again_from_records_or_says_why_not():
    made = {*REPORTS, *COMPARISONS, *RENDERED, *FILLED}
    reports = {path.name for path in (ROOT / "reports").glob("*.md")} - {"README.md"}  # README: the index
    assert not made & set(NOT_YET), "a report made again is not also listed as not yet"
    assert reports - made - set(NOT_YET) == set(), "a new report needs its records and a line above"
    assert set(NOT_YET) <= reports


def _tracked_copy(folder: str, into: Path) -> None:
    listed = subprocess.run(["git", "ls-files", folder], cwd=ROOT, capture_output=True, text=True, check=True)
    for name in listed.stdout.split():
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, into / name)


def _fresh_copy(paths: list[str], into: Path, monkeypatch) -> None:
    """The tracked files under `paths` in a new git repository (the report says what git ignores)."""
    if not (ROOT / ".git").exists():
        pytest.skip("needs the repository's file list (git)")
    subprocess.run(["git", "init", "-q"], cwd=into, check=True)
    shutil.copy2(ROOT / ".gitignore", into / ".gitignore")
    for path in paths:
        _tracked_copy(path, into)
    monkeypatch.chdir(into)


@pytest.mark.parametrize("report", sorted(REPORTS))
def test_a_committed_report_is_made_again_from_its_records(report, tmp_path, monkeypatch):
    _fresh_copy(REPORTS[report], tmp_path, monkeypatch)
    assert main(["report", *REPORTS[report], "-o", f"reports/{report}"]) == 0
    assert (tmp_path / "reports" / report).read_text() == (ROOT / "reports" / report).read_text()


@pytest.mark.parametrize("report", sorted(COMPARISONS))
def test_a_committed_comparison_is_made_again_from_its_record(report, tmp_path, monkeypatch):
    _fresh_copy([COMPARISONS[report]], tmp_path, monkeypatch)
    assert main(["compare", "--from", COMPARISONS[report], "-o", f"reports/{report}"]) == 0
    assert (tmp_path / "reports" / report).read_text() == (ROOT / "reports" / report).read_text()
    assert (tmp_path / COMPARISONS[report]).read_text() == (ROOT / COMPARISONS[report]).read_text()


@pytest.mark.parametrize("report", sorted(RENDERED))
def test_a_committed_benchmark_report_is_rendered_again_from_its_record(report, tmp_path, monkeypatch):
    (script, *arguments), records = RENDERED[report]
    _fresh_copy(records, tmp_path, monkeypatch)
    done = subprocess.run([sys.executable, str(ROOT / script), *arguments, "-o", f"reports/{report}"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "reports" / report).read_text() == (ROOT / "reports" / report).read_text()


def _committed_records() -> list[str]:
    if not (ROOT / ".git").exists():
        return []
    listed = subprocess.run(["git", "ls-files", "reports"], cwd=ROOT, capture_output=True, text=True, check=True)
    return sorted({str(Path(name).parent) for name in listed.stdout.split()
                   if name.endswith("/run.json") and (ROOT / Path(name).parent / "events.jsonl").is_file()})


def test_every_committed_run_json_is_its_event_log_assembled():
    # run.json is exactly assemble(events): auditor run, train-step, torchrun ranks, gradprobe jobs
    import json

    from auditor.record.run_folder import rebuild
    folders = _committed_records()
    if not folders:
        pytest.skip("needs the repository's file list (git)")
    assert len(folders) >= 30
    for folder in folders:
        assert rebuild(ROOT / folder, write=False) == json.loads((ROOT / folder / "run.json").read_text()), folder


@pytest.mark.parametrize("report", sorted(FILLED))
def test_the_measured_blocks_of_a_hand_written_report_are_made_again_from_its_records(report, tmp_path, monkeypatch):
    """The prose is copied as it is; every block the script fills must come out as committed."""
    commands, records = FILLED[report]
    _fresh_copy([f"reports/{report}", *records], tmp_path, monkeypatch)
    text = (tmp_path / "reports" / report).read_text()
    assert "<!-- begin " in text, "a report the script fills marks its blocks"
    emptied = re.sub(r"(<!-- begin [^>]*-->\n).*?(<!-- end )", r"\1\2", text, flags=re.S)
    (tmp_path / "reports" / report).write_text(emptied)  # what the blocks hold comes from the records alone
    for script, *arguments in commands:
        done = subprocess.run([sys.executable, str(ROOT / script), *arguments, "-o", f"reports/{report}"],
                              cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "reports" / report).read_text() == (ROOT / "reports" / report).read_text()
