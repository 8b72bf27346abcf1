"""Why a projected figure does not grow with the model, in plain words, where the report prints it.

    whys = shrinking(record, "prune/GradProbe.record_reduced_gradients")
    whys[("mistral-7b", "scaled")]["model.buffers"].text     # module buffers are each architecture's own

A scaled projection grows each figure by its drivers (`auditor.analysis.projection.scaled`). A figure
that comes out smaller at a larger target rests on a driver the target has less of: module
buffers (each architecture has its own: GPT-Neo's causal masks do not exist in Mistral), tied
parameters (none in an untied model), tokens x vocabulary. A component's figure is still
printed, with the reason beside it. A transient inside a stage is not printed: its fit names the
driver that made it here, not what makes it at the target, so it says "not projected" and why
(a traced projection measures the target's own).
"""
from __future__ import annotations

from dataclasses import dataclass

from auditor.facts import units
from auditor.record import derived
from auditor.record.derived import Grown, Projection
from auditor.record.schema import RunRecord

TRANSIENT = "transient"   # the key of the stage's transient among its components' names

DRIVER_WORDS = {
    "constant": "a fixed size",
    "tied": "parameters shared by two modules (a tied embedding and head)",
    "largest": "the largest parameter tensor",
    "parameters": "the parameters",
    "matrix parameters": "the parameters of matrices",
    "layer": "one decoder layer's parameters",
    "activations": "tokens x layers x hidden",
    "logits": "tokens x vocabulary",
    "attention": "attention scores (batch x heads x sequence^2 x layers)",
    "buffers": "the model's module buffers",
}
ELEMENT_DRIVERS = ("tied", "largest", "parameters", "matrix parameters", "layer")


@dataclass(frozen=True)
class Why:
    text: str
    projected: bool   # False: the figure is not printed, "not projected" and this reason are


def shrinking(record: RunRecord, stage: str) -> dict[tuple[str, str], dict[str, Why]]:
    """{(target, method): {component name or TRANSIENT: why}} for the scaled projections' figures
    at `stage` that come out below what was measured here."""
    found: dict[tuple[str, str], dict[str, Why]] = {}
    for item in derived.projections(record.annotations.get("projections")):
        if item.get("method", "scaled") != "scaled" or not item.get("stages"):
            continue
        drivers = (item.get("fit") or {}).get("drivers") or {}
        entry = next((e for e in item["stages"] if e.get("path") == stage), None)
        if entry is None or not drivers:
            continue
        target = str(item.get("target", "?"))
        audited = ((record.annotations.get("workload") or {}).get("architecture")) or "the audited model"
        whys: dict[str, Why] = {}
        for name, c in (entry.get("components") or {}).items():
            why = _component(c, drivers, target, audited)
            if why is not None:
                whys[name] = why
        transient: Grown = entry.get("transient") or {}
        projected = transient.get("projected")
        if projected is not None and projected < (transient.get("bytes") or 0):
            whys[TRANSIENT] = Why(_transient(transient, drivers, target), projected=False)
        if whys:
            found[(target, str(item.get("method", "scaled")))] = whys
    return found


def component_why(c: Grown, projection: Projection, record: RunRecord) -> Why | None:
    """Why one projected component (a scaled projection's stage entry) falls below its audited bytes."""
    if projection.get("method", "scaled") != "scaled":
        return None
    drivers = (projection.get("fit") or {}).get("drivers") or {}
    audited = ((record.annotations.get("workload") or {}).get("architecture")) or "the audited model"
    return _component(c, drivers, str(projection.get("target", "?")), audited)


def _component(c: Grown, drivers: dict, target: str, audited: str) -> Why | None:
    projected, measured = c.get("projected"), c.get("bytes")
    if projected is None or measured is None or projected >= measured:
        return None
    shares = c.get("shares") or {}
    if set(shares) == {"buffers"}:
        theirs = (drivers.get("buffers") or {}).get("target")
        own = f"{target}'s total {units.size(theirs)}" if theirs is not None else f"{target}'s are its own"
        return Why(f"module buffers are each architecture's own: {own}; these ({units.size(measured)}) are "
                   f"{audited}'s and do not exist there", projected=True)
    return Why(f"grows with {_shrinking_words(shares, drivers, target)}", projected=True)


def _transient(transient: Grown, drivers: dict, target: str) -> str:
    words = _shrinking_words(transient.get("shares") or {}, drivers, target)
    return (f"the fit explains this stage's transient by {words}: "
            "it says what made it here, not what makes it at the target (a traced projection measures that)")


def _shrinking_words(shares: dict, drivers: dict, target: str) -> str:
    """The drivers of `shares` the target has less of, in words with their sizes here and there."""
    parts = []
    for driver in sorted(shares, key=lambda d: -abs(shares[d])):
        ratio = (drivers.get(driver) or {}).get("ratio")
        if ratio is None or ratio >= 1:
            continue
        here, there = (drivers[driver].get("audited"), drivers[driver].get("target"))
        words = DRIVER_WORDS.get(driver, f"`{driver}`")
        sizes = (f", {_amount(driver, here)} here and {_amount(driver, there)} in {target}"
                 if here is not None and there is not None else "")
        parts.append(words + sizes)
    return "; ".join(parts) or "drivers the target has less of"


def _amount(driver: str, value: int) -> str:
    if driver == "buffers":
        return units.size(value)
    if not value:
        return "none"
    return f"{value:,} elements" if driver in ELEMENT_DRIVERS else f"{value:,}"
