"""Calibration data without downloads: seeded synthetic token ids, or a local text file.

A calibration set is a plain list of `[batch, sequence]` token-id tensors: re-iterable from
the start, which is what a pruner that restarts its loader each pass needs.
"""
from __future__ import annotations

import os

import torch


def _check_shape(sequence_length: int, batch_size: int, num_batches: int) -> None:
    for name, value in (("sequence_length", sequence_length), ("batch_size", batch_size),
                        ("num_batches", num_batches)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def synthetic_batches(vocab_size: int, sequence_length: int = 128, batch_size: int = 1,
                      num_batches: int = 2, seed: int = 0) -> list[torch.Tensor]:
    """Uniform random token ids from a private generator: same seed, same batches."""
    _check_shape(sequence_length, batch_size, num_batches)
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (batch_size, sequence_length), generator=generator)
            for _ in range(num_batches)]


def text_file_batches(text_path: str, tokenizer_folder: str, sequence_length: int = 128,
                      batch_size: int = 1, num_batches: int = 2) -> list[torch.Tensor]:
    """Consecutive windows of a local text file, tokenized by a local tokenizer folder."""
    _check_shape(sequence_length, batch_size, num_batches)
    for path, what in ((text_path, "text file"), (tokenizer_folder, "tokenizer folder")):
        if not os.path.exists(path):
            raise ValueError(f"{what} {path!r} does not exist")
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    with open(text_path, encoding="utf-8") as f:
        ids = tokenizer(f.read(), return_tensors="pt")["input_ids"][0]
    needed = sequence_length * batch_size * num_batches
    if ids.numel() < needed:
        raise ValueError(f"{text_path!r} has {ids.numel()} tokens; {needed} are needed "
                         f"({num_batches} batches of {batch_size} x {sequence_length})")
    windows = ids[:needed].view(num_batches, batch_size, sequence_length)
    return list(windows.unbind(0))
