"""How far the projections were from a real held-out run: every projected number beside the
measured one, and the targets each method is held to. Reads records only; the runs are made by
`auditor.jobs.projection_validation`.

The targets checked (`TARGETS`): the scaled projection's peak live-tensor bytes within 3% and
peak RSS within 5% (they are stated for a 4x to 20x scale-up on CPU), and the traced projection
within 2% of the live-tensor meter, at the peak and in every stage, and its peak RSS within 5%.

A stage whose traced bytes rest partly on estimated value-dependent sizes (auditor.capture.tracing.data_dependent)
is not held to the every-stage target: the run's total of such a structure is estimated from
the small run, but how the target splits it across tensors and stages depends on values a traced
run does not have (a global threshold gives each layer a share that changes with scale). The
peak target holds them all; the worst such stage is reported beside (`resting_on_estimates`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from auditor.record.derived import Projection
from auditor.record.schema import RunRecord


@dataclass(frozen=True)
class Target:
    what: str       # "peak live tensors", "peak RSS", "live tensors, every stage"
    method: str     # "scaled" | "traced"
    limit: float    # largest |error| allowed, as a fraction


TARGETS = (Target("peak live tensors", "scaled", 0.03), Target("peak RSS", "scaled", 0.05),
           Target("peak live tensors", "traced", 0.02),
           Target("live tensors, every stage", "traced", 0.02), Target("peak RSS", "traced", 0.05))


# -- comparing ---------------------------------------------------------------------------

def compare(small: RunRecord, real: RunRecord, projections: dict[str, Projection]) -> dict:
    """Every projected number beside the real run's own, with the relative error."""
    from auditor.analysis.projection.scaled import projected_stage_keys, stage_keys
    measured = stage_keys(real)
    by_method = {m: projected_stage_keys(p) for m, p in projections.items()}
    stages = []
    for key, stage in measured.items():
        live = stage.live_tensors.peak if stage.live_tensors else None
        row: dict = {"path": stage.path, "real": {"tensor_peak": live, "rss_peak": stage.rss.peak}}
        for method, projected in by_method.items():
            p = projected.get(key)
            row[method] = ({"tensor_peak": p["tensor_peak"], "rss_peak": p["rss_peak"],
                            "estimated": p.get("estimated") or 0} if p else None)
        stages.append(row)
    peak_key = next((k for k, s in measured.items() if s.id == real.peak.stage_id),
                    (real.peak.stage, 0) if real.peak.stage is not None else None)
    peak_stage = measured.get(peak_key) if peak_key is not None else None
    components_why = "the real run's peak stage"
    if peak_stage is None and measured:  # its RSS peak fell between stages: the live-tensor high's stage
        peak_key, peak_stage = max(measured.items(), key=lambda item: (
            item[1].live_tensors.peak or 0) if item[1].live_tensors else 0)
        components_why = ("the stage of the real run's highest live tensors; its RSS peak fell in time "
                          "no stage covers")
    real_peak = {"live_tensors": max((s["real"]["tensor_peak"] or 0 for s in stages), default=None),
                 "rss": real.peak.rss, "stage": real.peak.stage}
    peak: dict = {"real": real_peak}
    for method, projection in projections.items():
        at = projection.get("peak")
        peak[method] = ({"live_tensors": projection["live_tensor_peak"], "rss": at["rss"], "stage": at["stage"]}
                        if at else {"live_tensors": None, "rss": None, "stage": None})
    components = []
    if peak_stage is not None and peak_key is not None:
        for name, item in (peak_stage.components or {}).items():
            row = {"name": name, "category": item.category, "real": item.bytes}
            for method, projected in by_method.items():
                grown = (projected.get(peak_key) or {}).get("components", {}).get(name)
                row[method] = grown["projected"] if grown else None
            components.append(row)
    return {"stages": stages, "peak": peak, "components": components,
            "components_stage": peak_stage.path if peak_stage else None, "components_why": components_why,
            "small_peak": {"live_tensors": max(((s.live_tensors.peak or 0) if s.live_tensors else 0
                                                for s in small.stages), default=None),
                           "rss": small.peak.rss}}


def error(projected: float | None, real: float | None) -> float | None:
    if projected is None or not real:
        return None
    return projected / real - 1


def check_targets(result: dict) -> list[dict]:
    """Each target with the error it is judged on and whether it is met."""
    checked = []
    for target in TARGETS:
        if target.method not in result["peak"]:  # a program is projected by tracing alone
            continue
        why = no_number(((result.get("projections") or {}).get(target.method)) or {})
        if why:  # nothing printed, so nothing to hold to a target: said, not counted as met
            checked.append({**asdict(target), "error": None, "met": None, "not_printed": why})
            continue
        extra: dict = {}
        if target.what == "peak live tensors":
            err = error(result["peak"][target.method]["live_tensors"], result["peak"]["real"]["live_tensors"])
        elif target.what == "peak RSS":
            err = error(result["peak"][target.method]["rss"], result["peak"]["real"]["rss"])
        else:
            exact, estimated = _stage_errors(result["stages"], target.method)
            err = max(exact, key=lambda e: abs(e[0]))[0] if exact else None
            extra = {"stages": len(exact), "resting_on_estimates": _worst(estimated)}
        checked.append({**asdict(target), "error": err,
                        "met": err is not None and abs(err) <= target.limit, **extra})
    from auditor.analysis.projection.rss_band import band_targets
    return checked + band_targets(result)


def _stage_errors(stages: list[dict], method: str) -> tuple[list[tuple], list[tuple]]:
    """(error, path, share of the projected bytes estimated) of each stage with a reading:
    the exact ones, and those resting partly on estimates."""
    exact: list[tuple] = []
    estimated: list[tuple] = []
    for s in stages:
        projected = s[method] or {}
        err = error(projected.get("tensor_peak"), s["real"]["tensor_peak"])
        if err is None:
            continue
        share = (projected.get("estimated") or 0) / max(projected["tensor_peak"], 1)
        (estimated if share else exact).append((err, s["path"], share))
    return exact, estimated


def _worst(stages: list[tuple]) -> dict | None:
    """The stage resting on estimates that is furthest off, and how many there are."""
    if not stages:
        return None
    err, path, share = max(stages, key=lambda e: abs(e[0]))
    return {"stages": len(stages), "error": err, "path": path, "estimated_share": share}


def no_number(projection: dict) -> str | None:
    """Why a projection printed no number to check: not projected, or not explained (then its
    peaks are shown nowhere either: auditor.report_models.validation)."""
    if projection.get("not_projected"):
        return f"not projected: {projection['not_projected']}"
    if projection.get("explained") is False:
        return "not explained by its drivers: the report prints no number (see traced)"
    return None
