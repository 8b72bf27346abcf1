"""The tensor census: storage counting, ownership by roots, categories, fake tensors."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

import architectures
from auditor.capture.census.take import Root, take_census


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def component(census: dict, name: str) -> dict:
    assert name in census["components"], f"{name} missing from {sorted(census['components'])}"
    return census["components"][name]


class Holder:
    """A stand-in for user code: an object whose attributes hold tensors."""

    def __init__(self, **attributes):
        self.__dict__.update(attributes)


# -- storage counting ---------------------------------------------------------------------

def test_a_view_counts_its_whole_storage_once():
    base = torch.zeros(1000)
    census = take_census({"held": Root({"base": base, "view": base[10:20], "t": base.t()})})
    assert component(census, "held") == {"category": "other", "bytes": 4000, "tensors": 1}

    # a small window on a big storage that no other tensor object shows
    small = torch.tensor([], dtype=torch.float64).set_(
        torch.zeros(500, dtype=torch.float64).untyped_storage(), 0, (3,), (1,))
    assert small._base is None and small.untyped_storage().nbytes() == 4000
    census = take_census({"small": Root(small)})
    assert component(census, "small")["bytes"] == 4000


def test_tied_embedding_and_head_counted_once():
    model = architectures.build_model("tinystories-33m", layers=2, hidden=64, vocab=256, heads=4)
    head, embedding = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert head.data_ptr() == embedding.data_ptr()  # the premise: tied
    every_parameter = [p for _, p in model.named_parameters(remove_duplicate=False)]
    unique = {p.data_ptr(): nbytes(p) for p in every_parameter}
    every = sum(nbytes(p) for p in every_parameter)
    assert every == sum(unique.values()) + nbytes(embedding)

    census = take_census({"model": Root(model)})
    assert component(census, "model.parameters")["bytes"] == sum(unique.values())
    assert component(census, "model.parameters")["tensors"] == len(unique)
    buffers = {b.data_ptr(): b.untyped_storage().nbytes() for b in model.buffers()}
    assert component(census, "model.buffers") == {"category": "buffers", "bytes": sum(buffers.values()),
                                                  "tensors": len(buffers)}


@pytest.mark.parametrize("dtype, size", [(torch.bool, 1), (torch.float16, 2), (torch.bfloat16, 2),
                                         (torch.float32, 4), (torch.int64, 8)])
def test_bytes_follow_the_dtype(dtype, size):
    census = take_census({"t": Root(torch.zeros(1000, dtype=dtype))})
    assert component(census, "t")["bytes"] == 1000 * size


def test_sparse_tensors_count_indices_and_values():
    sparse = torch.eye(50).to_sparse()
    census = take_census({"s": Root(sparse)})
    assert component(census, "s")["bytes"] == nbytes(sparse._indices()) + nbytes(sparse._values())


# -- ownership and categories -------------------------------------------------------------

def test_module_root_gives_weights_then_gradients():
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3))
    model.register_buffer("scale", torch.ones(5, dtype=torch.float16))
    weights = sum(nbytes(p) for p in model.parameters())
    census = take_census({"model": Root(model)})
    assert component(census, "model.parameters") == {"category": "weights", "bytes": weights, "tensors": 6}
    assert component(census, "model.buffers") == {"category": "buffers", "bytes": 10, "tensors": 1}
    assert "model.grad" not in census["components"]

    model(torch.randn(4, 16)).sum().backward()
    census = take_census({"model": Root(model)})
    grads = sum(nbytes(p.grad) for p in model.parameters())
    assert grads == weights
    assert component(census, "model.grad") == {"category": "gradients", "bytes": grads, "tensors": 6}


def test_object_root_attributes_become_components_with_hinted_categories():
    model = torch.nn.Linear(32, 32)
    params = dict(model.named_parameters())
    pruner = Holder(
        model=model,
        saved_state={n: p.detach().clone() for n, p in params.items()},
        gradients_original={n: torch.zeros_like(p) for n, p in params.items()},
        masks={n: p.detach() > 0 for n, p in params.items()},
        scratch=torch.zeros(10),
        records=Holder(g0=torch.zeros(7), g1=torch.zeros(9)),
        settings={"sparsity": 0.1, "name": "magnitude"},
    )
    hints = {"saved_state": "saved copies", "gradients_original": "gradient records",
             "records.g1": "gradient records"}
    census = take_census({"pruner": Root(pruner, hints), "model": Root(model)})
    weights = nbytes(model.weight) + nbytes(model.bias)
    bools = model.weight.numel() + model.bias.numel()
    # the wrapper reaches the model's parameters but never owns them (tests/test_census_identity.py)
    assert component(census, "model.parameters") == {"category": "weights", "bytes": weights, "tensors": 2}
    expected = {
        "pruner.saved_state": {"category": "saved copies", "bytes": weights, "tensors": 2},
        "pruner.gradients_original": {"category": "gradient records", "bytes": weights, "tensors": 2},
        "pruner.masks": {"category": "masks", "bytes": bools, "tensors": 2},
        "pruner.scratch": {"category": "other", "bytes": 40, "tensors": 1},
        "pruner.records": {"category": "other", "bytes": 28, "tensors": 1},
        "pruner.records.g1": {"category": "gradient records", "bytes": 36, "tensors": 1},
    }
    assert {k: v for k, v in census["components"].items() if k.startswith("pruner")} == expected


def test_the_first_registered_root_owns_a_shared_storage():
    shared = torch.zeros(100)
    a, b = Holder(x=shared), Holder(y=shared[50:])
    census = take_census({"a": Root(a), "b": Root(b)})
    assert component(census, "a.x")["bytes"] == 400
    assert "b.y" not in census["components"]
    census = take_census({"b": Root(b), "a": Root(a)})
    assert component(census, "b.y")["bytes"] == 400
    assert "a.x" not in census["components"]

    model = torch.nn.Linear(4, 4)
    pruner = Holder(model=model)
    census = take_census({"model": Root(model), "pruner": Root(pruner)})
    assert "model.parameters" in census["components"] and "pruner.model.parameters" not in census["components"]
    census = take_census({"pruner": Root(pruner), "model": Root(model)})  # a wrapper never owns weights
    assert "model.parameters" in census["components"] and "pruner.model.parameters" not in census["components"]


def test_tensors_no_root_reaches_are_unowned():
    def grown(after: dict, before: dict, name: str) -> tuple[int, int]:
        a, b = after["components"].get(name, {}), before["components"].get(name, {})
        return a.get("bytes", 0) - b.get("bytes", 0), a.get("tensors", 0) - b.get("tensors", 0)

    gc.collect()
    before = take_census({})
    activation = torch.zeros(12345)  # a local: alive, reachable from no root
    stray = torch.nn.Parameter(torch.zeros(77))
    stray.grad = torch.ones(77)
    after = take_census({})
    assert grown(after, before, "unowned") == (12345 * 4, 1)
    assert grown(after, before, "unowned.parameters") == (308, 1)
    assert grown(after, before, "unowned.grad") == (308, 1)
    assert after["live_tensor_bytes"] - before["live_tensor_bytes"] == 12345 * 4 + 308 * 2
    assert after["components"]["unowned"]["category"] == "activations and temporaries"
    assert after["components"]["unowned.parameters"]["category"] == "weights"
    assert after["components"]["unowned.grad"]["category"] == "gradients"

    owned = take_census({"act": Root(activation), "stray": Root(stray)})
    assert grown(owned, before, "unowned") == (0, 0)
    assert grown(owned, before, "unowned.parameters") == (0, 0)
    assert component(owned, "stray.grad") == {"category": "gradients", "bytes": 308, "tensors": 1}


def test_optimizer_state_after_one_step():
    model = torch.nn.Linear(20, 10)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 20)).sum().backward()
    optimizer.step()
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    assert len(state) == 6  # exp_avg, exp_avg_sq, step for weight and bias
    expected = sum(v.untyped_storage().nbytes() for v in state)
    census = take_census({"model": Root(model), "opt": Root(optimizer)})
    assert component(census, "opt.state") == {"category": "optimizer state", "bytes": expected, "tensors": 6}
    assert component(census, "model.parameters")["bytes"] == nbytes(model.weight) + nbytes(model.bias)

    trainer = Holder(optimizer=optimizer)  # an optimizer found inside an object root
    census = take_census({"trainer": Root(trainer)})
    assert component(census, "trainer.optimizer.state")["bytes"] == expected


def test_weak_reference_roots():
    alive = Holder(t=torch.zeros(10))
    dying = Holder(t=torch.zeros(20))
    dead = weakref.ref(dying)
    del dying
    gc.collect()
    census = take_census({"alive": Root(weakref.ref(alive)), "dead": Root(dead)})
    assert component(census, "alive.t")["bytes"] == 40
    assert not any(name.startswith("dead") for name in census["components"])

    elsewhere = torch.zeros(30)  # weak references inside a root own nothing
    alive.ref, alive.proxy = weakref.ref(elsewhere), weakref.proxy(elsewhere)
    census = take_census({"alive": Root(alive)})
    assert not any(name.startswith(("alive.ref", "alive.proxy")) for name in census["components"])


def test_cycles_are_walked_once():
    a, b = Holder(t=torch.zeros(5)), Holder(u=torch.zeros(6))
    a.b, b.a = b, a
    a.loop = [a, b, {"again": a}]
    model = torch.nn.Linear(3, 3)
    model.owner = a  # a module attribute pointing back into the object root
    a.model = model
    census = take_census({"a": Root(a)})
    assert component(census, "a.t")["bytes"] == 20
    assert component(census, "a.b")["bytes"] == 24
    assert "a.model.parameters" not in census["components"]  # reached, not owned: a wrapper's
    census = take_census({"a": Root(a), "model": Root(model)})
    assert component(census, "model.parameters")["bytes"] == (9 + 3) * 4


def test_the_census_keeps_no_reference():
    t = torch.zeros(10)
    ref = weakref.ref(t)
    take_census({"holder": Root(Holder(t=t))})
    del t
    assert ref() is None


def test_fake_tensors_count_only_when_asked_and_meta_tensors_never():
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    with mode:
        big = torch.empty(256, 256)
        layer = torch.nn.Linear(64, 32, dtype=torch.bfloat16)
        layer(torch.randn(2, 64, dtype=torch.bfloat16)).sum().backward()
    roots = {"big": Root({"t": big, "view": big[:10]}), "layer": Root(layer),
             "meta": Root(torch.empty(100, device="meta"))}
    weights = (64 * 32 + 32) * 2

    real = take_census(roots)
    assert not any(name.startswith(("big", "layer", "meta")) for name in real["components"])
    assert real["fake_tensor_bytes"] >= 256 * 256 * 4 + 2 * weights

    fake = take_census(roots, count_fake=True)
    assert component(fake, "big") == {"category": "other", "bytes": 256 * 256 * 4, "tensors": 1}
    assert component(fake, "layer.parameters") == {"category": "weights", "bytes": weights, "tensors": 2}
    assert component(fake, "layer.grad") == {"category": "gradients", "bytes": weights, "tensors": 2}
    # a meta tensor is shapes only: a traced run's FakeTensor stands for memory, it does not (a
    # streaming pruner's meta model structure counted as 27 GiB at 7B)
    assert not any(name.startswith("meta") for name in fake["components"])
    with mode:  # taken at a stage end while the projection is still tracing
        inside = take_census(roots, count_fake=True)
    assert {k: v for k, v in inside["components"].items() if k.startswith(("big", "layer", "meta"))} == \
        {k: v for k, v in fake["components"].items() if k.startswith(("big", "layer", "meta"))}
    assert fake["live_tensor_bytes"] - real["live_tensor_bytes"] == fake["fake_tensor_bytes"]
