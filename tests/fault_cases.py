"""The shape of a reliability case that is not a fault injected into a running script (a planted
symlink, a damaged record line, a job command signalled, records of two unrelated runs):
each such case is a function of an empty folder returning `Held`. A test module of the fault
suite (tests/test_faults*.py) lists them in `CASES = {name: case}` beside its `FAULTS` (faults
injected into a script alone and under `auditor run`, giving `test_faults.Injected`);
its tests assert each `Held.held`, and benchmarks/reliability.py runs and counts them all.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class Held:
    held: bool  # the auditor behaved as it must
    seen: str  # one line: what happened, in words (shown in reports/reliability.md)


Case = Callable[[Path], Held]


@pytest.fixture(autouse=True)
def not_a_rank(monkeypatch):
    """The cases' own audits are plain runs, whatever launched the tests (a module that imports
    this fixture has it on each of its tests)."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
