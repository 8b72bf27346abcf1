"""Streaming's block-wise fp32 compute from stored weights, and its one-pass half-precision threshold."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_MISTRAL

from architectures import make_config
from gradprobe import GradProbe, mask_digest
from gradprobe.strategies import TensorScores
from gradprobe.streaming import StreamingGradProbe, generate_random_weights, streamed_weights
from gradprobe.streaming.candidates import Candidates, HalfMagnitudes
from gradprobe.streaming.hidden_states import SpilledStack
from gradprobe.streaming.streamed_weights import StreamedEmbedding, StreamedLinear, StreamedWeight
from gradprobe.threshold import candidate_threshold

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 512 rows or columns (the alignment kept), so the weights here are split; each block
    reduced in chunks of a few rows, the last one shorter."""
    monkeypatch.setattr(streamed_weights, "BLOCK_BYTES", 4 * 600 * 512)
    monkeypatch.setattr(streamed_weights, "REDUCE_CHUNK", 600 * 7)


def streamed(stored, threshold, reduction=None, scale=None):
    weight = StreamedWeight(stored)
    weight.candidates = Candidates(stored, threshold, scale)
    weight.threshold, weight.reduction, weight.scale = threshold, reduction, scale
    received = []
    weight.consume = lambda values, part: received.append(values)
    return weight, received


def reduced_fp32(stored, threshold, reduction, scale=None):
    """The baseline's reduced weight: `reduce_candidates` on the fp32 weight."""
    weight = stored.float()
    if reduction is None:
        return weight
    chosen = TensorScores(stored, scale).below(threshold)
    return torch.where(chosen, weight * reduction, weight)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction, scaled, bias", [(None, False, False), (0.1, False, True), (0.1, True, False)])
def test_linear_in_blocks_is_f_linear_and_its_gradients_bit_for_bit(small_blocks, dtype, reduction,
                                                                    scaled, bias):
    torch.manual_seed(0)
    stored = (torch.randn(1636, 600) * torch.logspace(-3, 1, 600)).to(dtype)  # scales differ by column
    scale = torch.rand(1, 600) * 4 if scaled else None
    b = torch.randn(1636) if bias else None
    weight, received = streamed(stored, 0.05, reduction, scale)
    assert list(weight.row_blocks())[-2:] == [(1024, 1536), (1536, 1636)]
    assert list(weight.column_blocks()) == [(0, 512), (512, 600)]
    x = torch.randn(2, 9, 600, requires_grad=True)
    y = StreamedLinear.apply(x, weight, b)
    expected_w = reduced_fp32(stored, 0.05, reduction, scale).requires_grad_()
    x_ = x.detach().clone().requires_grad_()
    expected = F.linear(x_, expected_w, b)
    assert torch.equal(y, expected)
    if reduction is not None:  # the blocks were reduced: some candidates, not all
        assert 0 < weight.candidates.count() < stored.numel()
        assert not torch.equal(expected_w, stored.float())
    grad = torch.randn_like(y)
    y.backward(grad)
    expected.backward(grad)
    assert torch.equal(x.grad, x_.grad)
    chosen = TensorScores(stored, scale).below(0.05)
    assert len(received) == 1 and torch.equal(received[0], expected_w.grad[chosen])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", [None, 0.1])
def test_embedding_rows_and_gradient_at_candidates_bit_for_bit(dtype, reduction):
    torch.manual_seed(1)
    stored = torch.randn(50, 16).to(dtype)
    weight, received = streamed(stored, 0.3, reduction)
    ids = torch.tensor([[3, 7, 3, 3, 49], [7, 0, 0, 3, 12]])  # repeats: sums in token order
    anchor = torch.zeros((), requires_grad=True)
    out = StreamedEmbedding.apply(ids, weight, anchor)
    expected_w = reduced_fp32(stored, 0.3, reduction).requires_grad_()
    expected = F.embedding(ids, expected_w)
    assert torch.equal(out, expected)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    chosen = TensorScores(stored).below(0.3)
    assert torch.equal(received[0], expected_w.grad[chosen])
    touched = torch.isin(chosen.nonzero()[:, 0], ids.flatten())  # each candidate's row, seen or not
    assert (~touched).any() and received[0][~touched].eq(0).all() and received[0][touched].ne(0).any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_magnitudes_give_the_counting_search_threshold(dtype):
    torch.manual_seed(2)
    tensors = [(torch.randn(300, 40) * 0.02).to(dtype), (torch.randn(7, 33) * 3).to(dtype),
               torch.zeros(5, 5, dtype=dtype), (-torch.rand(100, 9)).to(dtype)]  # many ties, zeros, signs
    total = sum(t.numel() for t in tensors)
    for sparsity in [0.0, 1e-5, 0.1, 0.5, 0.999, 1.0]:
        counting = HalfMagnitudes(total, sparsity)
        for number, tensor in enumerate(tensors):
            counting.add(f"w{number}", tensor)
        counting.add("w0", tensors[0])  # a tied tensor, seen again: counted once
        expected = candidate_threshold(lambda: (TensorScores(t).block(slice(None)) for t in tensors),
                                       total, sparsity)
        assert counting.threshold() == expected, sparsity


def test_bf16_folder_pruned_as_the_baseline_prunes_its_fp32_values(tokens, tmp_path):
    """One-pass threshold, bf16 blocks reduced in fp32: the baseline's decisions on the same values."""
    from transformers import AutoModelForCausalLM
    config = make_config("mistral-7b", **TINY_MISTRAL)
    generate_random_weights(config, str(tmp_path / "weights"), seed=5, dtype=torch.bfloat16)
    for tau in (2.0, 0.0):
        model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "weights"), dtype=torch.float32,
                                                     attn_implementation="eager")
        baseline = GradProbe(model).prune(tokens, sparsity=0.1, gradient_threshold=tau)
        pruner = StreamingGradProbe(str(tmp_path / "weights"))
        result = pruner.prune(tokens, str(tmp_path / f"out-{tau}"), sparsity=0.1, gradient_threshold=tau)
        assert pruner.counting is None and result.threshold > 0  # counted in the G0 pass
        assert (result.candidates, result.pruned) == (baseline.candidates, baseline.pruned)
        assert mask_digest(result.masks) == mask_digest(baseline.masks)
    assert 0 < result.pruned < result.candidates


def test_hidden_states_spill_to_disk_and_come_back_exactly(tmp_path):
    stack = SpilledStack(str(tmp_path / "hidden"))
    os.makedirs(stack.folder)
    lists = [[torch.randn(2, 3), torch.randn(4)] for _ in range(3)]
    for tensors in lists:
        stack.push(tensors)
    assert stack.nbytes == 10 * 4 and len(os.listdir(stack.folder)) == 2  # only the top in memory
    for tensors in reversed(lists):
        assert all(torch.equal(a, b) for a, b in zip(stack.pop(), tensors, strict=False))
    assert os.listdir(stack.folder) == []
    stack.close()
    assert not os.path.exists(stack.folder)
