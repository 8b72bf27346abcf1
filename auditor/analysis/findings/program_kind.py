"""What kind of program a run record shows: a training step, a pruner, an inference loop, or
unknown, decided from what the record holds, never from the names of stages or functions.

    kind = program_kind(record)
    kind.kind, kind.evidence      # "training", "the census names optimizer state (2.0 MiB)"

The evidence, strongest first:

    training   the census names optimizer state; or tensors made by `zeros_like` inside a staged
               call and kept after it add up to a whole multiple (1x, 2x) of the weights and
               nothing is a pruner's (an optimizer's per-parameter state: AdamW keeps two)
    pruning    the census names saved copies or gradient records, or bool masks made inside a
               staged call are kept after it (module buffers are the model's own, not counted)
    inference  the live-tensor meter saw no gradient, no backward operator and none of the above
    unknown    the record cannot tell (no census and no meter, or gradients with neither
               optimizer state nor masks): remedies stay generic and the report says so

Remedies depend on it (`auditor.analysis.findings.remedies`): a training step's optimizer state is sharded
or made smaller, a pruner's copy is cut to what it restores.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from auditor.analysis.run.attribution import is_buffer, largest_weights
from auditor.analysis.run.stages import census_order
from auditor.facts import units
from auditor.record.schema import AtPeakRow, RunRecord

Kind = Literal["training", "pruning", "inference", "unknown"]
KINDS: tuple[Kind, ...] = ("training", "pruning", "inference", "unknown")

OPTIMIZER_STATE = "optimizer state"
PRUNER_CATEGORIES = ("saved copies", "gradient records")
GRADIENTS = "gradients"
MASKS = "masks"
STATE_OPS = ("aten::zeros_like",)  # how torch's optimizers make their per-parameter state
PARAMETER_OPS = ("aten::empty",)    # how modules make their parameters: masks made beside them are the model's
STATE_MULTIPLES = (1, 2, 3)         # momentum / Adagrad; Adam, AdamW; Adam with amsgrad
STATE_SLACK = 1e-4                  # beyond the multiple: scalars per parameter tensor, no more
KIND_WORDS = {"training": "a training step", "pruning": "a pruner", "inference": "an inference loop",
              "unknown": "a program of unknown kind"}


@dataclass(frozen=True)
class ProgramKind:
    kind: Kind
    evidence: str   # why, in one sentence a reader can check in the record

    @property
    def words(self) -> str:
        return KIND_WORDS[self.kind]


def program_kind(record: RunRecord) -> ProgramKind:
    """The kind of program the record shows, with the evidence it rests on."""
    categories = _census_categories(record)
    if categories.get(OPTIMIZER_STATE):
        return ProgramKind("training", f"the census names optimizer state "
                                       f"({units.size(categories[OPTIMIZER_STATE])})")
    pruner = [c for c in PRUNER_CATEGORIES if categories.get(c)]
    if pruner:
        return ProgramKind("pruning", "the census names " + " and ".join(
            f"{c} ({units.size(categories[c])})" for c in pruner))
    rows = _kept_rows(record)
    made_weights = {r.created_in for r in rows
                    if r.category == "weights" or (r.op in PARAMETER_OPS and r.category != MASKS)}
    masks = sum(r.bytes for r in rows if r.category == MASKS and r.created_in not in made_weights
                and not is_buffer(r.owner or ""))
    state = _optimizer_state(record, rows)
    if state is not None:
        return ProgramKind("training", state)
    if masks:
        return ProgramKind("pruning", f"bool masks made inside a staged call are kept after it ({units.size(masks)})")
    metered = any(s.live_tensors is not None and s.live_tensors.at_peak is not None for s in record.stages)
    backward = _backward_seen(record, categories)
    if backward:
        return ProgramKind("unknown", f"{backward}, but the record shows no optimizer state and no pruning masks")
    if metered:
        return ProgramKind("inference", "the live-tensor meter saw no gradient, no backward operator, "
                                        "no optimizer state and no pruning masks")
    return ProgramKind("unknown", "the record has no tensor census and no live-tensor meter to tell from")


def _census_categories(record: RunRecord) -> dict[str, int]:
    """Each category's most bytes at any census."""
    most: dict[str, int] = {}
    for stage in census_order(record):
        totals: dict[str, int] = {}
        for component in (stage.components or {}).values():
            totals[component.category] = totals.get(component.category, 0) + component.bytes
        for category, total in totals.items():
            most[category] = max(most.get(category, 0), total)
    return most


def _kept_rows(record: RunRecord) -> list[AtPeakRow]:
    """Live-tensor rows at the stages' highs made inside a staged call and alive at its end, each
    group once (later stages see the same tensors again)."""
    kept: dict[tuple, AtPeakRow] = {}
    for stage in record.stages:
        if stage.live_tensors is None or stage.live_tensors.at_peak is None:
            continue
        for row in stage.live_tensors.at_peak.rows:
            key = (row.created_in, row.owner, row.op, row.category)
            if row.created_in and row.alive_at_end and (key not in kept or kept[key].bytes < row.bytes):
                kept[key] = row
    return list(kept.values())


def _optimizer_state(record: RunRecord, rows: list) -> str | None:
    """Per-parameter state: `zeros_like` tensors kept after a staged call, a whole multiple of the
    weights (counted in the first stage that made them)."""
    weights = largest_weights(record)
    if not weights:
        return None
    made: dict[str, int] = {}
    for row in rows:
        if row.op in STATE_OPS and row.created_in and row.category not in (MASKS, *PRUNER_CATEGORIES):
            made[row.created_in] = made.get(row.created_in, 0) + row.bytes
    for where, total in made.items():
        for multiple in STATE_MULTIPLES:
            extra = total - multiple * weights  # a step count per parameter tensor (AdamW's `step`)
            if 0 <= extra <= STATE_SLACK * weights:
                how = "exactly" if extra == 0 else f"{units.size(extra)} above"
                return (f"tensors made by `zeros_like` in `{where}` and kept after it are {how} {multiple}x "
                        f"the weights ({units.size(total)}): an optimizer's per-parameter state")
    return None


def _backward_seen(record: RunRecord, categories: dict[str, int]) -> str | None:
    """Where the record shows a backward pass; `categories`: _census_categories(record)."""
    if categories.get(GRADIENTS):
        return f"the census names gradients ({units.size(categories[GRADIENTS])})"
    for stage in record.stages:
        if stage.live_tensors is None or stage.live_tensors.at_peak is None:
            continue
        ops = sorted({r.op for r in stage.live_tensors.at_peak.rows
                      if r.op and r.op.endswith(("_backward", "_backward_data"))})
        if ops:
            return f"backward operators ran (`{ops[0]}` in `{stage.path}`)"
    return None
