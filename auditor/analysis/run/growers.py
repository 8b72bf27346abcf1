"""What grew inside a stage: the components it added, or its temporaries by creating op, from
the live-tensor meter's composition at its high, else from the census before and after it."""
from __future__ import annotations

from dataclasses import dataclass

from auditor.analysis.run.stages import census_before
from auditor.record.schema import AtPeak, RunRecord, Stage


@dataclass
class Grower:
    """State that grew inside a stage: a component (by owner), or temporaries by creating op."""
    name: str             # a component name, or "temporaries from `op` in `stage`"
    category: str
    bytes: int
    kept: bool            # still alive at the stage's end
    basis: str            # "at_peak" (alive at the live-tensor high) or "census" (end minus before)


def within(path: str | None, stage_path: str) -> bool:
    """Whether a stage path is the stage itself or a stage inside it."""
    return path is not None and (path == stage_path or path.startswith(stage_path + "/"))


def growers(record: RunRecord, stage: Stage) -> list[Grower] | None:
    """What the stage added, largest first: from its `live_tensors.at_peak` (storages created
    inside it and alive at its live-tensor high) when the record has it, else from the census
    at its end minus the census just before it began; None when neither can tell."""
    at_peak = stage.live_tensors.at_peak if stage.live_tensors else None
    if at_peak is not None:
        groups: dict[tuple[str, str], tuple[int, bool]] = {}
        for row in at_peak.rows:
            if not within(row.created_in, stage.path):
                continue  # alive before the stage began: it did not grow here
            if row.owner:
                key = (row.owner, row.category or "other")
            else:
                op = f"`{row.op}`" if row.op else "an unknown op"
                key = (f"temporaries from {op} in `{row.created_in}`", row.category or "other")
            held, kept = groups.get(key, (0, False))
            groups[key] = (held + row.bytes, kept or bool(row.alive_at_end))
        return sorted((Grower(name, category, b, kept, "at_peak") for (name, category), (b, kept) in groups.items()),
                      key=lambda g: (-g.bytes, g.name))
    before = census_before(record, stage)
    if stage.components is None or before is None:
        return None
    earlier = before.components or {}
    grown = [Grower(name, c.category or "other", c.bytes - (earlier[name].bytes if name in earlier else 0),
                    True, "census") for name, c in stage.components.items()]
    return sorted((g for g in grown if g.bytes > 0), key=lambda g: (-g.bytes, g.name))


def at_peak_categories(at_peak: AtPeak) -> list[tuple[str, int]]:
    """An `at_peak` composition's bytes by category, largest first (rows left out apart)."""
    totals: dict[str, int] = {}
    for row in at_peak.rows:
        category = row.category or "other"
        totals[category] = totals.get(category, 0) + row.bytes
    return sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))
