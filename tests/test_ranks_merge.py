"""The merged report of a multi-rank run (auditor.analysis.ranks.merged, renderers.ranks_markdown) on
real torchrun records (gloo, 2 ranks) and copies of them: live-tensor peaks outside any stage,
runs without stages, a rank with no readable record, a killed rank's partial peak, a failed
rank's error."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from auditor.analysis.ranks.merged import merge_ranks
from auditor.analysis.run.live_tensor_peak import live_tensor_high
from auditor.analysis.run.unstaged import peak_place
from auditor.cli import main
from auditor.facts import units
from auditor.record.run_folder import load
from auditor.renderers.ranks_markdown import render

ROOT = Path(__file__).parents[1]
CLONES_MIB = 24

# Rank 0 holds CLONES_MIB of tensors before the first stage (outside every stage), then frees
# them; `work`, run twice, holds 1 MiB on each rank; rank 1 fails after the last collective.
SCRIPT = f"""
import contextlib, sys
import torch, torch.distributed as dist
import auditor
dist.init_process_group("gloo")
rank = dist.get_rank()
staged = "--no-stages" not in sys.argv
if rank == 0:
    clones = [torch.ones(2**20 // 4) for _ in range({CLONES_MIB})]
    del clones
for _ in range(2):
    with auditor.stage("work") if staged else contextlib.nullcontext():
        x = torch.ones(2**18)
        dist.all_reduce(x)
dist.barrier()
if rank == 1:
    raise RuntimeError("rank 1: simulated loader failure")
dist.destroy_process_group()
"""


def _torchrun(folder: Path, script: Path, *args: str) -> Path:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           "2", "-m", "auditor", "run", "--live-tensors", "--run-dir", str(folder),
                           str(script), *args],
                          cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode != 0, done.stderr[-3000:]  # rank 1 failed, torchrun says so
    assert (folder / "rank-0" / "run.json").exists() and (folder / "rank-1" / "run.json").exists(), \
        done.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("ranks_merge")
    script = base / "clones.py"
    script.write_text(SCRIPT)
    return {"staged": _torchrun(base / "staged", script),
            "no stages": _torchrun(base / "unstaged", script, "--no-stages")}


def _copy(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    (to / "report.md").unlink(missing_ok=True)
    return to


@pytest.mark.slow
def test_a_live_tensor_peak_outside_every_stage_is_the_ranks_peak(runs):
    folder = runs["staged"]
    records = {rank: load(folder / f"rank-{rank}") for rank in (0, 1)}
    high = live_tensor_high(records[0])
    assert high is not None and high[0] >= CLONES_MIB * 2**20 and "no stage covers" in high[1]
    merged = merge_ranks(folder)
    zero = merged.ranks[0]
    assert zero.live_peak == high[0] and zero.live_peak_stage is None and zero.live_peak_place == high[1]
    assert merged.live_peak.rank == 0 and merged.live_peak.bytes == high[0]
    assert merged.imbalance.live.max_rank == 0 and merged.imbalance.live.ratio > 5
    text = render(merged)
    assert f"Highest live tensors: {units.size(high[0])} on rank 0, {high[1]}." in text
    assert "the same on every rank" not in text.split("## Ranks")[0].split("peak live tensors")[-1]
    # the table places both peaks as the summary does (rank 0: before the first stage)
    row = next(line for line in text.splitlines() if line.startswith("| 0 |"))
    assert f"| {peak_place(records[0]).phrase} |" in row or f"| `{records[0].peak.stage}` |" in row
    assert "before the first stage (`work`)" in row and "| - |" not in row.split("|", 6)[-1]


@pytest.mark.slow
def test_a_run_without_stages_has_its_live_peak_and_says_the_meter_was_on(runs):
    merged = merge_ranks(runs["no stages"])
    assert merged.stages == []
    assert [r.live_peak is not None for r in merged.ranks] == [True, True]
    assert merged.ranks[0].live_peak >= CLONES_MIB * 2**20
    assert merged.communication.metered
    text = render(merged)
    assert "Not measured" not in text and "meter was off" not in text
    assert "with no stage open" in text
    row = next(line for line in text.splitlines() if line.startswith("| 0 |"))
    assert units.size(merged.ranks[0].live_peak) in row


@pytest.mark.slow
def test_the_meter_off_is_still_said(runs, tmp_path):
    """The "not measured" text stays for a run whose record says the meter was off."""
    import json
    copy = _copy(runs["no stages"], tmp_path / "run")
    for rank in (0, 1):
        path = copy / f"rank-{rank}" / "run.json"
        record = json.loads(path.read_text())
        record["probes"]["live_tensors"] = {"state": "off"}
        for interval in record.get("unstaged") or []:
            interval["live_tensors"] = None
        path.write_text(json.dumps(record))
    merged = merge_ranks(copy)
    assert not merged.communication.metered
    assert "Not measured: the live-tensor meter was off" in render(merged)


@pytest.mark.slow
@pytest.mark.parametrize("events", ["", '{"event": "stage_started"}\n'])
def test_a_rank_with_no_readable_record_leaves_the_others_reported(runs, tmp_path, events):
    copy = _copy(runs["staged"], tmp_path / "run")
    (copy / "rank-1" / "run.json").unlink()
    (copy / "rank-1" / "events.jsonl").write_text(events)
    merged = merge_ranks(copy)
    assert [r.rank for r in merged.ranks] == [0]
    assert list(merged.unreadable) == [1] and merged.missing_ranks == []
    assert main(["report", str(copy)]) == 0
    text = (copy / "report.md").read_text()
    line = next(line for line in text.splitlines() if "No readable record from rank 1" in line)
    assert ("empty" in line) if not events else ("run_started" in line)
    assert str(tmp_path) not in line  # the rank folder by its name, not the machine's path
    assert units.size(merged.ranks[0].rss_peak) in text


@pytest.mark.slow
def test_a_killed_ranks_peaks_are_marked_partial_in_the_imbalance(runs, tmp_path):
    """Rank 1 killed inside its second `work`: its run's peaks and its `work` readings (the first
    call's) are what it reached before it stopped, lower bounds."""
    copy = _copy(runs["staged"], tmp_path / "run")
    (copy / "rank-1" / "run.json").unlink()
    events = (copy / "rank-1" / "events.jsonl").read_text().splitlines()
    cut = [i for i, line in enumerate(events) if '"stage_finished"' in line and '"work"' in line][-1]
    (copy / "rank-1" / "events.jsonl").write_text("\n".join(events[:cut]) + "\n")
    merged = merge_ranks(copy)
    assert merged.unfinished == [1]
    work = next(row for row in merged.stages if row.path == "work")
    assert work.ranks[1].status == "open" and work.ranks[1].rss_peak is not None
    assert work.rss.partial == work.live.partial == [1]
    assert merged.imbalance.rss.partial == merged.imbalance.live.partial == [1]
    text = render(merged)
    summary = text.split("## Ranks")[0]
    lines = [line for line in summary.splitlines() if line.startswith("- Imbalance")]
    assert len(lines) == 2
    for line in lines:
        assert "rank 1 unfinished" in line and "lower bound" in line, line
    imbalance = text.split("## Imbalance across ranks")[1]
    rows = [line for line in imbalance.splitlines() if line.startswith(("| `work`", "| **the run**"))]
    assert len(rows) == 2 and all(row.count("(rank 1 partial)") == 2 for row in rows), rows
    assert "lower bound" in imbalance
    # a finished rank's figures are not marked
    assert merge_ranks(runs["staged"]).imbalance.rss.partial == []


@pytest.mark.slow
def test_a_failed_ranks_error_is_shown_next_to_it(runs):
    merged = merge_ranks(runs["staged"])
    assert merged.ranks[1].status == "failed"
    assert merged.ranks[1].error == "RuntimeError: rank 1: simulated loader failure"
    assert merged.ranks[0].error is None
    text = render(merged)
    ranks = text.split("## Ranks")[1].split("## Stages")[0]
    assert "Rank 1 failed: RuntimeError: rank 1: simulated loader failure" in ranks
