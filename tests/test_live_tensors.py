"""The live-tensor meter: exact storage bytes per stage, autograd's saved tensors included,
the same on real and fake tensors; and annotations on the run record."""
import gc

import pytest
import torch

import auditor
from auditor.record.run_folder import rebuild

MB = 10**6


def _stages(record):
    return {s["path"]: s for s in record["stages"]}


def test_kept_and_transient_bytes_are_exact(tmp_path):
    n = 50 * MB
    with auditor.Audit(out=tmp_path / "run", live_tensors=True) as audit:
        with auditor.stage("keep"):
            kept = torch.ones(n // 4)
        with auditor.stage("transient"):
            spike = torch.ones(2 * n // 4)
            del spike
    stages = _stages(audit.record)
    keep, transient = stages["keep"]["live_tensors"], stages["transient"]["live_tensors"]
    assert keep["end"] - keep["start"] == n
    assert transient["peak"] - transient["start"] == 2 * n
    assert transient["end"] == transient["start"]
    del kept


def test_counts_what_only_autograd_holds(tmp_path):
    layer = torch.nn.Linear(1000, 1000)
    x = torch.randn(4000, 1000)
    with auditor.Audit(out=tmp_path / "run", live_tensors=True) as audit:
        with auditor.stage("forward"):
            loss = torch.relu(layer(x)).sum()  # no Python name holds the activations
        with auditor.stage("backward"):
            loss.backward()  # frees the graph
    stages = _stages(audit.record)
    forward, backward = stages["forward"]["live_tensors"], stages["backward"]["live_tensors"]
    activation = 4000 * 1000 * 4
    assert forward["end"] - forward["start"] >= activation  # relu's output, saved for backward
    assert forward["peak"] - forward["start"] >= 2 * activation  # the linear output, transient
    grads = 4004000
    assert backward["end"] - forward["end"] <= grads - activation  # the graph went, grads came
    del loss


def test_traced_stages_measure_fake_tensors_like_real_ones(tmp_path):
    def work():
        with auditor.stage("build"):
            weight = torch.ones(1000, 1000)
        with auditor.stage("use"):
            scores = (weight @ weight).abs()
            mask = scores > scores.mean().item()  # a value read back: 0 when traced
        return weight, mask

    readings = {}
    for traced in (False, True):
        with auditor.Audit(out=tmp_path / f"run-{traced}", live_tensors=True, traced=traced) as audit:
            kept = work()
        readings[traced] = {p: s["live_tensors"] for p, s in _stages(audit.record).items()}
        del kept
    assert readings[True] == readings[False]
    assert audit.record["probes"]["traced"]["state"] == "on"
    assert "traced" in audit.record  # data-dependent operations, counted


def test_annotations_survive_a_rebuild_and_cannot_overwrite_audit_fields(tmp_path):
    with auditor.Audit(out=tmp_path / "run") as audit:
        audit.annotate("workload", {"architecture": "tiny", "tokens": 16})
        with pytest.raises(ValueError, match="writes itself"):
            audit.annotate("stages", [])
    assert audit.record["workload"] == {"architecture": "tiny", "tokens": 16}
    (tmp_path / "run" / "run.json").unlink()
    assert rebuild(tmp_path / "run")["workload"]["tokens"] == 16


def test_meta_tensors_allocate_nothing_and_are_not_counted():
    """A model's structure kept on the meta device (streaming keeps one) holds no memory."""
    from auditor.capture.probes.live_tensors import LiveTensorMeter
    meter = LiveTensorMeter()
    with meter:
        structure = torch.empty(1 << 20, device="meta")  # 4 MiB nominal, nothing allocated
        real = torch.empty(1 << 10)
    assert meter.live == real.untyped_storage().nbytes() and structure.numel() == 1 << 20


def test_a_wrapper_subclass_counts_its_inner_tensors_only(tmp_path):
    """A DTensor's own storage reports the global size but holds nothing: its local shard is the
    memory, counted as it is made (FSDP2 parameters and gradients are DTensors)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor

    from auditor.capture.probes.live_tensors import LiveTensorMeter
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        distributed = distribute_tensor(torch.randn(1000, 100), DeviceMesh("cpu", [0]), [Shard(0)])
        gc.collect()  # distribute_tensor's temporaries, which a reference cycle can keep, gone before
        meter = LiveTensorMeter()
        with meter:
            doubled = distributed * 2
        assert meter.live == 400_000  # the product's local shard; its wrapper (400,000 B too) holds nothing
        assert doubled.to_local().untyped_storage().nbytes() == 400_000
    finally:
        dist.destroy_process_group()


def test_a_forked_child_s_operators_pass_through_the_meter():
    """A forked child (a DataLoader worker) inherits the dispatch mode with its memory; it is not
    audited, so its operators go straight through while the parent's are still counted."""
    import os
    import time

    from auditor.capture.probes.live_tensors import LiveTensorMeter
    meter = LiveTensorMeter()
    with meter:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                before = meter.live
                kept = torch.ones(1000)  # below the grain of torch's thread pool, which a fork does not copy
                os.write(write, str(meter.live - before).encode())
                del kept
            finally:
                os._exit(0)
        os.close(write)
        for _ in range(600):  # 30 s at most: a child stuck in a copied lock must not hang the suite
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        counted_in_child = int(os.read(read, 64) or b"-1")
        os.close(read)
        before = meter.live
        kept = torch.ones(1000)
        counted_in_parent = meter.live - before
    assert counted_in_child == 0
    assert counted_in_parent == 4000
