"""Validation of the projections against a real run: audit small, project, run the target, compare
(the comparison and the targets: `auditor.analysis.projection.validation`).

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
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

from auditor.analysis.projection.validation import check_targets, compare
from auditor.facts import safe_files
from auditor.facts.units import GiB
from auditor.jobs.gradprobe import Settings
from auditor.jobs.validation_run import label as _label
from auditor.jobs.validation_run import real_audit

DEFAULT_MARGIN = GiB
SCALE_UP_RANGE = (4.0, 20.0)


class NotEnoughMemory(Exception):
    """The held-out run would not fit in this machine's available memory."""


def check_fits(what: str, needed: int, available: int, margin: int, how: str) -> None:
    if needed > available - margin:
        from auditor.facts.units import size
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
    from auditor.analysis.projection.scaled import project
    from auditor.analysis.projection.traced import project_traced
    from auditor.jobs.calibration import calibrate
    from auditor.jobs.gradprobe import traced_audit

    folder = Path(folder)
    held_out = replace(small, architecture=target, overrides=dict(target_overrides))
    given = available

    def memory() -> int:  # read when checked
        return given if given is not None else available_memory()
    target_parameters = architectures.count_parameters(target, **target_overrides)
    check_fits(_label(held_out), 4 * target_parameters, memory(), margin,
               "its fp32 weights alone, before any run")
    folder.mkdir(parents=True, exist_ok=True)

    progress(f"auditing {_label(small)} for real")
    record = real_audit(small, folder / "small", threads)
    progress(f"tracing {_label(held_out)} on fake tensors, and calibration runs (traced, "
             "perturbed small shapes) beside it")
    with ThreadPoolExecutor(max_workers=1) as pool:  # two processes of fake tensors: no RSS is read
        sizes = record.annotations.get("data_dependent_sizes")  # the small run's, for each traced run
        tracing = pool.submit(traced_audit, held_out, folder / "traced-target", observed_sizes=sizes)
        record.annotations["calibration"] = calibrate(small, folder / "calibration", target=held_out,
                                                      observed_sizes=sizes)
        traced = project_traced(record, tracing.result())
    available = memory()
    peak = traced.get("peak")
    rss = peak.get("rss") if peak else None
    if rss is not None:  # else not projected: the weights' floor was checked
        check_fits(_label(held_out), rss, available, margin, "peak RSS of its traced projection")
    scaled = project(record, target, target_overrides=target_overrides)
    progress(f"auditing {_label(held_out)} for real (held out)")
    real = real_audit(held_out, folder / "target", threads)

    result = compare(record, real, {"scaled": scaled, "traced": traced})
    result.update(small=_describe(small, folder / "small"), target=_describe(held_out, folder / "target"),
                  folder=str(folder), available=available, margin=margin,
                  scale_up=target_parameters / parameters_of(small), scale_up_range=SCALE_UP_RANGE,
                  fit=scaled.get("fit"), projections={"scaled": scaled, "traced": traced})
    result["targets"] = check_targets(result)
    safe_files.write_text(folder / "validation.json", json.dumps(result, indent=1) + "\n")
    return result


def parameters_of(settings: Settings) -> int:
    import architectures
    return architectures.count_parameters(settings.architecture, **settings.overrides)


def _describe(settings: Settings, run_folder: Path) -> dict:
    return {"label": _label(settings), "architecture": settings.architecture,
            "overrides": settings.overrides, "parameters": parameters_of(settings),
            "settings": asdict(settings), "run": str(run_folder / "run.json")}
