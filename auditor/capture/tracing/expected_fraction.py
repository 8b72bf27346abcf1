"""`auditor.expect_fraction`: a program declares what fraction of its input a value-dependent
selection keeps, for traced runs that have no real run's ratio at that site.

    with auditor.expect_fraction(0.1):      # about a tenth of the weights become candidates
        candidates = weights[scores < threshold]

A no-op in real runs (a list append and pop); imports nothing heavy, as `auditor.capture.stage`.
How a traced run uses it: auditor.capture.tracing.data_dependent.
"""
from __future__ import annotations

import contextlib
import threading

_declared = threading.local()


@contextlib.contextmanager
def expect_fraction(fraction: float):
    """Declare that value-dependent selections in the body keep about `fraction` of their
    input; a traced run uses it where the real run observed nothing at that site."""
    if not 0.0 <= float(fraction) <= 1.0:
        raise ValueError(f"expect_fraction takes a fraction from 0 to 1, not {fraction!r}")
    stack = _declared.__dict__.setdefault("stack", [])
    stack.append(float(fraction))
    try:
        yield
    finally:
        stack.pop()


def declared_fraction() -> float | None:
    """The innermost declared fraction on this thread, or None."""
    stack = getattr(_declared, "stack", None)
    return stack[-1] if stack else None
