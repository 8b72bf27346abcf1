"""GradProbe sharded by FSDP2 over a real 2-rank torchrun (gloo, CPU): the baseline's masks, one
record per rank with the pruner's phases as stages, and each rank's live tensors below one process's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_GPT_NEO

from architectures import build_model
from auditor import load
from auditor.analysis.ranks.merged import merge_ranks
from auditor.cli import main
from auditor.record.schema import RunRecord
from gradprobe import GradProbe, mask_digest
from gradprobe.variants import ShardedGradProbe, make_pruner
from gradprobe.variants.sharded import GatheredMasks

ROOT = Path(__file__).parents[1]
DRIVER = "benchmarks/sharded_gradprobe.py"
# s = 0.3 and tau = 0: a quarter of the candidates are kept, so the gradients decide; vocab 250
# does not split evenly over 4 ranks' rows (torch.chunk: 63, 63, 63, 61).
SHAPE = dict(TINY_GPT_NEO, vocab=250)
SIZE_ARGS = ["--layers", "2", "--hidden", "64", "--vocab", "250", "--heads", "4", "--seq-len", "16",
             "--batch-size", "2", "--sparsity", "0.3", "--threshold", "0"]
SETTINGS = dict(sparsity=0.3, gradient_threshold=0.0)


def _launch(command: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run(command, cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]


def _rank_run(folder: Path, ranks: int) -> None:
    script = [DRIVER, "rank", "--run-dir", str(folder), *SIZE_ARGS]
    if ranks == 1:
        _launch([sys.executable, *script, "--variant", "baseline"])
    else:
        _launch([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                 str(ranks), *script])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The single-process baseline's audited run, and the sharded run on 2 ranks under torchrun."""
    base = tmp_path_factory.mktemp("sharded")
    folders = {"alone": base / "alone", "2 ranks": base / "two"}
    _rank_run(folders["alone"], 1)
    _rank_run(folders["2 ranks"], 2)
    return folders


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def test_two_ranks_prune_exactly_as_one_process(runs, one_thread):
    alone, sharded = _summary(runs["alone"]), _summary(runs["2 ranks"])
    assert (alone["variant"], sharded["variant"], sharded["world_size"]) == ("baseline", "sharded", 2)
    expected = GradProbe(build_model("tinystories-33m", seed=0, **SHAPE)).prune(
        _tokens(), **SETTINGS)  # in this process: the digest is the baseline's, not the driver's
    assert 0 < expected.pruned < expected.candidates  # some candidates kept: the gradients decided
    assert sharded["mask_digest"] == alone["mask_digest"] == mask_digest(expected.masks)
    assert (sharded["candidates"], sharded["pruned"], sharded["prunable"]) == \
        (expected.candidates, expected.pruned, expected.prunable)


def _tokens():
    from architectures.calibration import synthetic_batches
    return synthetic_batches(250, sequence_length=16, batch_size=2, num_batches=2, seed=0)


def test_each_rank_records_its_own_phases_and_holds_fewer_live_tensors(runs, tmp_path):
    alone = load(runs["alone"])
    merged = merge_ranks(runs["2 ranks"])
    assert [(r.rank, r.world_size, r.backend, r.finished) for r in merged.ranks] == [
        (0, 2, "gloo", True), (1, 2, "gloo", True)]
    records = [load(runs["2 ranks"] / f"rank-{rank}") for rank in (0, 1)]
    for record in records:
        staged = {s.call.target for s in record.stages if s.call}
        assert staged == {f"ShardedGradProbe.{phase}" for phase in ShardedGradProbe.phases}
        assert record.rank.source == "torch.distributed"
        # the prune's live-tensor peak on each rank is below the single process's: shards, not wholes
        assert _prune_live_peak(record) < _prune_live_peak(alone)
    assert main(["report", str(runs["2 ranks"]), "-o", str(tmp_path / "merged.md")]) == 0
    text = (tmp_path / "merged.md").read_text()
    assert "ShardedGradProbe.record_original_gradients" in text and "rank 1 live peak" in text


def _prune_live_peak(record: RunRecord) -> int:
    return next(s for s in record.stages if s.path == "prune").live_tensors.peak


def test_the_pruner_state_is_this_ranks_shard(runs):
    """The census of each rank holds its shard: about half the single process's weights, and its
    candidates as bits of about half the rows."""
    alone = _state_bytes(load(runs["alone"]), ".candidates")  # baseline: a bool per weight
    for rank in (0, 1):
        record = load(runs["2 ranks"] / f"rank-{rank}")
        assert 0 < _state_bytes(record, ".candidates") < alone / 8 * 0.6  # bits, of about half the rows
        # this rank's weights (its shards, which the pruner's `parameters` hold) against the whole model
        assert 0 < _state_bytes(record, "parameters") < 0.6 * _state_bytes(load(runs["alone"]), "parameters")


def _state_bytes(record: RunRecord, component: str) -> int:
    """Bytes of the census component whose name ends with `component`, at the decide phase's end."""
    decide = next(s for s in record.stages if s.path.endswith(".decide"))
    return sum(c.bytes for name, c in decide.components.items() if name.endswith(component))


def test_alone_it_runs_unsharded_with_the_baselines_decisions(one_thread):
    expected = GradProbe(build_model("tinystories-33m", seed=0, **SHAPE)).prune(_tokens(), **SETTINGS)
    result = make_pruner("sharded", build_model("tinystories-33m", seed=0, **SHAPE)).prune(_tokens(), **SETTINGS)
    assert isinstance(result.masks, GatheredMasks)
    assert mask_digest(result.masks) == mask_digest(expected.masks)
    assert (result.candidates, result.pruned) == (expected.candidates, expected.pruned)


def test_wanda_is_refused_in_one_line(tiny_gpt_neo):
    with pytest.raises(ValueError, match="magnitude only"):
        ShardedGradProbe(tiny_gpt_neo, "wanda")


def test_an_unknown_reduction_is_refused_in_one_line(tiny_gpt_neo):
    with pytest.raises(ValueError, match="reduction must be one of own rows"):
        ShardedGradProbe(tiny_gpt_neo, reduction="mean")


def test_the_live_tensor_meter_follows_a_storage_resized_in_place():
    """FSDP2 frees a layer's gathered weights by resizing their storage to 0 and gathers into the
    same storage again: no operator the meter sees. Counted at creation size only, the meter read
    the whole unsharded model as alive on every rank (274 MiB on TinyStories-33M)."""
    from auditor.capture.probes.live_tensors import LiveTensorMeter
    original = torch.UntypedStorage.resize_
    size = 4 << 20
    with LiveTensorMeter() as meter:
        gathered = torch.empty(size // 4)
        before = meter.live
        gathered.untyped_storage().resize_(0)  # FSDP's free_storage
        assert meter.live == before - size
        meter.reset_peak()
        gathered.untyped_storage().resize_(size)  # alloc_storage, before the next all-gather
        assert meter.live == before and meter.peak == before
        at_peak = meter.peak_set()
        assert sum(row[1] for row in at_peak.rows) == at_peak.bytes == before
        del gathered
        assert meter.live == before - size  # freed at its current size
    assert torch.UntypedStorage.resize_ is original  # torch's own again once no meter counts
