"""Traced projection: the run record of the same job traced on the target's fake tensors.

A traced run measures tensors exactly (census and live-tensor meter count fake storages at
their nominal size), transients inside stages included; what it cannot see is the process:
interpreter, libraries and allocator slack. Those are taken from the real run's stage of
the same path (RSS beyond its live-tensor peak; a call the real run did not make takes the
most of its stage's calls), plus the allocator's retention growth between the two runs'
mmap thresholds (auditor.facts.allocator_retention). That part is not measured at the target, so each
projected RSS has a band (`rss_band`: low, high) from the audited run's own readings, the run's
peak with its basis in one sentence (auditor.analysis.projection.rss_band).

Data-dependent sizes (auditor.capture.tracing.data_dependent) are estimates: each stage and component says how
many of its projected bytes rest on them (`estimated`, from the traced record's
`estimated_bytes`), and `data_dependent` lists every site with its ratio and where the ratio
came from (observed in the real run, declared by the program, or unknown: sized empty).

The result has the shape of `projection.project`'s, so a report shows both side by side.
"""
from __future__ import annotations

from auditor.analysis.projection.rss_band import Retention, beyond_tensors, peak_band
from auditor.facts import allocator_retention
from auditor.record.derived import DataDependent, Grown, ProjectedPeak, ProjectedStage, Projection, RssBand
from auditor.record.schema import RunRecord, Stage


def project_traced(record: RunRecord, traced_record: RunRecord) -> Projection:
    from auditor.analysis.projection.scaled import refusal
    target = traced_record.annotations["workload"]["architecture"]
    refused = refusal(record, "traced", target)
    if refused is not None:  # an algorithm that cannot be traced: its traced run holds no work
        return refused
    real = _RealBeyond(record)
    retention = Retention(record)
    estimated = _estimated_by_stage(traced_record)
    stages: list[ProjectedStage] = []
    seen: dict[str, int] = {}
    for s in traced_record.stages:
        if s.status != "open":
            n = seen[s.path] = seen.get(s.path, -1) + 1
            stages.append(_stage(s, real, retention, estimated.get((s.path, n))))
    peak = max(stages, key=lambda s: s["rss_peak"], default=None)
    return {
        "method": "traced",
        "target": target,
        "target_dtype": None,
        "run": traced_record.name,
        "data_dependent_ops": (traced_record.annotations.get("traced") or {}).get("data_dependent_ops", {}),
        "data_dependent": data_dependent(traced_record),
        "stages": stages,
        "peak": _peak(peak, peak_band(stages, retention)) if peak else None,
        "live_tensor_peak": max((s["tensor_peak"] for s in stages), default=None),
    }


def _peak(stage: ProjectedStage, band: RssBand | None) -> ProjectedPeak:
    peak: ProjectedPeak = {"stage": stage["path"], "rss": stage["rss_peak"], "live_tensors": stage["tensor_peak"],
                           "estimated": stage["estimated"]}
    if band is not None:
        peak["rss_band"] = band
    return peak


def data_dependent(traced_record: RunRecord) -> DataDependent:
    """The traced run's data-dependent sites (ratio, source, calls) and how its estimated
    bytes were measured; `unknown`: the sites sized empty for want of any ratio."""
    from auditor.analysis.projection.estimated_bytes import sites
    found = sites(traced_record)
    measured = traced_record.annotations.get("estimated_bytes") or {}
    return {"sites": found, "unknown": [s for s in found if s.get("source") == "unknown"],
            "method": measured.get("method")}


def _estimated_by_stage(traced_record: RunRecord) -> dict:
    """The traced record's `estimated_bytes` (an annotation: JSON) by stage key, as `stage_keys`."""
    keyed: dict[tuple[str, int], dict] = {}
    seen: dict[str, int] = {}
    for stage in (traced_record.annotations.get("estimated_bytes") or {}).get("stages", []):
        n = seen[stage["path"]] = seen.get(stage["path"], -1) + 1
        keyed[(stage["path"], n)] = stage
    return keyed


def _stage(traced: Stage, real: _RealBeyond, retention: Retention, estimated: dict | None = None) -> ProjectedStage:
    paired = real.stage(traced.path)
    real_components = (paired.components if paired is not None else None) or {}
    estimated_components = (estimated or {}).get("components") or {}
    components: dict[str, Grown] = {
        name: {"category": item.category,
               "bytes": real_components[name].bytes if name in real_components else None,
               "projected": item.bytes, "estimated": estimated_components.get(name, 0)}
        for name, item in (traced.components or {}).items()
    }
    meter = traced.live_tensors
    tensor_peak = (meter.peak if meter is not None and meter.peak is not None
                   else sum(c["projected"] or 0 for c in components.values()))
    measured, source = real.beyond(traced.path)
    growth = real.allocator_growth(traced.path, meter.allocator_threshold if meter is not None else None)
    beyond_tensors = measured + growth
    growth_range = allocator_retention.growth_range(growth)
    return {"path": traced.path, "components": components,
            "tensor_peak": tensor_peak, "rss_peak": tensor_peak + beyond_tensors,
            "beyond_tensors": beyond_tensors, "beyond_measured": measured, "beyond_from": source,
            "allocator_growth": growth, "allocator_growth_range": growth_range,
            "rss_band": retention.band(traced, tensor_peak, measured, growth_range[1]),
            "estimated": (estimated or {}).get("live_tensors", 0)}


class _RealBeyond:
    """The real run's RSS beyond tensors for a traced stage: its own stage's, else the most of
    the calls of its stage (a loop the target runs more often), else the run's."""

    def __init__(self, record: RunRecord):
        from auditor.analysis.projection.side_by_side import folded_path
        self._folded = folded_path
        self.by_path = {s.path: s for s in record.stages if s.status != "open"}
        self.by_folded: dict[str, list[Stage]] = {}
        for stage in self.by_path.values():
            self.by_folded.setdefault(folded_path(stage.path), []).append(stage)
        live = max(((s.live_tensors.peak if s.live_tensors else None) or 0 for s in self.by_path.values()), default=0)
        self.run_beyond = max((record.peak.rss or 0) - live, 0)
        self.threads = int(record.environment.threads or 1)

    def stage(self, path: str) -> Stage | None:
        return self.by_path.get(path)

    def beyond(self, path: str) -> tuple[int, str]:
        if path in self.by_path:
            return _beyond_tensors(self.by_path[path]), "its stage"
        calls = self.by_folded.get(self._folded(path))
        if calls:
            return max(_beyond_tensors(s) for s in calls), "the most of its stage's calls"
        return self.run_beyond, "the run's"

    def allocator_growth(self, path: str, target_threshold: int | None) -> int:
        """auditor.facts.allocator_retention's growth from the real run's mmap threshold to the
        target's; 0 when either run did not follow the threshold (older records)."""
        calls = self.by_folded.get(self._folded(path)) or []
        stage = self.by_path.get(path) or (max(calls, key=lambda s: _threshold(s) or 0) if calls else None)
        real_threshold = _threshold(stage)
        if target_threshold is None or real_threshold is None:
            return 0
        return allocator_retention.growth(self.threads, real_threshold, target_threshold)


def _threshold(stage: Stage | None) -> int | None:
    return stage.live_tensors.allocator_threshold if stage is not None and stage.live_tensors else None


_beyond_tensors = beyond_tensors
