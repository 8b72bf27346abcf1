"""Validation of the projections against a real run: audit small, project, run the target, compare.

    result = validate(Settings(overrides={"hidden": 256, "layers": 2}), "tinystories-33m", {}, folder)

1. The job runs for real at a small scale (a fresh process, `auditor.jobs.validation_run`:
   its RSS is comparable).
2. The held-out target is traced on fake tensors, and beside it calibration runs
   (`auditor.jobs.calibration`) around the small scale, which the scaled projection is
   fitted on. The traced projection's peak RSS must fit in the memory available (less a
   margin), or `NotEnoughMemory` is raised before anything big runs. A cheaper floor (the
   target's fp32 weights) is checked before step 1.
3. The scaled projection, fitted on the calibration runs.
4. The target runs for real (a fresh process) and every projected number is compared with
   its measured counterpart: per stage (live-tensor peak, RSS peak), per component at the
   peak stage's end, and the run's peaks.

The targets checked (`TARGETS`): the scaled projection's peak live-tensor bytes within 3% and
peak RSS within 5% (they are stated for a 4x to 20x scale-up on CPU), and the traced projection
within 2% of the live-tensor meter, at the peak and in every stage.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from auditor.jobs.gradprobe import Settings
from auditor.jobs.validation_run import label as _label
from auditor.jobs.validation_run import real_audit

GiB = 1 << 30
DEFAULT_MARGIN = GiB
SCALE_UP_RANGE = (4.0, 20.0)


@dataclass(frozen=True)
class Target:
    what: str       # "peak live tensors", "peak RSS", "live tensors, every stage"
    method: str     # "scaled" | "traced"
    limit: float    # largest |error| allowed, as a fraction


TARGETS = (Target("peak live tensors", "scaled", 0.03), Target("peak RSS", "scaled", 0.05),
           Target("peak live tensors", "traced", 0.02),
           Target("live tensors, every stage", "traced", 0.02))


class NotEnoughMemory(Exception):
    """The held-out run would not fit in this machine's available memory."""


def check_fits(what: str, needed: int, available: int, margin: int, how: str) -> None:
    if needed > available - margin:
        from auditor.units import size
        raise NotEnoughMemory(
            f"the held-out real run would not fit: {what} needs {size(needed)} ({how}) but "
            f"{size(available)} is available, less a {size(margin)} margin; choose a smaller "
            "--target (or --target-* overrides), or free memory")


def available_memory() -> int:
    import psutil
    return int(psutil.virtual_memory().available)


def validate(small: Settings, target: str, target_overrides: dict, folder: Path, *,
             threads: int | None = None, available: int | None = None,
             margin: int = DEFAULT_MARGIN, progress=lambda text: None) -> dict:
    """Run the whole validation; its result (also `folder/validation.json`)."""
    import architectures
    from auditor.analysis.projection import project
    from auditor.analysis.traced_projection import project_traced
    from auditor.jobs.calibration import calibrate
    from auditor.jobs.gradprobe import traced_audit

    folder = Path(folder)
    held_out = replace(small, architecture=target, overrides=dict(target_overrides))
    memory = (lambda: available) if available is not None else available_memory  # read when checked
    target_parameters = architectures.count_parameters(target, **target_overrides)
    check_fits(_label(held_out), 4 * target_parameters, memory(), margin,
               "its fp32 weights alone, before any run")
    folder.mkdir(parents=True, exist_ok=True)

    progress(f"auditing {_label(small)} for real")
    record = real_audit(small, folder / "small", threads)
    progress(f"tracing {_label(held_out)} on fake tensors, and calibration runs (traced, "
             "perturbed small shapes) beside it")
    with ThreadPoolExecutor(max_workers=1) as pool:  # two processes of fake tensors: no RSS is read
        tracing = pool.submit(traced_audit, held_out, folder / "traced-target")
        record["calibration"] = calibrate(small, folder / "calibration", target=held_out)
        traced = project_traced(record, tracing.result())
    available = memory()
    check_fits(_label(held_out), traced["peak"]["rss"], available, margin,
               "peak RSS of its traced projection")
    scaled = project(record, target, target_overrides=target_overrides)
    progress(f"auditing {_label(held_out)} for real (held out)")
    real = real_audit(held_out, folder / "target", threads)

    result = compare(record, real, {"scaled": scaled, "traced": traced})
    result.update(small=_describe(small, folder / "small"), target=_describe(held_out, folder / "target"),
                  folder=str(folder), available=available, margin=margin,
                  scale_up=target_parameters / parameters_of(small), scale_up_range=SCALE_UP_RANGE,
                  fit=scaled["fit"], projections={"scaled": scaled, "traced": traced})
    result["targets"] = check_targets(result)
    (folder / "validation.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def parameters_of(settings: Settings) -> int:
    import architectures
    return architectures.count_parameters(settings.architecture, **settings.overrides)


def _describe(settings: Settings, run_folder: Path) -> dict:
    return {"label": _label(settings), "architecture": settings.architecture,
            "overrides": settings.overrides, "parameters": parameters_of(settings),
            "settings": asdict(settings), "run": str(run_folder / "run.json")}


# -- comparing ---------------------------------------------------------------------------

def compare(small: dict, real: dict, projections: dict[str, dict]) -> dict:
    """Every projected number beside the real run's own, with the relative error."""
    from auditor.analysis.projection import stage_keys
    measured = stage_keys(real)
    by_method = {m: stage_keys(p) for m, p in projections.items()}
    stages = []
    for key, stage in measured.items():
        meter = stage.get("live_tensors") or {}
        row = {"path": stage["path"], "real": {"tensor_peak": meter.get("peak"), "rss_peak": stage["rss"]["peak"]}}
        for method, projected in by_method.items():
            p = projected.get(key)
            row[method] = ({"tensor_peak": p["tensor_peak"], "rss_peak": p["rss_peak"]} if p else None)
        stages.append(row)
    peak_key = next((k for k, s in measured.items() if s.get("id") == real["peak"].get("stage_id")),
                    (real["peak"].get("stage"), 0))
    peak_stage = measured.get(peak_key)
    real_peak = {"live_tensors": max((s["real"]["tensor_peak"] or 0 for s in stages), default=None),
                 "rss": real["peak"]["rss"], "stage": real["peak"].get("stage")}
    peak = {"real": real_peak}
    for method, p in projections.items():
        peak[method] = {"live_tensors": p["live_tensor_peak"], "rss": p["peak"]["rss"],
                        "stage": p["peak"]["stage"]}
    components = []
    if peak_stage is not None:
        for name, item in (peak_stage.get("components") or {}).items():
            row = {"name": name, "category": item["category"], "real": item["bytes"]}
            for method, projected in by_method.items():
                p = (projected.get(peak_key) or {}).get("components", {}).get(name)
                row[method] = p["projected"] if p else None
            components.append(row)
    return {"stages": stages, "peak": peak, "components": components,
            "components_stage": peak_stage["path"] if peak_stage else None,
            "small_peak": {"live_tensors": max(((s.get("live_tensors") or {}).get("peak", 0)
                                                for s in small["stages"]), default=None),
                           "rss": small["peak"]["rss"]}}


def error(projected: float | None, real: float | None) -> float | None:
    if projected is None or not real:
        return None
    return projected / real - 1


def check_targets(result: dict) -> list[dict]:
    """Each target with the error it is judged on and whether it is met."""
    checked = []
    for target in TARGETS:
        if target.what == "peak live tensors":
            err = error(result["peak"][target.method]["live_tensors"], result["peak"]["real"]["live_tensors"])
        elif target.what == "peak RSS":
            err = error(result["peak"][target.method]["rss"], result["peak"]["real"]["rss"])
        else:
            errors = [error((s[target.method] or {}).get("tensor_peak"), s["real"]["tensor_peak"])
                      for s in result["stages"]]
            errors = [e for e in errors if e is not None]
            err = max(errors, key=abs) if errors else None
        checked.append({**asdict(target), "error": err,
                        "met": err is not None and abs(err) <= target.limit})
    return checked
