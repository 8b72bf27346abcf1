"""The band around a traced projection's RSS: how far the target's RSS beyond tensors may move from
what the audited run measured, each bound from that run's own readings.

A traced projection measures tensors exactly at the target's shapes and carries the audited run's
RSS beyond tensors, plus the allocator's modeled retention growth (auditor.analysis.projection.traced).
What that part does at a larger size is not measured, so every projected RSS has a band:

- low: the tensors plus the audited run's RSS beyond them with no retention growth at all, less
  what an identical run may read lower (auditor.analysis.findings.noise_band: glibc keeps or returns its
  trim slack from one run to the next).
- high: the audited run's retention grown in proportion with what glibc's heap served, plus the
  same noise. The retention is the stage's RSS beyond tensors above the least any of the audited
  run's stages had (the process before glibc kept anything for it: interpreter, libraries); what
  the heap served is the live-tensor meter's `heap_high_water` (the most bytes of storages below
  the mmap threshold alive at once), traced at the target against audited; where a record lacks
  it, the live-tensor peaks' ratio. Never below the allocator model's own upper growth
  (auditor.facts.allocator_retention.RANGE).

The run's peak takes the most of its stages' lows and the most of their highs: the real peak is
at least every stage's and at most the largest. Measured (reports/rss-band-validation.md,
benchmarks/rss_band_validation.py): six held-out real runs at 8.4x to 13x, projected points -9.07%
to +4.78% off; every real peak and all 158 stages inside their bands, which reached 6% to 16% below
and 7% to 28% above the real peak (widest where the audited run kept most: checkpointed, batch 4).
"""
from __future__ import annotations

from auditor.analysis.findings.noise_band import rss_band
from auditor.facts import units
from auditor.record.derived import ProjectedStage, RssBand
from auditor.record.schema import RunRecord, Stage


class Retention:
    """What the audited run measured of the process beyond tensors: its floor, its noise, and its
    heap's high water by stage path (folded), against which a traced stage's is grown."""

    def __init__(self, audited: RunRecord):
        from auditor.analysis.projection.side_by_side import folded_path
        self._folded = folded_path
        finished = [s for s in audited.stages if s.status != "open" and s.rss.peak is not None]
        beyond = [beyond_tensors(s) for s in finished]
        self.floor = min(beyond, default=0)
        self.noise = round(rss_band(audited, 0, "").margin)
        self.high_water: dict[str, int] = {}
        self.tensors: dict[str, int] = {}
        for stage in finished:
            key = folded_path(stage.path)
            meter = stage.live_tensors
            self.high_water[key] = max(self.high_water.get(key, 0), (meter.heap_high_water or 0) if meter else 0)
            self.tensors[key] = max(self.tensors.get(key, 0), (meter.peak or 0) if meter else 0)
        self.run_high_water = max(self.high_water.values(), default=0)
        self.run_tensors = max(self.tensors.values(), default=0)

    def growth_ratio(self, traced: Stage, tensor_peak: int) -> tuple[float, str]:
        """How many times the audited heap (else its tensors) the target's is, and which it was."""
        key = self._folded(traced.path)
        meter = traced.live_tensors
        target_water = (meter.heap_high_water or 0) if meter else 0
        audited_water = self.high_water.get(key) or self.run_high_water
        if target_water and audited_water:
            return max(target_water / audited_water, 1.0), "heap"
        audited_tensors = self.tensors.get(key) or self.run_tensors
        return (max(tensor_peak / audited_tensors, 1.0) if audited_tensors else 1.0), "tensors"

    def band(self, traced: Stage, tensor_peak: int, measured_beyond: int, growth_high: int) -> RssBand:
        """A traced stage's band: tensors + the audited beyond, less the noise (low); plus the
        retention grown and the noise (high)."""
        retained = max(measured_beyond - self.floor, 0)
        ratio, by = self.growth_ratio(traced, tensor_peak)
        grown = max(round(retained * (ratio - 1)), growth_high)
        base = tensor_peak + measured_beyond
        return {"low": max(base - self.noise, 0), "high": base + grown + self.noise,
                "retained": retained, "grown": grown, "grown_by": round(ratio, 3), "grown_with": by}


def beyond_tensors(stage: Stage) -> int:
    """A finished stage's RSS peak beyond its live-tensor peak."""
    assert stage.rss.peak is not None, "a finished stage's RSS peak"
    return max(stage.rss.peak - ((stage.live_tensors.peak if stage.live_tensors else None) or 0), 0)


def peak_band(stages: list[ProjectedStage], retention: Retention) -> RssBand | None:
    """The run's peak RSS band: the most of the stages' lows and of their highs, with its basis."""
    banded = [s for s in stages if s.get("rss_band")]
    if not banded:
        return None
    top = max((s["rss_band"] for s in banded), key=lambda b: b["high"])
    return {"low": max(s["rss_band"]["low"] for s in banded), "high": top["high"], "basis": basis(top, retention)}


def basis(top: RssBand, retention: Retention) -> str:
    """The band's basis in one plain sentence (figures of the stage with the highest high)."""
    grown = ("the heap's high water" if top["grown_with"] == "heap" else "the live tensors")
    return (f"low is the tensors plus the audited run's RSS beyond them with no retention growth, high "
            f"grows its retention ({units.size(top['retained'])} above its least beyond tensors, "
            f"{units.size(retention.floor)}) {top['grown_by']:.1f}x, as {grown} grew, or the allocator "
            f"model's upper growth if larger; both {units.size(retention.noise)} wider for the noise "
            f"between identical runs")


def where(real: int | None, band: dict | None) -> float | None:
    """How far `real` is outside `band`, as the nearer bound's error against it (bound / real - 1):
    0.0 inside, below 0 above the band, above 0 below it; None with no band or reading."""
    if real is None or not real or not band:
        return None
    if real > band["high"]:
        return band["high"] / real - 1
    if real < band["low"]:
        return band["low"] / real - 1
    return 0.0


def band_targets(result: dict) -> list[dict]:
    """The validation's band checks (auditor.analysis.projection.validation.check_targets): the
    real peak RSS inside the traced projection's band, and each stage's; `error` how far outside
    (`where`), so 0.0 is met. None where the projection has no band (a record from before)."""
    from auditor.analysis.projection.scaled import json_stage_keys
    traced = (result.get("projections") or {}).get("traced") or {}
    band = (traced.get("peak") or {}).get("rss_band")
    if not band:
        return []
    real = (result.get("peak") or {}).get("real", {}).get("rss")
    peak_error = where(real, band)
    checked = [{"what": "peak RSS inside its band", "method": "traced", "limit": 0.0, "error": peak_error,
                "met": peak_error == 0.0, "band": {"low": band["low"], "high": band["high"]}, "real": real}]
    projected = json_stage_keys(traced)
    outside: list[tuple[float, str]] = []
    for key, row in json_stage_keys(result).items():
        stage_band = (projected.get(key) or {}).get("rss_band")
        err = where(row["real"]["rss_peak"], stage_band)
        if err is not None:
            outside.append((err, row["path"]))
    worst = max(outside, key=lambda e: abs(e[0]), default=None)
    checked.append({"what": "RSS inside its band, every stage", "method": "traced", "limit": 0.0,
                    "error": worst[0] if worst is not None else None,
                    "met": worst is not None and worst[0] == 0.0, "stages": len(outside),
                    "worst_stage": worst[1] if worst is not None and worst[0] else None})
    return checked
