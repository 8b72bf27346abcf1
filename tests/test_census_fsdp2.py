"""The census sees through wrapper tensor subclasses: a model sharded with FSDP2
(`fully_shard`) has DTensor parameters, gradients and optimizer state whose memory is their
local shards; the census owns those shards as it owns a single process's plain tensors."""
from __future__ import annotations

import gc

import pytest
import torch
import torch.distributed as dist

from auditor.capture.census.take import Root, take_census


def component(census: dict, name: str) -> dict:
    assert name in census["components"], f"{name} missing from {sorted(census['components'])}"
    return census["components"][name]


def storages(tensors) -> dict[tuple, int]:
    """(device, data pointer) -> bytes of each distinct storage holding the tensors' data."""
    found = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        storage = local.untyped_storage()
        if storage.nbytes():
            found[(storage.device, storage.data_ptr())] = storage.nbytes()
    return found


@pytest.fixture
def one_rank(tmp_path, one_thread):
    """A real single-process gloo group (world size 1)."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def sharded_step():
    """A tiny model under fully_shard (each layer, then the whole), AdamW, one step; grads kept."""
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16),
                                torch.nn.LayerNorm(16))
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_fsdp2_shards_are_the_weights_gradients_and_optimizer_state(one_rank):
    from torch.distributed.tensor import DTensor
    gc.collect()
    # what other tests in this worker left alive (their models' parameters), counted before ours
    before = take_census({})["components"]
    model, optimizer = sharded_step()
    params = list(model.parameters())
    assert params and all(isinstance(p, DTensor) for p in params)  # the premise: sharded
    assert all(isinstance(p.grad, DTensor) for p in params)
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    assert any(isinstance(v, DTensor) for v in state)

    gc.collect()
    census = take_census({"model": Root(model), "optimizer": Root(optimizer)}, with_owners=True)

    shards, grads, moments = storages(params), storages(p.grad for p in params), storages(state)
    assert len(shards) == len(params)  # a layer's gradients share its reduce-scatter output's storage
    assert component(census, "model.parameters") == {"category": "weights", "bytes": sum(shards.values()),
                                                     "tensors": len(shards)}
    assert component(census, "model.grad") == {"category": "gradients", "bytes": sum(grads.values()),
                                               "tensors": len(grads)}
    assert component(census, "optimizer.state") == {"category": "optimizer state",
                                                     "bytes": sum(moments.values()), "tensors": len(moments)}
    owners = census["owners"]
    assert {owners[k] for k in shards} == {"model.parameters"}
    assert {owners[k] for k in grads} == {"model.grad"}
    assert {owners[k] for k in moments} == {"optimizer.state"}
    # nothing else holds the weights' bytes: no DTensor counted by a storage of its own beside its shard
    rest = {name: c["bytes"] - before.get(name, {"bytes": 0})["bytes"] for name, c in census["components"].items()
            if name not in ("model.parameters", "model.grad", "optimizer.state")}
    assert sum(rest.values()) < sum(shards.values()), rest


def test_fsdp2_shards_no_root_reaches_are_unowned_weights_and_gradients(one_rank):
    """With no root registered, the sweep still knows a sharded parameter's shard for weights."""
    model, optimizer = sharded_step()
    params = list(model.parameters())
    gc.collect()
    census = take_census({}, with_owners=True)
    owners = census["owners"]
    assert {owners[k] for k in storages(params)} == {"unowned.parameters"}
    assert {owners[k] for k in storages(p.grad for p in params)} == {"unowned.grad"}
    assert component(census, "unowned.parameters")["category"] == "weights"
    del model, optimizer


def test_a_wrapper_subclass_counts_each_inner_storage_once():
    """Any traceable wrapper subclass (`__tensor_flatten__`), not only DTensor: its inner tensors'
    storages, each once, even when another object holds an inner tensor too."""
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")
    a, b = torch.zeros(100), torch.zeros(300)[:100]  # b: a window on a larger storage, all counted
    wrapped = two_tensor.TwoTensor(a, b)
    census = take_census({"held": Root({"wrapped": wrapped, "a": a})})
    assert component(census, "held") == {"category": "other", "bytes": 1600, "tensors": 2}
    census = take_census({"wrapped": Root(wrapped)})
    assert component(census, "wrapped")["bytes"] == 1600
