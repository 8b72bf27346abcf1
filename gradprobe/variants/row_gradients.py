"""The output head's and the token embedding's weight gradients, folded into G a few rows at a time.

A causal LM's head [vocab, hidden] and token embedding [vocab, hidden] are its largest tensors;
through them autograd makes dense [vocab, hidden] gradients: the head's, the embedding's (zero but
for the <= batch x sequence rows the batch reads) and, where they are tied, their sum. Three of
them (147 MiB each on TinyStories-33M) are alive at once at the peak of a backward pass. Here no
such gradient exists:

    head       its logits come from the weight detached, so autograd computes only the gradient of
               the head's input; a hook on the logits takes dL/dlogits and makes the weight's
               gradient a vocabulary chunk at a time, `grad.t().mm(input)` as autograd does, with
               every chunk the same number of rows (the last one overlaps), so each element is the
               same dot product, bit for bit (tests/test_gradprobe_variants_rows.py checks it).
    embedding  an autograd function whose backward makes only the rows the batch read, with
               autograd's own kernel (`embedding_dense_backward`) on the rows renumbered 0..k-1.
    tied       a row both touch is the head's part plus the embedding's, one IEEE addition as in
               autograd's accumulation; rows the batch did not read get the head's part alone.

Rows whose gradient is complete are handed to `record.update_rows`. A parameter handled here
gets no gradient from autograd at all; one that does (used elsewhere too) is an error.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager

import torch
import torch.nn.functional as F

from ..blocks import BLOCK_ELEMENTS
from .candidate_record import CandidateMaxima

HEAD_CHUNK_ELEMENTS = BLOCK_ELEMENTS // 4  # a head chunk's gradient: 4 MiB in fp32
# At least this many rows a chunk: a one-row chunk is a matrix-vector product, whose kernel sums in
# another order than the matrix product's (MKL: different bits at 1 row, the same from 16 up).
MIN_HEAD_CHUNK_ROWS = 16


@contextmanager
def gradients_by_rows(model: torch.nn.Module, parameters: Mapping[str, torch.Tensor],
                      record: CandidateMaxima) -> Iterator[set[str]]:
    """While active, the head's and the token embedding's weight gradients go to `record` by rows.

    Yields the names handled (empty for a model whose head or embedding is of another kind; those
    gradients then reach `.grad` as usual).
    """
    names = {id(p): name for name, p in parameters.items()}
    head, embedding = _head(model, names), _embedding(model, names)
    splits: dict[str, RowSplit] = {}
    with ExitStack() as undo:
        for module, kind in ((embedding, "embedding"), (head, "head")):
            if module is not None:
                name = names[id(module.weight)]
                split = splits.setdefault(name, RowSplit(name, module.weight.shape, record))
                undo.enter_context(_patched_forward(module, kind, split))
        yield set(splits)


def _head(model, names) -> torch.nn.Linear | None:
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if type(head) is torch.nn.Linear and head.weight.requires_grad and id(head.weight) in names:
        return head
    return None


def _embedding(model, names) -> torch.nn.Embedding | None:
    embedding = getattr(model, "get_input_embeddings", lambda: None)()
    if (type(embedding) is torch.nn.Embedding and embedding.weight.requires_grad
            and id(embedding.weight) in names and embedding.max_norm is None and not embedding.sparse):
        return embedding  # max_norm renormalises the weight in forward; sparse gradients are another path
    return None


@contextmanager
def _patched_forward(module: torch.nn.Module, kind: str, split: RowSplit):
    def head_forward(x):
        logits = F.linear(x, module.weight.detach(), module.bias)
        split.expect("head")
        if logits.requires_grad:
            inputs = x.detach().reshape(-1, x.shape[-1])
            logits.register_hook(lambda grad: split.head_part(grad, inputs))
        return logits

    def embedding_forward(ids):
        split.expect("embedding", ids, module.padding_idx, module.scale_grad_by_freq)
        return _EmbeddingRows.apply(module.weight, ids, module, split)

    module.forward = head_forward if kind == "head" else embedding_forward
    try:
        yield
    finally:
        del module.forward  # the class's own forward again


class _EmbeddingRows(torch.autograd.Function):
    """`F.embedding`, whose backward hands the rows' gradient to the split and none to the weight."""

    @staticmethod
    def forward(ctx, weight, ids, module, split):
        ctx.split = split
        return F.embedding(ids, weight, module.padding_idx, None, 2.0, module.scale_grad_by_freq, False)

    @staticmethod
    def backward(ctx, grad):
        ctx.split.embedding_part(grad)
        return None, None, None, None


class RowSplit:
    """One parameter's gradient in one backward, from its head part, its embedding part, or both."""

    def __init__(self, name: str, shape: torch.Size, record):
        self.name, self.rows_count, self.record = name, shape[0], record
        self._new_pass()

    def _new_pass(self) -> None:
        self.expected: set[str] = set()
        self.done: dict[str, torch.Tensor | None] = {}
        # Set by the embedding's forward: which rows it reads, sorted, and the ids it read them by.
        self.touched: torch.Tensor | None = None
        self.rows: torch.Tensor | None = None
        self.ids: torch.Tensor | None = None

    def expect(self, part: str, ids: torch.Tensor | None = None, padding_idx: int | None = None,
               by_frequency: bool = False) -> None:
        """A forward used the weight as `part`; the embedding part says which rows it reads."""
        if self.expected and self.expected == set(self.done):
            self._new_pass()  # the previous backward is complete
        if part in self.expected:
            raise RuntimeError(f"{self.name} is used twice as {part} in one forward; "
                               "row gradients take one head use and one embedding use")
        self.expected.add(part)
        if ids is not None:
            self.ids, self.padding_idx, self.by_frequency = ids, padding_idx, by_frequency
            flat = ids.reshape(-1)
            self.touched = torch.zeros(self.rows_count, dtype=torch.bool, device=ids.device)
            self.touched[flat] = True
            self.rows = self.touched.nonzero().squeeze(1)  # sorted

    def head_part(self, grad: torch.Tensor, inputs: torch.Tensor) -> None:
        grad = grad.reshape(-1, grad.shape[-1])
        vocab = grad.shape[1]
        step = min(vocab, max(MIN_HEAD_CHUNK_ROWS, HEAD_CHUNK_ELEMENTS // inputs.shape[1]))
        read, touched = self.rows, self.touched  # known when the batch also reads the weight as embedding
        stash = None if read is None else inputs.new_empty(read.shape[0], inputs.shape[1])
        for start in range(0, vocab, step):
            first = min(start, vocab - step)  # every chunk `step` rows: the same kernel, the same bits
            part = grad[:, first:first + step].t().mm(inputs)[start - first:]
            stop = start + part.shape[0]
            skip = None if touched is None else touched[start:stop]
            if read is not None and stash is not None:
                low, high = (int(torch.searchsorted(read, edge)) for edge in (start, stop))
                stash[low:high] = part[read[low:high] - start]
            self.record.update_rows(self.name, start, part, skip)
            del part
        self._arrived("head", stash)

    def embedding_part(self, grad: torch.Tensor) -> None:
        touched, read, ids = self.touched, self.rows, self.ids
        if touched is None or read is None or ids is None:
            raise RuntimeError(f"{self.name}: an embedding backward without its forward")
        renumbered = torch.cumsum(touched, 0) - 1  # row -> its place among the rows read
        padding = -1 if self.padding_idx is None else self.padding_idx
        if padding >= 0:
            padding = int(renumbered[padding]) if bool(touched[padding]) else -1
        rows = torch.ops.aten.embedding_dense_backward(
            grad, renumbered[ids], read.shape[0], padding, self.by_frequency)
        self._arrived("embedding", rows)

    def _arrived(self, part: str, rows: torch.Tensor | None) -> None:
        self.done[part] = rows
        if set(self.done) != self.expected or self.rows is None or not len(self.rows):
            return
        # every part that came is a tensor here: the head stashes its rows whenever `self.rows` is known
        parts = [done for done in (self.done.get("head"), self.done.get("embedding")) if done is not None]
        full = parts[0] if len(parts) == 1 else parts[0] + parts[1]  # one addition: order-free
        # one update per run of consecutive rows (not per row: a long batch reads thousands)
        breaks = (torch.nonzero(self.rows[1:] - self.rows[:-1] != 1).squeeze(1) + 1).tolist()
        for low, high in zip([0, *breaks], [*breaks, self.rows.shape[0]], strict=False):
            self.record.update_rows(self.name, int(self.rows[low]), full[low:high])
