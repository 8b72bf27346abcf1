"""`auditor project-ranks`: sharded GradProbe audited on real ranks (torchrun, gloo) at a small
size, traced rank by rank at the target's world sizes, one report; bad input is one line, exit 2,
before any run."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

SMALL = ["--layers", "1", "--hidden", "64", "--vocab", "250", "--heads", "4", "--seq-len", "16"]
TARGET = ["--target", "tinystories-33m", "--target-layers", "2", "--target-hidden", "128", "--target-vocab", "1001"]


def _auditor(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "auditor", "project-ranks", *args], capture_output=True,
                          text=True, timeout=900, cwd=cwd)


@pytest.mark.parametrize("bad, says", [
    (["--world-size", "2", "0"], "--world-size must be at least 1"),
    (["--ranks", "0"], "--ranks must be at least 1"),
    (["--device-memory", "0"], "--device-memory must be more than 0 GiB"),
    (["--target", "no-such-model"], "--target"),
    (["--sparsity", "2"], "sparsity"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_run(tmp_path, bad, says):
    done = _auditor(*SMALL, *TARGET, "--run-dir", str(tmp_path / "run"), *bad)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.heavy
def test_each_rank_projected_and_the_devices_counted(tmp_path):
    run = tmp_path / "run"
    done = _auditor(*SMALL, *TARGET, "--world-size", "2", "--device-memory", "1", "0.001", "--run-dir", str(run))
    assert done.returncode == 0, done.stderr[-3000:]
    (world,) = json.loads((run / "rank-projection.json").read_text())["worlds"]
    assert world["world_size"] == 2 and [r["rank"] for r in world["ranks"]] == [0, 1]
    assert all(r["traced_as"] == r["rank"] and r["paired_real_rank"] == r["rank"] for r in world["ranks"])
    for rank in world["ranks"]:  # the sharded part holds a shard: less than the whole model built first
        assert 0 < rank["sharded"]["live_tensors"] < rank["whole"]["live_tensors"]
    report = (run / "rank-projection.md").read_text()
    assert "auditor project-ranks " in report and "## How many devices" in report
    assert "| 1 GiB | 2 |" in report and "| 0.001 GiB | more than 2 |" in report
    assert (run / "audited-2-ranks" / "rank-0" / "run.json").is_file()
    assert (run / "traced-2-ranks" / "rank-1" / "run.json").is_file()
