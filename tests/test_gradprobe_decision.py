"""The decision rule, on hand-built models whose gradients can be worked out by hand."""
from __future__ import annotations

import pytest
import torch

from gradprobe import GradProbe, final_mask, is_pruned

pytestmark = pytest.mark.usefixtures("one_thread")


def half_squared_error(output, target):
    return 0.5 * ((output - target) ** 2).sum()


def test_rule_elementwise():
    candidate = torch.tensor([True, True, True, False, True])
    before = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0])
    after = torch.tensor([0.5, 3.5, 0.0, 0.0, 0.1])
    # shrank -> pruned; grew beyond 1 + tau = 3 -> kept; zero/zero -> pruned; not a candidate; grew from 0
    assert is_pruned(candidate, before, after, tau=2.0).tolist() == [True, False, True, False, False]
    assert final_mask(candidate.view(5, 1), before.view(5, 1), after.view(5, 1), 2.0).flatten().tolist() \
        == [True, False, True, False, False]
    # exactly at the allowance is pruned (<=)
    assert is_pruned(torch.tensor([True]), torch.tensor([1.0]), torch.tensor([3.0]), 2.0).item()


def three_by_two_model():
    """out = W x + b with x = (1, 0): row i's gradient is (W[i,0] + b[i] - t[i], 0).

    Candidates at s = 0.5 are the three small weights. Reducing them by r = 0.1:
      W[0,0] 0.5 -> 0.05, target 0: |grad| 0.5 -> 0.05, shrinks          -> pruned
      W[1,0] 0.4 -> 0.04, target 2: |grad| 1.6 -> 1.96, grows by 22.5%    -> kept at tau 0.1
      W[0,1] 0.3 -> 0.03, input 0:  |grad| 0 -> 0, zero before and after  -> pruned
    """
    model = torch.nn.Linear(2, 3)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.5, 0.3], [0.4, 9.0], [9.0, 9.0]]))
        model.bias.zero_()
    batch = (torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 2.0, 9.0]]))
    return model, [batch]


def test_grown_gradient_kept_exactly_shrunk_pruned_zero_zero_pruned():
    model, batches = three_by_two_model()
    original = model.weight.detach().clone()
    result = GradProbe(model).prune(batches, half_squared_error, sparsity=0.5, num_batches=1,
                                    reduction_factor=0.1, gradient_threshold=0.1)
    assert result.masks["weight"].tolist() == [[True, True], [False, False], [False, False]]
    assert result.masks["bias"].tolist() == [False, False, False]
    assert (result.candidates, result.pruned) == (3, 2)
    expected = original.clone()
    expected[0] = 0.0
    assert torch.equal(model.weight.detach(), expected)  # 0.4 back bit for bit, 9.0s never touched
    assert torch.equal(model.bias.detach(), torch.zeros(3))


def test_a_larger_allowance_prunes_the_grown_candidate_too():
    model, batches = three_by_two_model()
    result = GradProbe(model).prune(batches, half_squared_error, sparsity=0.5, num_batches=1,
                                    gradient_threshold=0.3)  # 1.96 <= 1.6 * 1.3
    assert result.masks["weight"].tolist() == [[True, True], [True, False], [False, False]]


def test_structures_are_kept_on_the_pruner():
    model, batches = three_by_two_model()
    pruner = GradProbe(model)
    pruner.prune(batches, half_squared_error, sparsity=0.5, num_batches=1, gradient_threshold=0.1)
    assert set(pruner.saved_state) == {"weight", "bias"}
    assert torch.allclose(pruner.gradients_original["weight"], torch.tensor([[0.5, 0], [1.6, 0], [0, 0]]))
    assert torch.allclose(pruner.gradients_reduced["weight"], torch.tensor([[0.05, 0], [1.96, 0], [0, 0]]))
    assert pruner.candidates["weight"].tolist() == [[True, True], [True, False], [False, False]]
    assert model.weight.grad is not None  # left as the last backward left it


def test_gradient_record_is_the_running_max_of_abs_grad():
    """out = W x summed: dL/dW = x, so G is the elementwise max of |x| over the batches."""
    model = torch.nn.Linear(2, 1, bias=False)
    batches = [torch.tensor([[1.0, -3.0]]), torch.tensor([[-2.0, 1.0]])]
    pruner = GradProbe(model)
    pruner.prune(batches, lambda out, _: out.sum(), sparsity=0.5, num_batches=2)
    assert pruner.gradients_original["weight"].tolist() == [[2.0, 3.0]]  # not 3 (sum) nor 1.5 (mean)


def test_dropout_is_off_while_measuring_and_restored_after():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    without_dropout = torch.nn.Sequential(model[0], torch.nn.Identity(), model[2])
    x = torch.randn(3, 4)
    without_dropout(x).pow(2).sum().backward()
    expected = model[0].weight.grad.abs().clone()
    model.train()
    pruner = GradProbe(model)
    pruner.prune([x], lambda out, _: out.pow(2).sum(), sparsity=0.1, num_batches=1)
    assert torch.equal(pruner.gradients_original["0.weight"], expected)
    assert model.training and model[1].training and model[1].p == 0.5
