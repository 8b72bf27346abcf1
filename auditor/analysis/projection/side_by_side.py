"""The audited run and each of its projections side by side: per stage, repeated calls folded
(`HessianStat.add_batch` x 112 audited, x 1,792 at the target), and per component, instances
folded (`HessianStat.H`: 14 audited, 224 at the target).

    for side in side_by_side(record):
        side.label, side.stages, side.components, side.notes
    for target in by_target(side_by_side(record)):   # scaled and traced of one target as columns
        target.sides, target.stages, target.components

A stage's figures are the highest over its calls (live-tensor peak, RSS peak); a component's
are the most its instances held together at one stage end, as in the report's components
over the run. Stages and components the target has and the audited run lacks (a loop that
runs once per layer has more calls) are listed too.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from auditor.analysis.projection.reasons import component_why
from auditor.analysis.projection.standing import UNCALIBRATED, scaled_caveat
from auditor.analysis.run.component_history import fold_component
from auditor.record import derived
from auditor.record.schema import RunRecord

_CALL_NUMBER = re.compile(r"#\d+(?=/|$)")


@dataclass
class StageSide:
    name: str            # the stage path, call numbers dropped
    depth: int
    audited_calls: int = 0
    target_calls: int = 0
    audited_tensor_peak: int | None = None
    target_tensor_peak: int | None = None
    audited_rss_peak: int | None = None
    target_rss_peak: int | None = None
    target_rss_low: int | None = None   # its band (auditor.analysis.projection.rss_band), the most over its calls
    target_rss_high: int | None = None
    target_miss: int | None = None  # a call's scaled figures its drivers do not explain: their miss


@dataclass
class ComponentSide:
    name: str
    category: str
    audited: int = 0          # most alive at once at one stage end
    target: int | None = None
    audited_instances: int = 0
    target_instances: int = 0
    target_miss: int | None = None  # an instance's scaled bytes its drivers do not explain: the miss
    why: str | None = None    # why its target figure is below the audited one (module buffers...)


@dataclass
class SideBySide:
    method: str
    target: str
    stages: list[StageSide] = field(default_factory=list)
    components: list[ComponentSide] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the figures rest on
    rss_band_basis: str | None = None  # how its RSS bands were made, in one sentence
    # how its target model was built (auditor.capture.tracing.model_from's target_built)
    target_model: str | None = None

    uncalibrated: bool = False  # a scaled projection fitted on no calibration run

    @property
    def label(self) -> str:
        return f"{self.method}: {self.target}"

    @property
    def how(self) -> str:
        return self.method + (", uncalibrated" if self.uncalibrated else "")


@dataclass
class TargetSides:
    """Every projection of one target together: a row per stage (component) with each method's
    figures, so scaled and traced are columns of one table. A row's audited figures are the same
    on every side (one record); `None`: that side has no such row."""
    target: str
    sides: list[SideBySide]
    stages: list[tuple[StageSide, list[StageSide | None]]]
    components: list[tuple[ComponentSide, list[ComponentSide | None]]]


def by_target(sides: list[SideBySide]) -> list[TargetSides]:
    """`sides` grouped by target, in their order (scaled before traced)."""
    targets: dict[str, list[SideBySide]] = {}
    for side in sides:
        targets.setdefault(side.target, []).append(side)
    return [TargetSides(target, group, _together(group, "stages"), _together(group, "components"))
            for target, group in targets.items()]


def _together(group: list[SideBySide], rows: str) -> list:
    names: dict[str, object] = {}
    for side in group:
        for row in getattr(side, rows):
            names.setdefault(row.name, row)
    found = [{row.name: row for row in getattr(side, rows)} for side in group]
    return [(first, [each.get(name) for each in found]) for name, first in names.items()]


def folded_path(path: str) -> str:
    return _CALL_NUMBER.sub("", path)


def side_by_side(record: RunRecord) -> list[SideBySide]:
    """One per projection of the record (auditor.record.derived.Projection, checked) that has
    per-stage figures."""
    return [_side(record, item) for item in derived.projections(record.annotations.get("projections"))
            if item.get("stages")]


def _side(record: RunRecord, projection: derived.Projection) -> SideBySide:
    side = SideBySide(method=str(projection.get("method", "scaled")),
                      target=str(projection.get("target", "?")), notes=_notes(projection),
                      uncalibrated=scaled_caveat(projection) == UNCALIBRATED,
                      rss_band_basis=((projection.get("peak") or {}).get("rss_band") or {}).get("basis"),
                      target_model=(projection.get("target_built") or {}).get("says"))
    side.stages = _stages(record, projection)
    side.components = _components(record, projection)
    return side


def _notes(projection: derived.Projection) -> list[str]:
    notes = []
    if projection.get("incomplete"):
        notes.append(f"{projection['incomplete']}: the stages after it are not projected")
    caveat = scaled_caveat(projection)  # not projected, or scaled on no calibration run
    if caveat:
        notes.append(caveat)
    as_rank = projection.get("traced_as_rank")
    if as_rank:
        notes.append(rank_caveat(as_rank))
    notes += _sized_empty(projection)
    if projection.get("leaves_out"):
        notes.append(str(projection["leaves_out"]))
    return notes


def _sized_empty(projection: derived.Projection) -> list[str]:
    """Value-dependent sizes traced as empty make the figures a lower bound: the sites the traced
    run had no ratio for (`data_dependent.unknown`). Sites sized from the real run's ratios are
    estimates, said by the estimate note, not a lower bound. A projection that lists no sites
    (an older one) is a lower bound unless it says it estimated them."""
    found = projection.get("data_dependent")
    if isinstance(found, dict):
        unknown = [s for s in found.get("unknown") or [] if isinstance(s, dict)]
        if not unknown:
            return []
        sites = ", ".join(f"{s.get('op', '?')} at {s.get('site', '?')}" for s in unknown[:3])
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        return [f"value-dependent sizes with no ratio observed in the real run ({sites}{more}) were "
                "traced as empty: the figures are a lower bound there"]
    dependent = projection.get("data_dependent_ops") or {}
    if dependent and not projection.get("estimates"):
        ops = ", ".join(f"{op} x {n:,}" for op, n in dependent.items())
        return [f"value-dependent sizes ({ops}) were traced as empty: the figures are a lower bound"]
    return []


def _stages(record: RunRecord, projection: derived.Projection) -> list[StageSide]:
    rows: dict[str, StageSide] = {}
    for stage in record.stages:
        if stage.status == "open":
            continue
        row = _row(rows, stage.path)
        row.audited_calls += 1
        row.audited_tensor_peak = _most(row.audited_tensor_peak,
                                        stage.live_tensors.peak if stage.live_tensors else None)
        row.audited_rss_peak = _most(row.audited_rss_peak, stage.rss.peak)
    for projected in projection["stages"]:
        row = _row(rows, projected["path"])
        row.target_calls += 1
        if projected.get("explained") is False:  # never a number (auditor.analysis.projection.scaled)
            row.target_miss = _most(row.target_miss, projected.get("miss"))
            continue
        row.target_tensor_peak = _most(row.target_tensor_peak, projected.get("tensor_peak"))
        row.target_rss_peak = _most(row.target_rss_peak, projected.get("rss_peak"))
        band: derived.RssBand = projected.get("rss_band") or {}
        row.target_rss_low = _most(row.target_rss_low, band.get("low"))
        row.target_rss_high = _most(row.target_rss_high, band.get("high"))
    return list(rows.values())


def _row(rows: dict[str, StageSide], path: str) -> StageSide:
    name = folded_path(path)
    if name not in rows:
        rows[name] = StageSide(name=name, depth=name.count("/"))
    return rows[name]


def _most(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _components(record: RunRecord, projection: derived.Projection) -> list[ComponentSide]:
    found: dict[str, ComponentSide] = {}
    for stage in record.stages:
        _fold_stage_end(found, {name: (c.category, c.bytes) for name, c in (stage.components or {}).items()},
                        "audited")
    for projected in projection["stages"]:
        _fold_stage_end(found, {name: (str(c.get("category", "other")), c.get("projected") or 0)
                                for name, c in (projected.get("components") or {}).items()}, "target")
        for name, item in (projected.get("components") or {}).items():
            if item.get("explained") is False:  # never a number (auditor.analysis.projection.scaled)
                side = found[fold_component(name)]
                side.target_miss = _most(side.target_miss, item.get("residual"))
            why = component_why(item, projection, record)
            if why is not None:
                found[fold_component(name)].why = why.text
    return sorted(found.values(), key=lambda c: -max(c.target or 0, c.audited))


def _fold_stage_end(found: dict[str, ComponentSide], components: dict[str, tuple[str, int]], side: str) -> None:
    """One stage end's components (name: (category, bytes)) folded into `found`'s `side`."""
    totals: dict[str, tuple[int, int]] = {}
    for name, (category, size) in components.items():
        folded = fold_component(name)
        if folded not in found:
            found[folded] = ComponentSide(folded, category)
        total, count = totals.get(folded, (0, 0))
        totals[folded] = (total + size, count + 1)
    for folded, (total, count) in totals.items():
        item = found[folded]
        if side == "audited":
            item.audited, item.audited_instances = max(item.audited, total), max(item.audited_instances, count)
        else:
            item.target = max(item.target or 0, total)
            item.target_instances = max(item.target_instances, count)


def rank_caveat(as_rank: dict) -> str:
    """What a rank's traced projection rests on (auditor.jobs.script_projection._as_rank)."""
    return (f"rank {as_rank['rank']} of {as_rank['world_size']}, traced on torch's fake process group: "
            "the buffers the real backend (gloo, NCCL) allocates for collectives are not traced, so "
            "the figures can be low (docs/multi-rank.md: per-rank projection of your own script)")
