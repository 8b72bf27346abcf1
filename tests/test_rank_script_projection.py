"""A third-party-style FSDP2 training script (tests/third_party_style/fsdp2_train.py: builds its
model in the script, no auditor import) under torchrun with `auditor run --target`: each rank is
traced as itself on torch's fake process group, never contacting the real run's rendezvous, and
its projection says so."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from auditor.analysis.projection.side_by_side import side_by_side
from auditor.record.run_folder import load

HERE = Path(__file__).resolve().parent / "third_party_style"
SIZE = ["--hidden", "128", "--heads", "4", "--intermediate", "344", "--vocab", "1024"]
TARGET = ["--target", "llama-2-7b", "--target-layers", "2", "--target-hidden", "128", "--target-heads", "4",
          "--target-intermediate", "344", "--target-vocab", "1024"]


@pytest.fixture(scope="module")
def projected(tmp_path_factory):
    """2 ranks, traced at the real run's own size: the projection should give the real figures."""
    folder = tmp_path_factory.mktemp("ranks") / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "auditor", "run", "--run-dir", str(folder), "--stage", "fsdp2_train:train_step",
                           "--model-from", "fsdp2_train:build_model", *TARGET, "fsdp2_train.py", *SIZE],
                          cwd=HERE, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder, done


@pytest.mark.slow
def test_each_rank_is_traced_as_itself_and_says_so(projected):
    folder, done = projected
    assert done.stderr.count("as rank 0 of 2 (fake process group") + done.stderr.count("as rank 1 of 2 (fake") == 2
    for rank in (0, 1):
        record = load(folder / f"rank-{rank}")
        projection = json.loads((folder / f"rank-{rank}" / "projections.json").read_text())[0]
        assert projection["traced_as_rank"] == {"rank": rank, "world_size": 2}
        assert "incomplete" not in projection
        traced = load(next((folder / f"rank-{rank}").glob("target-*")) / f"rank-{rank}")
        assert traced.rank.backend == "fake" and traced.rank.rank == rank
        [side] = side_by_side(record)  # the projection as the rank's report shows it
        assert any("fake process group" in note for note in side.notes)


@pytest.mark.slow
def test_a_rank_traced_at_its_own_size_is_close_to_the_real_rank(projected):
    """Same shapes, so the tensors differ only where gloo allocates inside its collectives, which
    the fake process group does not (the projection's note says the figures can be low)."""
    folder, _ = projected
    for rank in (0, 1):
        record = load(folder / f"rank-{rank}")
        projection = json.loads((folder / f"rank-{rank}" / "projections.json").read_text())[0]
        real = max(s.live_tensors.peak for s in record.stages)
        assert 0.85 * real <= projection["live_tensor_peak"] <= 1.01 * real
