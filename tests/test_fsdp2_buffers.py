"""FSDP2's communication buffers, found by the library call that made them, named and counted per
stage and rank in the merged report of a real torchrun (2 ranks, gloo) of a user-style script:
a small Llama sharded with `fully_shard` (each decoder layer, then the root), AdamW, three steps.
The bytes are computed by hand from the shapes, and checked against PyTorch's FSDPMemTracker
measuring the same steps in the same run (the script's `--check-memory`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from auditor.analysis.ranks.merged import COLLECTIVE_OUTPUTS, collective_bytes, communication_kinds, merge_ranks
from auditor.cli import main
from auditor.facts import units
from auditor.facts.communication_buffers import DDP_BUCKETS, FSDP2_ALL_GATHER, FSDP2_REDUCE_SCATTER
from auditor.record.run_folder import load
from auditor.record.schema import AtPeak, AtPeakRow

HERE = Path(__file__).parent / "fsdp2_buffers"
SCRIPT = HERE / "train_llama.py"
SOURCE = SCRIPT.read_text().splitlines()
HIDDEN, INTERMEDIATE, VOCAB = 64, 128, 4096  # the script's defaults (intermediate = 2 x hidden)
# Each FSDP2 group's parameters in one flat fp32 buffer; every parameter's first dim is even, so
# sharding over 2 ranks pads nothing.
LAYER_GROUP = 4 * (4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTERMEDIATE + 2 * HIDDEN)  # q k v o, gate up down, 2 norms
ROOT_GROUP = 4 * (2 * VOCAB * HIDDEN + HIDDEN)  # the root's own: embedding, lm_head, final norm
# Within the same run the two meters count the same storages: our peak is FSDPMemTracker's plus the
# few storages it does not track (24 B of position ids and the like). Where the totals differ by
# more, the peaks are different moments and hold different buffers: in the first step our peak is
# in AdamW's first step (its new state and temporaries), FSDPMemTracker's is in the backward.
SAME_MOMENT = 1024


def _line(text: str) -> int:
    return next(n for n, line in enumerate(SOURCE, 1) if text in line)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fsdp2") / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "auditor", "run", "--live-tensors", "--census", "--run-dir", str(folder),
         "--stage", "train_llama:train_step", "--stage", "train_llama:forward_loss", SCRIPT.name,
         "--check-memory", str(folder.parent / "tracker.json")],
        cwd=HERE, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


@pytest.mark.slow
def test_the_merged_report_names_fsdp2_buffers_per_stage_and_rank(run, tmp_path):
    merged = merge_ranks(run)
    kinds = {(e.stage, e.rank): e.kinds for e in merged.communication.stages}
    for rank in (0, 1):
        # forward: the root's all-gather buffer is kept until the first layer's is made
        for stage in ("train_step/forward_loss", "train_step#2/forward_loss#2", "train_step#3/forward_loss#3"):
            assert kinds[stage, rank] == {FSDP2_ALL_GATHER: ROOT_GROUP + LAYER_GROUP}, (stage, rank)
        # the backward's end: the root's unsharded gradients flat in its reduce-scatter input
        for stage in ("train_step#2", "train_step#3"):
            assert kinds[stage, rank] == {FSDP2_REDUCE_SCATTER: ROOT_GROUP}, (stage, rank)
    # named by the program's line that led to FSDP2's call, and the buffer's kind
    step = next(s for s in load(run / "rank-1").stages if s.path == "train_step#2")
    owners = {row.owner: row.bytes for row in step.live_tensors.at_peak.rows}
    backward = f"allocated at train_llama.py:{_line('loss.backward()')} train_step ({FSDP2_REDUCE_SCATTER})"
    assert owners[backward] == ROOT_GROUP
    out = tmp_path / "merged.md"
    assert main(["report", str(run), "-o", str(out)]) == 0
    text = out.read_text()
    size = units.size(ROOT_GROUP)
    assert f"| `train_step#2` | {FSDP2_REDUCE_SCATTER} | {size} | {size} |" in text
    size = units.size(ROOT_GROUP + LAYER_GROUP)
    assert f"| `train_step/forward_loss` | {FSDP2_ALL_GATHER} | {size} | {size} |" in text
    assert "No communication buffer" not in text


@pytest.mark.slow
def test_fsdpmemtracker_sees_the_same_buffers_at_the_same_peak(run):
    for rank in (0, 1):
        tracked = json.loads((run.parent / f"tracker.json.{rank}").read_text())
        steps = [s for s in load(run / f"rank-{rank}").stages
                 if s.path.split("#")[0] == "train_step" and "/" not in s.path]
        assert len(tracked) == len(steps) == 3
        same = 0
        for stage, theirs in zip(steps, tracked, strict=False):
            ours = communication_kinds(stage.live_tensors.at_peak) or {}
            assert stage.live_tensors.peak >= theirs["Total"]  # ours counts every storage it does
            if stage.live_tensors.peak - theirs["Total"] > SAME_MOMENT:
                continue
            same += 1
            assert ours.get(FSDP2_REDUCE_SCATTER, 0) == theirs["_FSDPRefType.REDUCE_SCATTER"], (rank, stage.path)
            assert ours.get(FSDP2_ALL_GATHER, 0) == theirs["_FSDPRefType.ALL_GATHER"], (rank, stage.path)
        assert same >= 2, f"rank {rank}: the two meters' peaks were the same moment in {same} of 3 steps"


def _row(size: int, owner: str | None = None, op: str | None = "aten::empty") -> AtPeakRow:
    return AtPeakRow(owner=owner, category="activations and temporaries", op=op, bytes=size, tensors=1)


def test_each_storage_counts_once_under_one_kind():
    at_peak = AtPeak(bytes=0, rows=[
        _row(100, f"allocated at x.py:3 f ({FSDP2_REDUCE_SCATTER})"),
        _row(10, f"allocated at x.py:4 f ({DDP_BUCKETS})", op="c10d::allreduce_"),  # named: not twice
        _row(7, None, op="_c10d_functional::all_gather_into_tensor"),
        _row(5, None, op="_c10d_functional::_wrap_tensor_autograd"),  # no memory of its own
        _row(1000, "allocated at x.py:5 f"),  # the program's own tensor
    ])
    assert communication_kinds(at_peak) == {FSDP2_REDUCE_SCATTER: 100, DDP_BUCKETS: 10, COLLECTIVE_OUTPUTS: 7}
    assert collective_bytes(at_peak) == 117
    assert communication_kinds(None) is None
