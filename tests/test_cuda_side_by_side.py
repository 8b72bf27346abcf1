"""The CPU-against-CUDA side by side (benchmarks/cuda_side_by_side.py), on two real small CPU runs of
`auditor gradprobe` (baseline and lean) standing in for each device; the CUDA side is a copy of
them with the CUDA probe's stage readings, as a CUDA run writes them (no GPU here). Also: the
committed dry run's report is made again from its records byte for byte."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from auditor.facts.units import mib
from auditor.record.run_folder import load
from auditor.record.schema import CudaReadings
from auditor.renderers.device_side_by_side_markdown import render
from auditor.report_models.device_side_by_side import SideBySideError, device_side_by_side

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--arch", "tinystories-33m", "--layers", "1", "--hidden", "64", "--heads", "2", "--intermediate", "128",
        "--vocab", "512", "--seq-len", "16", "--threads", "1", "--no-trace", "--no-memray"]
GiB = 2**30

pytestmark = pytest.mark.slow


def _benchmark():
    spec = importlib.util.spec_from_file_location("cuda_side_by_side", ROOT / "benchmarks" / "cuda_side_by_side.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory) -> dict[str, Path]:
    """Two real runs of the job on this CPU: the baseline and lean, one configuration."""
    folder = tmp_path_factory.mktemp("side-by-side")
    runs = {}
    for variant in ("baseline", "lean"):
        run = folder / f"cpu-{variant}"
        done = subprocess.run([sys.executable, "-m", "auditor", "gradprobe", *TINY, "--variant", variant,
                               "--run-dir", str(run), "-o", str(folder / f"{variant}.md")],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr
        runs[variant] = run
    return runs


def as_cuda(folder: Path, into: Path, gib_per_stage: int = 1) -> Path:
    """A copy of a CPU run as a CUDA run's record reads: the job's device, the probe's device
    name, and allocator readings at every stage (stage i: allocated i GiB, reserved i+1, peak i+2)."""
    shutil.copytree(folder, into)
    record = json.loads((into / "run.json").read_text())
    record["device"] = "cuda:0 (NVIDIA H200)"
    record["workload"]["settings"]["device"] = "cuda"
    for index, stage in enumerate(record["stages"], 1):
        stage["cuda"] = CudaReadings(allocated_start=0, allocated_end=index * gib_per_stage * GiB,
                                     reserved_end=(index + 1) * gib_per_stage * GiB,
                                     peak_allocated=(index + 2) * gib_per_stage * GiB).to_json()
    (into / "run.json").write_text(json.dumps(record))
    return into


def four_runs(cpu_runs, tmp_path) -> list[str]:
    return [str(cpu_runs["baseline"]), str(cpu_runs["lean"]),
            str(as_cuda(cpu_runs["baseline"], tmp_path / "cuda-baseline")),
            str(as_cuda(cpu_runs["lean"], tmp_path / "cuda-lean"))]


def test_the_report_sets_each_run_s_own_figures_side_by_side(cpu_runs, tmp_path):
    runs = four_runs(cpu_runs, tmp_path)
    records = [load(run) for run in runs]
    report = device_side_by_side(records, runs)
    text = render(report, "the command")
    table = text.split("## Memory and time")[1].split("\n\n")[1].splitlines()
    assert table[0].startswith("| run | device | variant | peak RSS | peak RSS in | CUDA peak allocated |")
    stages = len(records[0].stages)
    for line, record, run in zip(table[2:], records, runs, strict=False):
        name, *cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert name == f"`{Path(run).name}`"
        settings = record.annotations["workload"]["settings"]
        place = record.peak.stage or f"after {record.peak.where.after} (unstaged)"
        assert cells[:4] == [settings["device"], settings["variant"], mib(record.peak.rss), f"`{place}`"]
        if settings["device"] == "cpu":
            assert cells[4:7] == ["no CUDA"] * 3
        else:  # the highest peak, the largest reserved, the allocated of the stage that ends last
            last = 1 + max(range(stages), key=lambda i: record.stages[i].end_s)
            assert cells[4:7] == [mib((stages + 2) * GiB), mib((stages + 1) * GiB), mib(last * GiB)]
        prune = next(s for s in record.stages if s.path == "prune")
        assert cells[7] == f"{prune.end_s - prune.start_s:,.2f} s"
        assert cells[9] == f"{record.annotations['result']['pruned']:,}"
        assert cells[10] == f"`{record.annotations['result']['mask_digest'][:12]}`"
    # lean keeps the baseline's decisions: one digest per device, and the same on both here
    assert "- cpu: identical: baseline, lean pruned the same weights (one digest)." in text
    assert "- cuda: identical: baseline, lean pruned the same weights (one digest)." in text
    assert "Read with care" not in text and "Made by `the command`" in text


def test_masks_that_differ_within_a_device_are_said(cpu_runs, tmp_path):
    runs = four_runs(cpu_runs, tmp_path)
    records = [load(run) for run in runs]
    records[3].annotations["result"]["mask_digest"] = "0" * 64  # cuda lean pruned other weights
    text = render(device_side_by_side(records, runs))
    assert "Masks identical within cpu; masks DIFFER within cuda." in text
    assert "- cuda: **DIFFER**: baseline, lean gave 2 different masks." in text
    assert "- across devices: different masks." in text


def test_a_record_without_a_digest_is_not_compared_and_says_so(cpu_runs, tmp_path):
    runs = four_runs(cpu_runs, tmp_path)
    records = [load(run) for run in runs]
    del records[0].annotations["result"]["mask_digest"]  # a record from before the job kept one
    report = device_side_by_side(records, runs)
    text = render(report)
    assert report.devices[0].identical is None and report.across_devices is None
    assert "- cpu: not compared: baseline recorded no mask digest" in text
    assert "baseline on cpu: the record holds no mask digest, so its masks are not compared" in text


def test_runs_of_another_configuration_are_refused_in_one_line(cpu_runs, tmp_path, capsys):
    other = as_cuda(cpu_runs["lean"], tmp_path / "other")
    record = json.loads((other / "run.json").read_text())
    record["workload"]["settings"]["sequence_length"] = 64
    (other / "run.json").write_text(json.dumps(record))
    with pytest.raises(SideBySideError, match="sequence_length 64 against 16"):
        device_side_by_side([load(cpu_runs["baseline"]), load(other)], ["a", "b"])
    status = _benchmark().main([str(cpu_runs["baseline"]), str(other), "-o", str(tmp_path / "x.md")])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "another configuration" in err
    assert not (tmp_path / "x.md").exists()
    assert _benchmark().main([str(tmp_path / "no-such-run"), "-o", str(tmp_path / "x.md")]) == 2


def test_the_committed_dry_run_report_is_made_again_from_its_records(monkeypatch):
    """reports/cuda-check-dry-run.md: benchmarks/cuda_check.sh's dry run (DEVICE=cpu), its side by side."""
    monkeypatch.chdir(ROOT)
    report = Path("reports/cuda-check-dry-run.md")
    runs = [f"reports/cuda-check-dry-run-runs/gradprobe-{side}-{variant}"
            for side in ("gpu", "cpu") for variant in ("baseline", "lean")]
    benchmark = _benchmark()
    made = render(benchmark.side_by_side(runs), benchmark.command_line(runs, str(report)))
    assert made == report.read_text()


def test_a_copy_is_not_the_original(cpu_runs, tmp_path):
    """The CUDA stand-in changes only what a CUDA run changes (guards as_cuda itself)."""
    copied = load(as_cuda(cpu_runs["baseline"], tmp_path / "c"))
    original = load(cpu_runs["baseline"])
    assert copied.peak.rss == original.peak.rss and copied.annotations["result"] == original.annotations["result"]
    assert original.stages[0].cuda is None and copied.stages[0].cuda is not None
    assert copied.annotations["workload"]["settings"]["device"] == "cuda"
    assert original.annotations["workload"]["settings"]["device"] == "cpu"
