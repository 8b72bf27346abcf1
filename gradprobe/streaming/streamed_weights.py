"""Prunable weights kept as stored (bf16 for a 7B model), computed with in fp32 a chunk at a time.

A Linear's fp32 weight is never whole in memory: its forward converts row blocks of the stored
weight and multiplies each (`y[:, rows] = x @ W[rows].T`); its backward takes the input gradient
over column blocks (`g @ W[:, cols]`) and the weight gradient over row blocks (`g[:, rows].T @ x`),
each block read at the candidates and dropped, so no dense weight gradient exists either. Every
output element is the same dot product over the same axis as in the whole-matrix call; on this
machine's BLAS the blocked results are bit-identical to `F.linear` and autograd's formulas
(`tests/test_gradprobe_streaming_weights.py` checks it). An Embedding gathers the fp32 rows its
tokens use, and its gradient is summed only over the rows the batch touches (in token order, as
`embedding_dense_backward` sums them).

In the reduced pass the candidates are multiplied by r in each converted block (the baseline's
`reduce_candidates` expression): the stored weights are never changed, so a stage's pruned
weights are written from them when it is done.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from .candidates import Candidates

BLOCK_BYTES = 16 << 20  # one fp32 block of a weight: the transient the conversion costs
# Blocks are a multiple of 512 rows or columns. MKL's results with a long inner dimension (14,336)
# changed with blocks of 292 (not bit-identical to the whole product) and were identical with
# 512 and 1024 at every Mistral-7B shape (benchmarks/gradprobe_streaming.py --part exactness).
ALIGN = 512
REDUCE_CHUNK = 1 << 18  # elements reduced at a time: its three fp32 buffers fit in one core's L2


class StreamedWeight:
    """One prunable weight as stored, its candidates, and where its gradient at them goes.

    In the reduced pass (`reduction` set) each converted block is reduced where its scores are
    below `threshold` (the candidates, found again from the block's own values), as the baseline's
    `reduce_candidates` does: `torch.where(score < t, block * r, block)`.

    `stacked` calibration batches may come through at once, concatenated along the input's first
    dimension: every converted block then serves them all, and the weight gradient is still taken
    for each batch apart, `consume(values, part)` with part = 0 .. stacked - 1.
    """

    def __init__(self, stored: torch.Tensor):
        self.stored, self.width = stored, stored.shape[1]
        self.candidates: Candidates | None = None
        self.consume: Callable[[torch.Tensor, int], None] | None = None
        self.stacked = 1
        self.reduction: float | None = None
        self.threshold: float | None = None
        self.scale: torch.Tensor | None = None  # WANDA's ||X_j||, [1, width]

    def row_blocks(self) -> Iterator[tuple[int, int]]:
        yield from _blocks(self.stored.shape[0], self.width)

    def column_blocks(self) -> Iterator[tuple[int, int]]:
        yield from _blocks(self.width, self.stored.shape[0])

    def rows(self, start: int, end: int) -> torch.Tensor:
        """W[start:end] in fp32, reduced in the reduced pass (valid until the next call)."""
        return self._converted(self.stored[start:end], self.scale)

    def columns(self, start: int, end: int) -> torch.Tensor:
        """W[:, start:end] in fp32, contiguous, reduced in the reduced pass (valid until the next call)."""
        return self._converted(self.stored[:, start:end], None if self.scale is None else self.scale[:, start:end])

    def rows_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Embedding rows `ids` in fp32, reduced in the reduced pass."""
        return self._reduced(self.stored.index_select(0, ids).to(torch.float32), self.scale)

    def _converted(self, source: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        """`source` in fp32 in the reused block, reduced in the reduced pass.

        Reduced a chunk of rows at a time, each chunk converted and reduced while it is in the cache:
        the reduction's five elementwise passes over a whole 16 MiB block went to memory each time
        (2.5x slower, measured). Elementwise ops, so the values do not depend on the chunking."""
        block = _CONVERTED.take(source.shape)
        if self.reduction is None:
            return block.copy_(source)
        step = max(1, REDUCE_CHUNK // source.shape[1])
        for start in range(0, source.shape[0], step):
            chunk = block[start:start + step].copy_(source[start:start + step])
            self._reduced(chunk, scale)
        return block

    def _reduced(self, block: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        if self.reduction is None:
            return block
        if self.threshold is None:
            raise RuntimeError("a weight is reduced at its candidates: set its threshold with its reduction")
        work, factor = _SCORES.take(block.shape), _FACTOR.take(block.shape)
        torch.abs(block, out=work)  # the score, as TensorScores: |w| (exact in fp32), times the scale
        if scale is not None:
            work.mul_(scale)
        # factor = r at candidates, 1 elsewhere, both exact (r * [score < t] + [score >= t]): the
        # product is the baseline's `block * r` there and the weight itself elsewhere. Float ops
        # throughout: torch.where on a bool mask costs ~5x these on this CPU.
        torch.lt(work, self.threshold, out=factor)
        torch.ge(work, self.threshold, out=work)
        return block.mul_(torch.add(work, factor, alpha=self.reduction, out=factor))

    def candidates_in_rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For the candidates in rows `ids`: their flat index in W[ids], and their index in the candidates."""
        slot = torch.full((self.stored.shape[0],), -1, dtype=torch.int64)
        slot[ids] = torch.arange(ids.numel())
        positions = self._candidates().positions.to(torch.int64)
        row_slot = slot[positions // self.width]
        chosen = torch.nonzero(row_slot >= 0).view(-1)
        return row_slot[chosen] * self.width + positions[chosen] % self.width, chosen

    def _candidates(self) -> Candidates:
        """The candidates, found (`Candidates`) before any gradient is read at them."""
        if self.candidates is None:
            raise RuntimeError("a weight's gradient is read at its candidates: find them first")
        return self.candidates


class _Buffer:
    """One fp32 buffer reused for every block: allocating a fresh 16 MiB block each time either
    faults in new pages (when malloc maps it) or leaves hundreds of MiB in the heap (when it does not)."""

    def __init__(self, dtype: torch.dtype = torch.float32):
        self.dtype = dtype
        self.tensor = torch.empty(0, dtype=dtype)

    def take(self, shape) -> torch.Tensor:
        size = shape[0] * shape[1]
        if self.tensor.numel() < size:
            self.tensor = torch.empty(size, dtype=self.dtype)
        return self.tensor[:size].view(shape)

    def free(self) -> None:
        self.tensor = torch.empty(0, dtype=self.dtype)


_CONVERTED, _GRADIENT, _FACTOR = _Buffer(), _Buffer(), _Buffer()
_SCORES = _GRADIENT  # never in use together: scores while converting, gradient blocks after
BLOCK_BUFFERS = (_CONVERTED, _GRADIENT, _FACTOR)


def release_buffers() -> None:
    """Drop the reused blocks (when a stage's computing is over)."""
    for buffer in BLOCK_BUFFERS:
        buffer.free()


def _blocks(rows: int, width: int) -> Iterator[tuple[int, int]]:
    step = max(ALIGN, BLOCK_BYTES // (4 * max(1, width)) // ALIGN * ALIGN)
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


class StreamedLinear(torch.autograd.Function):
    """`F.linear(x, W, b)` with W a StreamedWeight; the weight gradient goes to `W.consume`."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: StreamedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.weight = weight
        return torch.cat([F.linear(x, weight.rows(start, end), None if bias is None else bias[start:end])
                          for start, end in weight.row_blocks()], dim=-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        weight = ctx.weight
        g = grad.reshape(-1, grad.shape[-1])
        grad_x = None
        if ctx.needs_input_grad[0]:  # as autograd's mm backward: g @ W, here over column blocks of W
            grad_x = torch.cat([g.mm(weight.columns(start, end)) for start, end in weight.column_blocks()],
                               dim=1).view(x.shape)
        if weight.consume is not None:  # each stacked batch's g.T @ x, at the candidates
            xs = x.reshape(weight.stacked, -1, x.shape[-1])
            gs = g.reshape(weight.stacked, -1, g.shape[-1])
            for part in range(weight.stacked):
                weight.consume(_gradient_at_candidates(weight, gs[part], xs[part]), part)
        return grad_x, None, None  # bias gradients are never read: biases are not prunable


def _gradient_at_candidates(weight: StreamedWeight, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """g.T @ x over row blocks, each read at the candidates and dropped: no dense weight gradient."""
    candidates = weight._candidates()
    values = torch.empty(candidates.count())
    for start, end in weight.row_blocks():
        low, high = candidates.range_bounds(start * weight.width, end * weight.width)
        block = torch.mm(g[:, start:end].t(), x, out=_GRADIENT.take((end - start, x.shape[1])))
        values[low:high] = block.view(-1).index_select(0, candidates.positions[low:high] - start * weight.width)
    return values


class StreamedEmbedding(torch.autograd.Function):
    """`F.embedding(ids, W)` with W a StreamedWeight; the weight gradient at candidates to `W.consume`."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: StreamedWeight, anchor: torch.Tensor) -> torch.Tensor:
        used, where = torch.unique(ids, return_inverse=True)
        ctx.weight, ctx.used = weight, used
        ctx.save_for_backward(where)
        return weight.rows_of(used).index_select(0, where.view(-1)).view(*ids.shape, weight.width)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (where,) = ctx.saved_tensors
        weight = ctx.weight
        if weight.consume is not None:
            flat, chosen = weight.candidates_in_rows(ctx.used)
            wheres = where.view(weight.stacked, -1)
            grads = grad.reshape(weight.stacked, -1, weight.width)
            for part in range(weight.stacked):
                rows = torch.zeros(ctx.used.numel(), weight.width)  # the used rows of the dense gradient
                rows.index_add_(0, wheres[part], grads[part])  # token order
                values = torch.zeros(weight.candidates.count())
                values[chosen] = rows.view(-1).index_select(0, flat)
                weight.consume(values, part)
        return None, None, None


def streamed_forward(module: torch.nn.Module, weight: StreamedWeight) -> Callable:
    """A forward for `module` (Linear or Embedding) that computes with `weight`."""
    if isinstance(module, torch.nn.Linear):
        bias = module.bias
        return lambda x: StreamedLinear.apply(x, weight, None if bias is None else bias.detach())
    if isinstance(module, torch.nn.Embedding):
        # The anchor requires grad so autograd calls backward (ids never do).
        anchor = torch.zeros((), requires_grad=True)
        return lambda ids: StreamedEmbedding.apply(ids, weight, anchor)
    raise ValueError(f"streaming cannot compute {type(module).__name__} from a stored weight "
                     "(Linear and Embedding only)")
