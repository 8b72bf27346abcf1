"""Projections as the reports show them: each of the record's `projections` (scaled or traced,
auditor.record.derived.Projection) read into the view the reports print, `ProjectionView`, grouped by target with
scaled before traced, and a scaled projection's headline held to the traced one of its target.
Pure functions of the run record.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from auditor.analysis.projection.estimated_bytes import estimate_note
from auditor.analysis.projection.standing import UNCALIBRATED, Failure, scaled_caveat, stand_in, traced_failure
from auditor.analysis.projection.validation import TARGETS, error
from auditor.facts import units
from auditor.record import derived
from auditor.record.schema import RunRecord


@dataclass
class ProjectedStage:
    components: dict[str, int | None] = field(default_factory=dict)  # name -> projected bytes
    unseen: int | None = None        # tensors the census cannot see, projected
    transient: int | None = None     # transient inside the stage, projected
    beyond_tensors: int | None = None  # RSS beyond live tensors (not scaled)
    tensor_peak: int | None = None
    rss_peak: int | None = None
    # parts a scaled projection's drivers do not explain, each with its miss (bytes): a component's
    # name, "unseen", "transient", "peak"; their figures above are None, never printed as numbers
    unexplained: dict[str, int | None] = field(default_factory=dict)
    estimated: dict[str, int] = field(default_factory=dict)  # name -> bytes resting on estimated
    # data-dependent sizes (auditor.analysis.projection.estimated_bytes)


@dataclass
class ProjectionView:
    """One projection of the run to a target, whatever its method, in one shape."""
    method: str
    target: str
    target_dtype: str | None
    peak_rss: int | None
    peak_stage: str | None
    live_tensor_peak: int | None
    stages: dict[str, ProjectedStage]
    caveat: str | None = None  # what the figures rest on, where a reader must not miss it
    unexplained: derived.Miss | None = None  # {stage, what, bytes}: the headline's drivers miss; its figures are None
    estimates: str | None = None  # how much rests on estimated data-dependent sizes, in words
    basis: str | None = None  # what its peak RSS is made of (auditor.analysis.projection.traced)
    failed: Failure | None = None  # its traced run ended in an error: no headline figure
    stand_in: str | None = None  # its target model is a stand-in architecture, in a sentence
    # a scaled projection held to the traced one of its target (`hold_to_traced`): why its headline
    # figures are not shown ("not shown: differs from ..."), else None; its figures stay for the details
    withheld: str | None = None
    unchecked: str | None = None  # a scaled projection with no traced one to hold it to: UNCHECKED

    @property
    def label(self) -> str:
        dtype = f" {self.target_dtype}" if self.target_dtype else ""
        return f"{self.method}: {self.target}{dtype}"


_METHOD_ORDER = {"scaled": 0, "traced": 1}


def projection_views(record: RunRecord) -> list[ProjectionView]:
    """The record's `projections` (auditor.record.derived.Projection, each checked: a projection
    of another shape is a RunRecordError naming its fault, never skipped), grouped by target with
    scaled before traced, a scaled projection's headline held to the traced one of its target."""
    views = []
    for item in derived.projections(record.annotations.get("projections"), "the record's projections"):
        view = _hide_unexplained(_projection_view(item), item)
        view.failed, view.stand_in = traced_failure(item), stand_in(item)
        views.append(view)
    views.sort(key=lambda v: (v.target, v.target_dtype or "", _METHOD_ORDER.get(v.method, 2), v.method))
    for view in views:
        hold_to_traced(view, views)
    return views


UNCHECKED = "unchecked: no traced projection to hold it to"


def hold_to_traced(view: ProjectionView, views: list[ProjectionView]) -> None:
    """A scaled projection's headline figures (peak RSS, peak live tensors) are shown only where
    they agree with the traced projection of the same target and dtype within the validation
    matrix's targets for the scaled method (auditor.analysis.projection.validation.TARGETS): the
    traced projection is exact on live tensors on every held-out case, so it is the check at a
    scale no real run reaches. Sets `withheld` where they differ by more, `unchecked` where there
    is no traced projection with figures to hold them to (none made, or its run failed)."""
    if view.method != "scaled" or (view.peak_rss is None and view.live_tensor_peak is None):
        return  # nothing shown to check (its drivers do not explain it: said as such)
    traced = next((v for v in views if v.method == "traced" and v.target == view.target
                   and v.target_dtype == view.target_dtype and v.failed is None
                   and v.live_tensor_peak is not None), None)
    if traced is None:
        view.unchecked = UNCHECKED
        return
    figures = {"peak live tensors": (view.live_tensor_peak, traced.live_tensor_peak),
               "peak RSS": (view.peak_rss, traced.peak_rss)}
    missed = []
    for target in TARGETS:
        if target.method != "scaled" or target.what not in figures:
            continue
        off = error(*figures[target.what])
        if off is not None and abs(off) > target.limit:
            missed.append(f"{off:+.1%} on {target.what} (target {target.limit:.0%})")
    if missed:
        view.withheld = "not shown: differs from the traced projection by " + " and ".join(missed)


def method_words(view: ProjectionView) -> str:
    """How a projection was made, as its column, the title and the fixes name it ("scaled,
    uncalibrated"; "scaled, unchecked: no traced projection to hold it to")."""
    return (view.method + (", uncalibrated" if view.caveat == UNCALIBRATED else "")
            + (f", {view.unchecked}" if view.unchecked else ""))


def _projection_view(item: derived.Projection) -> ProjectionView:
    stages = {}
    for entry in item["stages"]:
        if not isinstance(entry, dict) or "path" not in entry:
            continue
        stages[entry["path"]] = ProjectedStage(
            components={name: c.get("projected", c.get("bytes"))
                        for name, c in (entry.get("components") or {}).items()},
            unseen=(entry.get("unseen_tensors") or {}).get("projected"),
            transient=(entry.get("transient") or {}).get("projected"),
            beyond_tensors=entry.get("beyond_tensors"),
            tensor_peak=entry.get("tensor_peak"), rss_peak=entry.get("rss_peak"),
            estimated={name: c["estimated"] for name, c in (entry.get("components") or {}).items()
                       if c.get("estimated")})
    peak = item.get("peak") or {}
    if not peak and stages:
        path, best = max(stages.items(), key=lambda kv: kv[1].rss_peak or 0)
        peak = {"stage": path, "rss": best.rss_peak}
    return ProjectionView(method=item.get("method", "scaled"), target=str(item.get("target", "?")),
                          target_dtype=item.get("target_dtype"), peak_rss=peak.get("rss"),
                          peak_stage=peak.get("stage"),
                          live_tensor_peak=item.get("live_tensor_peak"), stages=stages,
                          caveat=scaled_caveat(item), estimates=estimate_note(item),
                          basis=rss_basis(item, peak.get("stage")))


def rss_basis(item: derived.Projection, stage_path: str | None) -> str | None:
    """Its peak stage's RSS in parts: tensors (measured at the target's shapes, or grown), the
    audited run's memory beyond tensors, and the allocator's modeled retention growth."""
    entry = next((e for e in item.get("stages") or [] if isinstance(e, dict)
                  and e.get("path") == stage_path), None)
    if entry is None or "beyond_measured" not in entry:
        return None
    tensors = ("tensors measured on fake tensors at the target's shapes" if item.get("method") == "traced"
               else "tensors grown by their drivers")
    growth = entry.get("allocator_growth") or 0
    low, high = entry.get("allocator_growth_range") or (0, 2 * growth)  # older records: the old model's
    return (f"RSS = {tensors} + {units.size(entry['beyond_measured'])} beyond tensors measured at the "
            f"audited scale" + (f" + {units.size(growth)} allocator retention growth (modeled; "
                                f"{units.size(low)} to {units.size(high)})" if growth else ""))


def _hide_unexplained(view: ProjectionView, item: derived.Projection) -> ProjectionView:
    """A scaled projection's figures that its drivers do not explain (`explained: false`,
    auditor.analysis.projection.scaled) become None, their misses kept in `unexplained`."""
    for entry in item["stages"]:
        stage = view.stages.get(entry.get("path", "")) if isinstance(entry, dict) else None
        if stage is None:
            continue
        for name, c in (entry.get("components") or {}).items():
            if c.get("explained") is False:
                stage.components[name], stage.unexplained[name] = None, c.get("residual")
        if (entry.get("unseen_tensors") or {}).get("explained") is False:
            stage.unseen, stage.unexplained["unseen"] = None, entry["unseen_tensors"].get("residual")
        transient = (entry.get("transient") or {}).get("explained") is False and "peak_in" not in entry
        if transient or ("peak_in" in entry and entry.get("explained") is False):
            miss = entry["transient"].get("residual") if transient else entry.get("miss")
            stage.transient, stage.unexplained["transient"] = None, miss
        if entry.get("explained") is False:
            stage.tensor_peak = stage.rss_peak = None
            stage.unexplained["peak"] = entry.get("miss")
    if item.get("explained") is False:
        view.unexplained = item.get("miss") or {}
        view.peak_rss = view.peak_stage = view.live_tensor_peak = None
    return view
