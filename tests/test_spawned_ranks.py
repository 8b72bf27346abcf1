"""`auditor run` on a script that starts its workers with torch.multiprocessing: each worker audits
itself as a rank (RUN/rank-N/), the launcher's record stays in RUN and names them, and
`auditor report RUN` merges the ranks. Real spawned processes, a real gloo group."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from auditor.analysis.findings.rules import findings
from auditor.analysis.ranks.merged import is_multi_rank, merge_ranks
from auditor.cli import main
from auditor.record.run_folder import load

ROOT = Path(__file__).resolve().parents[1]
PARAMETERS = 4 * (256 * 1024 + 1024 + 1024 * 256 + 256)  # bytes of DDP_SPAWN's model

DDP_SPAWN = """
import os, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def train_step(model, optimizer, batch):
    model(batch).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def worker(rank, world_size, store_path):
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        train_step(model, optimizer, torch.randn(32 * (rank + 1), 256))
    if rank == int(sys.argv[2]):
        raise RuntimeError(f"rank {rank} gave up")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, sys.argv[1]), nprocs=2)
    if len(sys.argv) > 3:  # a second job in the same script
        mp.spawn(worker, args=(2, sys.argv[1] + "-2"), nprocs=2)
"""

FORKED = """
import torch
import torch.multiprocessing as mp


def train_step(index):
    return float(torch.ones(1000).sum())


def work(index):
    return train_step(index)


if __name__ == "__main__":
    mp.start_processes(work, nprocs=2, start_method="fork")
"""


def audit_run(tmp_path, script_text: str, *args: str, options=("--live-tensors",)) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(script_text)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run([sys.executable, "-m", "auditor", "run", *options, "--run-dir", str(tmp_path / "run"),
                           "--stage", "job:train_step", str(script), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)


def record(folder: Path) -> dict:
    return json.loads((folder / "run.json").read_text())


@pytest.mark.slow
def test_spawned_workers_audit_themselves_as_ranks_and_merge(tmp_path):
    done = audit_run(tmp_path, DDP_SPAWN, str(tmp_path / "store"), "-1", options=("--live-tensors", "--census"))
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "run"
    ranks = [record(run / f"rank-{n}") for n in (0, 1)]
    for n, rank in enumerate(ranks):
        # the script's own function, staged in the worker as in a single process
        assert [s["path"] for s in rank["stages"]] == ["train_step", "train_step#2", "train_step#3"]
        assert rank["rank"]["rank"] == n and rank["rank"]["world_size"] == 2
        assert rank["rank"]["source"] == "torch.distributed" and rank["rank"]["backend"] == "gloo"
        assert rank["options"]["live_tensors"] and rank["exit"]["status"] == "ok"
        assert rank["stages"][0]["live_tensors"]["peak"] > 1024 * 256 * 4 * 2  # the weights and more
    assert ranks[0]["rank"]["run_id"] == ranks[1]["rank"]["run_id"]  # one spawn
    launcher = record(run)
    assert launcher["spawned"] == [{"folder": ".", "nprocs": 2, "start_method": "spawn", "audited": True}]
    assert not any("never called" in w for w in launcher["warnings"])  # the workers called it
    assert f"merged report: auditor report {run}" in done.stderr.replace("\n", "")

    assert is_multi_rank(run)
    merged = merge_ranks(run)
    assert [(r.rank, r.finished) for r in merged.ranks] == [(0, True), (1, True)]
    assert merged.launcher is not None and merged.launcher.rss_peak == launcher["peak"]["rss"]
    # DDP's gradient buckets, a buffer as large as the gradients, are the communication buffers
    for row in merged.stages:
        for reading in row.ranks.values():
            assert PARAMETERS <= reading.communication <= 1.01 * PARAMETERS, (row.path, reading.communication)
    buckets = [f for f in findings(load(run / "rank-0"))
               if f.rule == "full-copy" and "DDP gradient buckets" in f.statement]
    assert buckets and "gradient_as_bucket_view=True" in buckets[0].remedy
    report = subprocess.run([sys.executable, "-m", "auditor", "report", str(run)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    text = (run / "report.md").read_text()
    assert text.startswith("# Multi-rank memory report: job (2 ranks)")
    assert "Spawned by the script's own process with torch.multiprocessing (start method spawn)" in text
    assert f"auditor report {run / 'run.json'}" in text
    assert "| `train_step#3` |" in text
    # the launcher's own report says where the work ran
    assert main(["report", str(run / "run.json"), "-o", str(tmp_path / "launcher.md")]) == 0
    assert "spawned 2 worker(s) with torch.multiprocessing, audited as ranks in `rank-N` of this run folder" in (
        tmp_path / "launcher.md").read_text()


@pytest.mark.slow
def test_a_failed_worker_keeps_its_record_and_the_scripts_exit_status(tmp_path):
    done = audit_run(tmp_path, DDP_SPAWN, str(tmp_path / "store"), "1")
    plain = subprocess.run([sys.executable, str(tmp_path / "job.py"), str(tmp_path / "store-plain"), "1"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == plain.returncode == 1
    assert "RuntimeError: rank 1 gave up" in done.stderr
    assert f'File "{ROOT / "auditor"}' not in done.stderr  # the launcher's and worker's tracebacks as python's
    failed = record(tmp_path / "run" / "rank-1")
    assert failed["exit"]["status"] == "failed" and "rank 1 gave up" in failed["exit"]["error"]
    assert [s["path"] for s in failed["stages"]] == ["train_step", "train_step#2", "train_step#3"]
    # without a census the buckets are still named, by the DDP call that allocated them
    merged = merge_ranks(tmp_path / "run")
    assert PARAMETERS <= merged.stages[0].ranks[0].communication <= 1.01 * PARAMETERS


@pytest.mark.slow
def test_a_second_spawn_writes_beside_the_first(tmp_path):
    done = audit_run(tmp_path, DDP_SPAWN, str(tmp_path / "store"), "-1", "again", options=())
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "run"
    assert [e["folder"] for e in record(run)["spawned"]] == [".", "spawn-2"]
    assert is_multi_rank(run) and is_multi_rank(run / "spawn-2")
    assert ([s["path"] for s in record(run / "spawn-2" / "rank-1")["stages"]]
            == ["train_step", "train_step#2", "train_step#3"])


def test_forked_workers_are_not_audited_and_the_launcher_says_so(tmp_path):
    done = audit_run(tmp_path, FORKED, options=())
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "run"
    assert not list(run.glob("rank-*"))
    assert record(run)["spawned"] == [{"folder": None, "nprocs": 2, "start_method": "fork", "audited": False}]
    assert "start_method='fork' are not audited" in done.stdout + done.stderr
    assert not is_multi_rank(run)
    assert main(["report", str(run), "-o", str(tmp_path / "launcher.md")]) == 0
    assert "started 2 worker(s) with torch.multiprocessing (start method fork), not audited" in (
        tmp_path / "launcher.md").read_text()
