"""A side of a comparison: a command run as a fresh process, by name, with the tolerance it
declares for its result.

A command is a list of arguments (no shell). Any argument may contain `{run_dir}`, replaced
by the run's own empty folder, so a child can be told where to write its files. A child that
cannot speak the result protocol (`protocol.py`) is read after it exits by `collect(run_dir)`,
which returns the same fields the protocol would.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

RUN_DIR = "{run_dir}"


@dataclass(frozen=True)
class Tolerance:
    """How many result elements may differ from the baseline's: `elements` (a count) or
    `fraction` (of the baseline result's elements). Exact is `Tolerance(elements=0)`."""
    elements: int | None = None
    fraction: float | None = None

    def __post_init__(self):
        if (self.elements is None) == (self.fraction is None):
            raise ValueError("a tolerance is either a number of elements or a fraction, not both")
        if self.elements is not None and (isinstance(self.elements, bool) or not isinstance(self.elements, int)
                                          or self.elements < 0):
            raise ValueError(f"a tolerance in elements is a whole number >= 0, got {self.elements!r}")
        if self.fraction is not None and not 0 <= self.fraction <= 1:
            raise ValueError(f"a tolerance as a fraction is between 0 and 1, got {self.fraction!r}")

    @classmethod
    def parse(cls, text: str) -> Tolerance:
        """`K` (a whole number of elements), `F` with a decimal point (a fraction of the
        elements: 0.001) or `P%` (a percentage: 0.1%)."""
        text = text.strip()
        try:
            if text.endswith("%"):
                return cls(fraction=float(text[:-1]) / 100)
            if any(mark in text for mark in ".eE"):
                return cls(fraction=float(text))
            return cls(elements=int(text))
        except ValueError as error:
            if "tolerance" in str(error):
                raise
            raise ValueError(f"tolerance {text!r} is not a number: give a count of elements (10), "
                             f"a fraction (0.001) or a percentage (0.1%)") from None

    @classmethod
    def from_json(cls, data: dict | None) -> Tolerance | None:
        if data is None:
            return None
        if not isinstance(data, dict) or set(data) - {"elements", "fraction"}:
            raise ValueError(f"a tolerance is {{\"elements\": K}} or {{\"fraction\": F}}, got {data!r}")
        return cls(elements=data.get("elements"), fraction=data.get("fraction"))

    def to_json(self) -> dict:
        return {"elements": self.elements} if self.elements is not None else {"fraction": self.fraction}

    def allowance(self, total_elements: int | None) -> int | None:
        """The most elements that may differ; None when a fraction meets an unknown total."""
        if self.elements is not None:
            return self.elements
        if self.fraction is None or total_elements is None:
            return None
        return int(self.fraction * total_elements)

    def __str__(self) -> str:
        if self.elements is not None:
            return "exact" if self.elements == 0 else f"{self.elements:,} elements"
        return f"{self.fraction:g} of elements"


EXACT = Tolerance(elements=0)


@dataclass
class Side:
    """One command to measure. `tolerance` None: what the run declares, else exact."""
    name: str
    command: list[str]
    tolerance: Tolerance | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    collect: Callable[[Path], dict] | None = None

    def __post_init__(self):
        if not self.name:
            raise ValueError("a side needs a name")
        if isinstance(self.command, str) or not self.command or not all(isinstance(a, str) for a in self.command):
            raise ValueError(f"side {self.name!r}: the command is a non-empty list of arguments, got {self.command!r}")

    @classmethod
    def call(cls, name: str, target: str, tolerance: Tolerance | None = None, **options) -> Side:
        """A Python callable `module:function` (no arguments), called in a fresh interpreter.
        What it returns is its result: a dict of tensors (compared element by element), str
        or bytes (compared by digest), or None. See `auditor/comparison/call.py`."""
        module, _, function = target.partition(":")
        if not module or not function:
            raise ValueError(f"side {name!r}: a callable is named module:function, got {target!r}")
        from auditor.capture.fresh_process import python_command
        return cls(name, python_command("auditor.comparison.call", target), tolerance, **options)

    def command_for(self, run_dir: Path) -> list[str]:
        return [argument.replace(RUN_DIR, str(run_dir)) for argument in self.command]
