"""Multi-rank audits: each rank's record in RUN/rank-N/ under a real torchrun (gloo, 2 ranks)
and torch.multiprocessing spawn, one merged report, killed ranks, reused folders refused."""
from __future__ import annotations

import gc
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import one_error_line

import auditor
from auditor.analysis.ranks.merged import COLLECTIVE_WRAPPERS, collective_bytes, is_multi_rank, merge_ranks
from auditor.analysis.run.unstaged import peak_place
from auditor.cli import UsageError, main
from auditor.cli.run_dir import check_new_run_dir
from auditor.facts import units
from auditor.record.run_folder import load
from auditor.record.schema import AtPeak, AtPeakRow

ROOT = Path(__file__).parents[1]
EXAMPLE = ROOT / "examples" / "multi_rank_cpu.py"
HEAVY_MIB = 48


def _launch(command: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run(command, cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def torchrun_folder(tmp_path_factory) -> Path:
    """A real 2-rank torchrun of the example under `python -m auditor run`; rank 1 holds more."""
    folder = tmp_path_factory.mktemp("ranks") / "run"
    _launch([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
             "-m", "auditor", "run", "--live-tensors", "--run-dir", str(folder), str(EXAMPLE),
             "--heavy-rank", "1", "--extra-mib", str(HEAVY_MIB)])
    return folder


@pytest.mark.slow
def test_torchrun_writes_one_record_per_rank(torchrun_folder):
    assert sorted(p.name for p in torchrun_folder.iterdir()) == ["rank-0", "rank-1"]
    for rank in (0, 1):
        record = load(torchrun_folder / f"rank-{rank}")
        assert record.exit.status == "ok"
        identity = record.rank
        assert (identity.rank, identity.world_size, identity.local_rank) == (rank, 2, rank)
        assert identity.host and identity.source == "torch.distributed"  # the group, once made
        assert identity.backend == "gloo"
        assert [s.path for s in record.stages] == [
            "build", "all_reduce", "forward", "backward", "gradient_all_reduce", "step"]


@pytest.mark.slow
def test_merged_report_equals_each_ranks_record_and_names_the_peak_rank(torchrun_folder, tmp_path):
    merged = merge_ranks(torchrun_folder)
    records = {rank: load(torchrun_folder / f"rank-{rank}") for rank in (0, 1)}
    for row in merged.stages:
        for rank, record in records.items():
            stage = next(s for s in record.stages if s.path == row.path)
            assert row.ranks[rank].rss_peak == stage.rss.peak
            assert row.ranks[rank].live_peak == stage.live_tensors.peak
    assert [r.rss_peak for r in merged.ranks] == [records[r].peak.rss for r in (0, 1)]
    # rank 1's forward keeps HEAVY_MIB more: it peaks, there and over the run
    forward = next(row for row in merged.stages if row.path == "forward")
    assert forward.live.max_rank == 1 and forward.live.spread > 0.9 * HEAVY_MIB * 2**20
    assert forward.rss.max_rank == 1
    assert merged.peak.rank == 1 and merged.peak.stage == records[1].peak.stage
    assert merged.imbalance.live.ratio > 1.5
    # the functional all_reduce's output is a storage c10d created: a communication buffer
    comm = {(e.stage, e.rank): e.bytes for e in merged.communication.stages}
    assert comm[("all_reduce", 0)] == comm[("all_reduce", 1)] == 512 * 512 * 4  # its output, once
    out = tmp_path / "merged.md"
    assert main(["report", str(torchrun_folder), "-o", str(out)]) == 0
    text = out.read_text()
    assert f"Global peak RSS: **{units.size(records[1].peak.rss)} on rank 1**, {peak_place(records[1]).phrase}." in text
    for record in records.values():
        for stage in record.stages:
            assert units.size(stage.rss.peak) in text
            assert units.size(stage.live_tensors.peak) in text


@pytest.mark.slow
def test_a_killed_rank_renders_from_its_event_log_marked_unfinished(torchrun_folder, tmp_path):
    copy = tmp_path / "run"
    for rank in (0, 1):
        (copy / f"rank-{rank}").mkdir(parents=True)
        events = (torchrun_folder / f"rank-{rank}" / "events.jsonl").read_text().splitlines()
        if rank == 1:  # killed during backward: what its log holds then, and no run.json
            cut = next(i for i, line in enumerate(events)
                       if '"stage_finished"' in line and '"path":"backward"' in line)
            events = events[:cut]
        else:
            (copy / "rank-0" / "run.json").write_text((torchrun_folder / "rank-0" / "run.json").read_text())
        (copy / f"rank-{rank}" / "events.jsonl").write_text("\n".join(events) + "\n")
    merged = merge_ranks(copy)
    killed = merged.ranks[1]
    assert (killed.finished, killed.status, killed.open_stages) == (False, "unfinished", ["backward"])
    assert merged.ranks[0].finished and merged.unfinished == [1]
    assert [row.path for row in merged.stages][:4] == ["build", "all_reduce", "forward", "backward"]
    assert merged.stages[3].ranks[1].status == "open"
    assert main(["report", str(copy)]) == 0
    text = (copy / "report.md").read_text()
    assert "**Unfinished: rank 1**" in text and "(open)" in text
    assert not (copy / "rank-1" / "run.json").exists()  # rendered, nothing written


KILLED_RANK = """
import os, signal
import torch, torch.distributed as dist
import auditor
dist.init_process_group("gloo")
with auditor.stage("work"):
    dist.all_reduce(torch.ones(1000))
    if dist.get_rank() == 1:
        with auditor.stage("dies"):
            os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
"""


@pytest.mark.slow
def test_a_rank_killed_under_torchrun_is_reported_unfinished(tmp_path):
    script, folder = tmp_path / "killed.py", tmp_path / "run"
    script.write_text(KILLED_RANK)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           "2", "-m", "auditor", "run", "--run-dir", str(folder), str(script)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0  # torchrun reports the killed rank
    assert not (folder / "rank-1" / "run.json").exists()
    merged = merge_ranks(folder)
    assert [(r.rank, r.finished) for r in merged.ranks] == [(0, True), (1, False)]
    assert merged.ranks[1].open_stages == ["work", "work/dies"]
    assert main(["report", str(folder)]) == 0
    assert "**Unfinished: rank 1**" in (folder / "report.md").read_text()


@pytest.mark.slow
def test_spawned_workers_each_write_their_rank(tmp_path):
    folder = tmp_path / "spawned"
    _launch([sys.executable, str(ROOT / "examples" / "multi_rank_spawn.py"), str(folder), "--ranks", "2"])
    merged = merge_ranks(folder)
    assert [(r.rank, r.world_size, r.source, r.backend) for r in merged.ranks] == [
        (0, 2, "torch.distributed", "gloo"), (1, 2, "torch.distributed", "gloo")]
    # rank 1's batch is twice rank 0's: its forward_backward holds more live tensors
    row = next(row for row in merged.stages if row.path == "forward_backward")
    assert row.live.max_rank == 1 and row.live.spread > 0


# -- folders: shared by ranks, never reused ------------------------------------------------

@pytest.fixture
def as_rank(monkeypatch):
    def become(rank: int, world: int = 2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
    for name in ("RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    return become


def _audited(out, name="r") -> Path:
    with auditor.Audit(out=out, name=name) as audit, auditor.stage("work"):
        bytearray(1 << 20)
    return audit.folder


def test_a_rank_writes_its_own_folder_beside_the_other_ranks(tmp_path, as_rank):
    shared = tmp_path / "run"
    as_rank(1)
    assert _audited(shared) == shared / "rank-1"
    as_rank(0)
    assert _audited(shared) == shared / "rank-0"  # rank 1's folder is no reuse
    record = load(shared / "rank-0")
    assert record.rank.rank == 0 and record.rank.source == "environment"
    assert record.rank.read_at == "start"
    assert is_multi_rank(shared) and merge_ranks(shared).missing_ranks == []


def test_a_peak_after_the_last_stage_is_placed_as_its_rank_s_report_places_it(tmp_path, as_rank):
    shared = tmp_path / "run"
    gc.collect()  # earlier tests' garbage, freed between the two "ranks" of this one process, lowers RSS
    for rank in (0, 1):
        as_rank(rank)
        with auditor.Audit(out=shared, name="r"):
            with auditor.stage("work"):
                bytearray(1 << 20)
            held = mmap.mmap(-1, 96 << 20 if rank == 1 else 4096)  # rank 1's peak: after its only stage
            held[::4096] = b"x" * len(held[::4096])  # fresh pages, touched: resident
    merged = merge_ranks(shared)
    assert merged.peak.rank == 1 and merged.peak.stage is None
    assert merged.peak.place == "after the last stage (`work`)" == peak_place(load(shared / "rank-1")).phrase
    out = tmp_path / "merged.md"
    assert main(["report", str(shared), "-o", str(out)]) == 0
    assert "on rank 1**, after the last stage (`work`)." in out.read_text()


def test_reused_folders_are_refused(tmp_path, as_rank, monkeypatch):
    plain = tmp_path / "plain"
    _audited(plain)
    with pytest.raises(ValueError, match="already holds a run record"):  # a plain run, again
        auditor.Audit(out=plain)
    as_rank(0)
    with pytest.raises(ValueError, match="single-process run record"):  # ranks into a plain run's
        auditor.Audit(out=plain)
    shared = tmp_path / "shared"
    _audited(shared)
    with pytest.raises(ValueError, match="already holds a run record"):  # rank 0 again
        auditor.Audit(out=shared)
    with pytest.raises(ValueError, match="the ranks share one run folder"):
        auditor.Audit()
    as_rank(3, world=4)
    _audited(tmp_path / "four")
    as_rank(0)
    with pytest.raises(ValueError, match="earlier run with more ranks"):
        auditor.Audit(out=tmp_path / "four")
    as_rank(1, world=3)
    with pytest.raises(ValueError, match="earlier run of 2 ranks"):  # beside rank 0 of 2
        auditor.Audit(out=shared)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "first")
    as_rank(0)
    _audited(tmp_path / "torchrun")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "second")
    as_rank(1)
    with pytest.raises(ValueError, match="earlier torchrun"):
        auditor.Audit(out=tmp_path / "torchrun")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "first")
    assert auditor.Audit(out=tmp_path / "torchrun").folder == tmp_path / "torchrun" / "rank-1"
    monkeypatch.delenv("RANK")
    with pytest.raises(ValueError, match="multi-rank run"):  # a plain run into the ranks' folder
        auditor.Audit(out=shared)


def test_job_run_dir_is_shared_by_ranks_but_never_reused(tmp_path, as_rank):
    shared = tmp_path / "run"
    (shared / "rank-1").mkdir(parents=True)
    (shared / "rank-1" / "events.jsonl").write_text("{}\n")
    with pytest.raises(UsageError, match="not empty"):
        check_new_run_dir(shared)  # a plain job
    as_rank(0)
    check_new_run_dir(shared)  # rank 0 beside rank 1
    as_rank(1)
    with pytest.raises(UsageError, match="already holds a run record"):
        check_new_run_dir(shared)


def test_auditor_run_refuses_a_multi_rank_folder_for_a_plain_run(tmp_path, as_rank, capsys, monkeypatch):
    shared = tmp_path / "run"
    as_rank(0)
    _audited(shared)
    monkeypatch.delenv("RANK")
    script = tmp_path / "job.py"
    script.write_text("print('ran')\n")
    assert main(["run", "--run-dir", str(shared), str(script)]) == 2
    assert "multi-rank run" in one_error_line(capsys)


def test_a_plain_folder_is_no_multi_rank_run(tmp_path):
    folder = _audited(tmp_path / "plain")
    assert not is_multi_rank(folder)
    assert json.loads((folder / "run.json").read_text()).get("rank") is None


def test_collective_buffers_leave_out_the_wrappers_they_return():
    def row(op, size):
        return AtPeakRow(owner=None, category="other", op=op, bytes=size, tensors=1)
    rows = [row("_c10d_functional::all_reduce", 1000),
            row("_c10d_functional::_wrap_tensor_autograd", 1000),  # no memory of its own
            row("aten::empty", 5000), row(None, 7)]
    assert collective_bytes(AtPeak(bytes=7007, rows=rows)) == 1000
    assert collective_bytes(AtPeak(bytes=7007, rows=rows), COLLECTIVE_WRAPPERS) == 1000
    assert collective_bytes(None) is None  # the live-tensor meter was off
