"""Traced runs on fake tensors: the target's model built as the program builds it, data-dependent sizes."""
