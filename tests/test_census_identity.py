"""Storage identity decides weights; a wrapper that references a model never owns its weights."""
from __future__ import annotations

import torch

from auditor.capture.census.take import Root, storage_key, take_census


class Hessian:
    """A per-linear helper in the style of third-party pruning code: it holds its layer, an
    alias of the layer's weight and a statistic of its own."""

    def __init__(self, layer: torch.nn.Linear):
        self.layer = layer
        self.W = layer.weight.data  # an alias: the parameter's storage, not a copy
        self.H = torch.zeros(layer.in_features, layer.in_features)


def nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def grown(after: dict, before: dict, name: str) -> int:
    return (after["components"].get(name, {}).get("bytes", 0)
            - before["components"].get(name, {}).get("bytes", 0))


def test_a_wrapper_owns_its_state_but_not_the_weights_it_references():
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 16))
    helper = Hessian(model[0])
    weights = sum(nbytes(p) for p in model.parameters())

    # the wrapper first, then the model: the model's parameters stay with the model
    census = take_census({"Hessian[0]": Root(helper), "model": Root(model)})
    components = census["components"]
    assert components["model.parameters"] == {"category": "weights", "bytes": weights, "tensors": 4}
    assert components["Hessian[0].H"] == {"category": "other", "bytes": 64 * 64 * 4, "tensors": 1}
    assert not any(name.startswith(("Hessian[0].layer", "Hessian[0].W")) for name in components)


def test_with_no_module_root_the_referenced_weights_are_unowned_parameters():
    before = take_census({})
    model = torch.nn.Linear(128, 64)
    helper = Hessian(model)
    after = take_census({"Hessian[0]": Root(helper)})
    assert grown(after, before, "unowned.parameters") == nbytes(model.weight) + nbytes(model.bias)
    assert grown(after, before, "unowned") == 0  # the alias W is weights, not a temporary
    assert after["components"]["unowned.parameters"]["category"] == "weights"
    assert after["components"]["Hessian[0].H"]["bytes"] == 128 * 128 * 4


def test_an_alias_reached_by_no_root_is_weights():
    before = take_census({})
    model = torch.nn.Linear(256, 256, bias=False)
    W = model.weight.data  # noqa: N806  (as third-party code writes it)
    W_view = W[:, :128]    # noqa: N806
    after = take_census({})
    assert grown(after, before, "unowned.parameters") == 256 * 256 * 4
    assert grown(after, before, "unowned") == 0
    del W, W_view


def test_gradients_of_a_referenced_module_stay_with_the_module_root():
    model = torch.nn.Linear(8, 4)
    model(torch.ones(2, 8)).sum().backward()
    helper = Hessian(model)
    census = take_census({"Hessian[0]": Root(helper), "model": Root(model)})
    assert census["components"]["model.grad"] == {"category": "gradients", "bytes": (32 + 4) * 4, "tensors": 2}
    assert not any(name.startswith("Hessian[0].layer") for name in census["components"])


def test_a_free_parameter_is_owned_by_the_root_that_holds_it_and_counts_as_weights():
    class Prompt:
        def __init__(self):
            self.embedding = torch.nn.Parameter(torch.zeros(10, 16))  # in no module

    prompt = Prompt()
    census = take_census({"prompt": Root(prompt)})
    assert census["components"]["prompt.embedding"] == {"category": "weights", "bytes": 640, "tensors": 1}


def test_owners_are_listed_under_storage_key():
    model = torch.nn.Linear(4, 4)
    helper = Hessian(model)
    census = take_census({"model": Root(model), "Hessian[0]": Root(helper)}, with_owners=True)
    owners = census["owners"]
    assert owners[storage_key(model.weight.untyped_storage(), False)] == "model.parameters"
    assert owners[storage_key(helper.H.untyped_storage(), False)] == "Hessian[0].H"
    assert owners[storage_key(helper.W.untyped_storage(), False)] == "model.parameters"
    assert "owners" not in take_census({"model": Root(model)})
