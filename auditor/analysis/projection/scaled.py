"""Scaled projection: each component of an audited run, grown to a target by what drives it.

Every stage is projected from its own readings (census components, live-tensor meter, RSS):

    component at the stage end     x its driver: weights, gradients and copies by parameters,
                                     per-matrix records and masks by matrix parameters, buffers
                                     by buffer bytes (`drivers.component_driver`)
    transient inside the stage     + its fitted growth (below)
    tensors the census cannot see  + their fitted growth (autograd's saved tensors)
    RSS beyond live tensors        x constant (interpreter, libraries, allocator slack), plus
                                     the allocator's retention growth (`_allocator_growth`)

The fit. Calibration runs, cheap traced runs of the same job at perturbed small shapes
(layers x2, hidden x2, vocab /2, heads x2...: `auditor.jobs.calibration`), give each quantity at
several shapes besides the audited one. Each quantity is split onto drivers
(`drivers.FIT_DRIVERS`) by non-negative least squares, with the fewest drivers that explain
every run within `TOLERANCE` (earlier drivers preferred), else all of them: GradProbe's
backward transient on a tied model comes out as `tied` (two extra copies of the embedding's
gradient), its block temporaries as `constant`. The projection is the audited reading plus the
fitted growth, sum over drivers of share x (target / audited - 1), so a run projected onto its
own shape gives back its own numbers. A component whose a-priori driver misses a calibration
run by more than `TOLERANCE` is fitted the same way. A stage whose peak lies inside a child
stage takes its children's largest projected peak.

Limits. Without calibration runs (one run cannot separate drivers) transients scale by
parameters and unseen tensors by activations. The fit is linear: it assumes the moment that
sets a stage's peak is the same at the target as in the calibration runs; a traced run
(`traced_projection`) measures it instead and is the one to trust far from the audited shape.
A run needs a `workload` field (architecture, overrides, tokens) to be projected.

Explained or not. With calibration runs, every projected quantity says whether its drivers
explain them (`explained`: the fit misses no run by more than its allowance, `residual` the
largest miss, `allowance` the most it may miss). A quantity that grows with a size no driver has
(a Hessian per linear, in_features^2: intermediate^2 for Llama's down_proj) is not explained,
and its stage is not (`explained: false`, `unexplained` naming what); a parent whose peak lies in
such a child is not either. Such a figure is kept in the record for reference but no report
prints it as a number: it defers to the traced projection. The projection's `peak` is explained
only where every stage is (an unexplained stage may hold the target's peak). Without calibration
runs nothing is checked, and `explained` is absent (the report says the projection is
uncalibrated).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import combinations
from typing import TypeVar

import numpy as np

from auditor.analysis.projection.drivers import FIT_DRIVERS, Shape, component_driver, scale, shape_of, workload_shape
from auditor.facts import allocator_retention
from auditor.facts.allocator_retention import MMAP_THRESHOLD_MAX
from auditor.record.derived import Grown, ProjectedStage, Projection, Unexplained
from auditor.record.schema import RunRecord, Stage

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
# Categories that follow the model's own dtype; the rest keep the algorithm's storage dtype.
MODEL_DTYPE_CATEGORIES = {"weights", "gradients"}
# An a-priori driver holds, and a fit explains a quantity, when it misses no run by more than
# this share of the quantity's largest reading (a fit: or FLOOR bytes, a page, if larger).
TOLERANCE = 0.01
FLOOR = 4096
MOST_DRIVERS_IN_A_SMALL_FIT = 3


def audited_shape(record: RunRecord) -> Shape:
    workload = record.annotations.get("workload")
    if not workload or "architecture" not in workload:
        raise ValueError(f"run {record.name!r} has no workload field (architecture, "
                         "tokens): it cannot be projected")
    return workload_shape(workload)


def project(record: RunRecord, target: str, target_dtype: str | None = None,
            target_tokens: int | None = None, *, target_overrides: dict | None = None,
            calibration: list[dict] | None = None) -> Projection:
    """The scaled projection of every stage of `record` to architecture `target`.

    `calibration`: the compact records (JSON, auditor.jobs.calibration) of traced runs of the
    same job at other small shapes (default: the record's own `calibration` annotation, if
    any); without them nothing is fitted.
    """
    refused = refusal(record, "scaled", target)
    if refused is not None:
        return refused
    audited = audited_shape(record)
    batch = audited.batch
    tokens = target_tokens or audited.tokens
    shape = shape_of(target, tokens, target_overrides, sequence=max(tokens // batch, 1), batch=batch)
    runs = [r for r in (calibration if calibration is not None else record.annotations.get("calibration") or [])
            if r.get("workload")]
    fit = _Fit(audited, shape, [(workload_shape(r["workload"]), _compact_readings(r)) for r in runs])
    dtype_factor = _dtype_factor(record, target_dtype)
    threads = int(record.environment.threads or 1)
    stages = [_project_stage(s, key, fit, dtype_factor, threads) for key, s in stage_keys(record).items()]
    _peaks_inside_children(list(stage_keys(record).values()), stages)
    explained = _explain(stages)
    # the run's peak: the most specific stage holding it (a parent only where no child does)
    peak = max(stages, key=lambda s: (s["rss_peak"], s["path"].count("/")), default=None)
    return {
        "method": "scaled", "target": target, "target_dtype": target_dtype,
        "target_overrides": dict(shape.overrides),
        "audited": audited.as_dict(), "shape": shape.as_dict(), "stages": stages,
        "peak": {"stage": peak["path"], "rss": peak["rss_peak"],
                 "live_tensors": peak["tensor_peak"]} if peak else None,
        "live_tensor_peak": max((s["tensor_peak"] for s in stages), default=None),
        **explained,
        "fit": fit.summary(runs),
    }


def refusal(record: RunRecord, method: str, target: str) -> Projection | None:
    """For a run whose algorithm says it cannot be projected (the record's `not_projected`, a
    sentence saying why), the projection that says so and holds no number; else None."""
    why = record.annotations.get("not_projected")
    if not why:
        return None
    return {"method": method, "target": target, "target_dtype": None, "not_projected": str(why),
            "stages": [], "peak": None, "live_tensor_peak": None}


def _dtype_factor(record: RunRecord, target_dtype: str | None) -> float:
    if target_dtype is None:
        return 1.0
    audited = record.annotations["workload"].get("dtype", "float32")
    if target_dtype not in DTYPE_BYTES or audited not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {target_dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[target_dtype] / DTYPE_BYTES[audited]


Keyed = TypeVar("Keyed")


def stage_keys(run: RunRecord) -> dict[tuple[str, int], Stage]:
    """Finished stages by (path, how many stages of that path came before): a stage called
    several times pairs with the same call in another run of the job."""
    return _keyed((stage.path, stage) for stage in run.stages if stage.status != "open")


def json_stage_keys(run: dict) -> dict[tuple[str, int], dict]:
    """`stage_keys` of stages held as JSON: a calibration run's compact record
    (auditor.jobs.calibration), a projection (`project`'s, `project_traced`'s)."""
    return _keyed((stage["path"], stage) for stage in run.get("stages") or [] if stage.get("status") != "open")


def projected_stage_keys(projection: Projection) -> dict[tuple[str, int], ProjectedStage]:
    """`stage_keys` of a projection's stages (a projection's stages are never open)."""
    return _keyed((stage["path"], stage) for stage in projection.get("stages") or [])


def _keyed(stages: Iterable[tuple[str, Keyed]]) -> dict[tuple[str, int], Keyed]:
    keyed: dict[tuple[str, int], Keyed] = {}
    seen: dict[str, int] = {}
    for path, stage in stages:
        n = seen[path] = seen.get(path, -1) + 1
        keyed[(path, n)] = stage
    return keyed


# -- readings of one stage ---------------------------------------------------------------

@dataclass(frozen=True)
class _Tensors:
    """What the fit reads of a stage: its census and live-tensor meter, from a run record's
    stage or a calibration run's compact one (JSON)."""
    components: dict[str, int]  # census at the stage end: name -> bytes
    end: int | None             # live-tensor meter at the end and at its peak; None: meter off
    peak: int | None

    @classmethod
    def of(cls, stage: Stage) -> _Tensors:
        meter = stage.live_tensors
        return cls({name: c.bytes for name, c in (stage.components or {}).items()},
                   meter.end if meter else None, meter.peak if meter else None)

    @classmethod
    def of_json(cls, stage: dict) -> _Tensors:
        meter = stage.get("live_tensors") or {}
        return cls({name: c.get("bytes", 0) for name, c in (stage.get("components") or {}).items()},
                   meter.get("end"), meter.get("peak"))


def _compact_readings(run: dict) -> dict[tuple[str, int], _Tensors]:
    return {key: _Tensors.of_json(stage) for key, stage in json_stage_keys(run).items()}


Reading = Callable[[_Tensors], int]


def _census(stage: _Tensors) -> int:
    return sum(stage.components.values())


def _end(stage: _Tensors) -> int:
    return stage.end if stage.end is not None else _census(stage)


def _unseen(stage: _Tensors) -> int:
    """Live tensors no census root reaches (saved by autograd: no Python object to census)."""
    return max(_end(stage) - _census(stage), 0)


def _transient(stage: _Tensors) -> int:
    end = _end(stage)
    return max((stage.peak if stage.peak is not None else end) - end, 0)


def _component(name: str) -> Reading:
    return lambda stage: stage.components.get(name, 0)


# -- the fit -----------------------------------------------------------------------------

class _Fit:
    """Splits each quantity of a stage onto drivers, from the audited run and calibration runs."""

    def __init__(self, audited: Shape, target: Shape, runs: list[tuple[Shape, dict[tuple[str, int], _Tensors]]]):
        self.audited, self.target, self.runs = audited, target, runs

    @property
    def calibrated(self) -> bool:
        return bool(self.runs)

    def grow(self, measured: int, shares: dict[str, float]) -> int:
        growth = sum(b * (scale(d, self.audited, self.target) - 1) for d, b in shares.items())
        return max(round(measured + growth), 0)

    def a_priori(self, driver: str, measured: int, key: tuple, reading: Reading) -> Grown:
        """`measured` scaled by `driver`, unless calibration runs show the driver is wrong."""
        shares: dict[str, float] = {driver: measured}
        if self.calibrated:
            values, shapes = self._series(key, reading, measured)
            predicted = [measured * scale(driver, self.audited, s) for s in shapes]
            if _miss(values, predicted) > _allowance(values, floor=0):
                return self.fitted(measured, key, reading)
            return {"how": "a priori", "shares": shares, **_checked(values, _miss(values, predicted))}
        return {"how": "a priori", "shares": shares}

    def fitted(self, measured: int, key: tuple, reading: Reading, fallback: str = "parameters") -> Grown:
        if not self.calibrated:
            return {"how": "a priori", "shares": {fallback: measured}}
        values, shapes = self._series(key, reading, measured)
        shares, residual = fit_shares(values, shapes)
        return {"how": "fitted", "shares": shares, **_checked(values, residual)}

    def _series(self, key: tuple, reading: Reading, measured: int) -> tuple[list[float], list[Shape]]:
        values, shapes = [float(measured)], [self.audited]
        for shape, stages in self.runs:
            if key in stages:
                values.append(float(reading(stages[key])))
                shapes.append(shape)
        return values, shapes

    def summary(self, runs: list[dict]) -> dict | None:
        drivers = {d: {"audited": self.audited.driver(d), "target": self.target.driver(d),
                       "ratio": scale(d, self.audited, self.target)}
                   for d in dict.fromkeys(FIT_DRIVERS + ("matrix parameters",))}
        return {
            "method": ("non-negative least squares over the audited run and "
                       f"{len(runs)} traced calibration run(s)") if runs else
                      "none: no calibration runs (transients x parameters, unseen x activations)",
            "tolerance": TOLERANCE,
            "runs": [{"label": r.get("label"), **{k: r["workload"].get(k) for k in
                      ("architecture", "overrides", "tokens")}} for r in runs],
            "drivers": drivers,
        }


def fit_shares(values: list[float], shapes: list[Shape],
               drivers: tuple[str, ...] = FIT_DRIVERS) -> tuple[dict[str, float], float]:
    """Non-negative shares (bytes at `shapes[0]`) of drivers that reproduce `values`.

    The fewest drivers whose fit misses no run by more than the allowance, preferring the
    earlier drivers; if none of up to `MOST_DRIVERS_IN_A_SMALL_FIT` do, all drivers together.
    Returns the shares and the largest miss over the runs.
    """
    y = np.asarray(values, dtype=float)
    columns = _columns(shapes, drivers)
    if not columns or not y.any():
        return {}, float(np.abs(y).max(initial=0.0))
    names = list(columns)
    matrix = np.column_stack([columns[n] for n in names])
    allowance = _allowance(values)
    for size in range(1, min(MOST_DRIVERS_IN_A_SMALL_FIT, len(names)) + 1):
        best = None
        for chosen in combinations(range(len(names)), size):
            coef = _nnls(matrix[:, chosen], y)
            if (coef <= 0).any():
                continue  # a smaller set explains it as well
            miss = float(np.abs(matrix[:, chosen] @ coef - y).max())
            if miss <= allowance and (best is None or miss < best[0] - 1e-9 * allowance):
                best = (miss, chosen, coef)
        if best is not None:
            miss, chosen, coef = best
            return {names[i]: float(c) for i, c in zip(chosen, coef, strict=False)}, miss
    coef = _nnls(matrix, y)
    miss = float(np.abs(matrix @ coef - y).max())
    return {n: float(c) for n, c in zip(names, coef, strict=False) if c > 0}, miss


def _columns(shapes: list[Shape], drivers: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Each driver over the runs, relative to the first run; drivers the first run lacks, and
    drivers that move exactly like an earlier one, are left out (no run can tell them apart)."""
    columns: dict[str, np.ndarray] = {}
    for name in drivers:
        base = shapes[0].driver(name)
        if not base:
            continue
        column = np.array([s.driver(name) / base for s in shapes], dtype=float)
        if any(np.allclose(column, kept, rtol=1e-9, atol=0) for kept in columns.values()):
            continue
        columns[name] = column
    return columns


def _nnls(a: np.ndarray, y: np.ndarray, iterations: int = 100) -> np.ndarray:
    """min ||a x - y|| subject to x >= 0 (Lawson and Hanson's active-set method)."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tolerance = 1e-12 * max(float(np.abs(a.T @ y).max(initial=0.0)), 1.0)
    for _ in range(iterations):
        gradient = a.T @ (y - a @ x)
        if passive.all() or gradient[~passive].max() <= tolerance:
            break
        passive[np.argmax(np.where(passive, -np.inf, gradient))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], y, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            blocked = passive & (z <= 0)
            step = np.min(x[blocked] / (x[blocked] - z[blocked]))
            x = x + step * (z - x)
            passive &= x > tolerance
            x[~passive] = 0.0
    return x


def _miss(values: list[float], predicted: list[float]) -> float:
    return max((abs(v - p) for v, p in zip(values, predicted, strict=False)), default=0.0)


def _allowance(values: list[float], floor: int = FLOOR) -> float:
    return max(TOLERANCE * max((abs(v) for v in values), default=0.0), floor)


def _checked(values: list[float], residual: float) -> Grown:
    """Whether the drivers explain the runs: their largest miss within the allowance, and at
    least one calibration run besides the audited one to miss (else nothing was checked)."""
    allowance = _allowance(values)
    return {"residual": round(residual), "allowance": round(allowance),
            "explained": len(values) > 1 and residual <= allowance}


# -- one stage ---------------------------------------------------------------------------

def _allocator_growth(threshold: int | None, fit: _Fit, threads: int) -> int:
    """The allocator's retention growth (auditor.facts.allocator_retention), the mmap threshold taken
    to grow as the largest parameter tensor, up to glibc's 32 MiB. 0 for older records."""
    if threshold is None:
        return 0
    target = min(max(threshold * scale("largest", fit.audited, fit.target), threshold), MMAP_THRESHOLD_MAX)
    return allocator_retention.growth(threads, threshold, target)


def _project_stage(stage: Stage, key: tuple, fit: _Fit, dtype_factor: float, threads: int = 1) -> ProjectedStage:
    path = stage.path
    tensors = _Tensors.of(stage)
    components: dict[str, Grown] = {}
    for name, item in (stage.components or {}).items():
        driver = component_driver(name, item.category)
        how = fit.a_priori(driver, item.bytes, key, _component(name))
        projected = fit.grow(item.bytes, how["shares"])
        if item.category in MODEL_DTYPE_CATEGORIES:
            projected = round(projected * dtype_factor)
        components[name] = {"category": item.category, "bytes": item.bytes,
                            "projected": projected, **how}
    unseen = _unseen(tensors)
    unseen_how: Grown = (fit.fitted(unseen, key, _unseen, fallback="activations") if unseen or fit.calibrated
                        else {"how": "a priori", "shares": {}})
    transient = _transient(tensors)
    transient_how = fit.fitted(transient, key, _transient, fallback="parameters")
    unseen_projected = fit.grow(unseen, unseen_how["shares"])
    transient_projected = fit.grow(transient, transient_how["shares"])
    tensor_end = sum(c["projected"] or 0 for c in components.values()) + unseen_projected
    tensor_peak = tensor_end + transient_projected
    assert stage.rss.peak is not None, "a finished stage's RSS peak"
    measured_beyond = max(stage.rss.peak - (tensors.peak if tensors.peak is not None else _end(tensors)), 0)
    threshold = stage.live_tensors.allocator_threshold if stage.live_tensors else None
    growth = _allocator_growth(threshold, fit, threads)
    beyond_tensors = measured_beyond + growth
    return {
        "path": path, "parent": stage.parent, "components": components,
        "unseen_tensors": {"bytes": unseen, "projected": unseen_projected, **unseen_how},
        "transient": {"bytes": transient, "projected": transient_projected, **transient_how},
        "beyond_tensors": beyond_tensors, "beyond_measured": measured_beyond,
        "allocator_growth": growth, "allocator_growth_range": allocator_retention.growth_range(growth),
        "tensor_end": tensor_end, "tensor_peak": tensor_peak,
        "rss_peak": tensor_peak + beyond_tensors,
    }


def _peaks_inside_children(measured: list[Stage], stages: list[ProjectedStage]) -> None:
    """A stage whose measured peak is no higher than its children's takes their projected peak."""
    pairs = list(zip(measured, stages, strict=False))
    for real, stage in sorted(pairs, key=lambda p: -p[1]["path"].count("/")):  # deepest first
        children = [(r, p) for r, p in pairs if p.get("parent") == stage["path"]
                    and real.start_s <= r.start_s and (real.end_s is None or r.start_s <= real.end_s)]
        meter = _live_peak(real)
        child_peaks = [_live_peak(r) for r, _ in children]
        known = [p for p in child_peaks if p is not None]
        if not children or meter is None or len(known) < len(child_peaks) or meter > max(known):
            continue
        holder = max((p for _, p in children), key=lambda c: c["tensor_peak"])
        stage["peak_in"] = holder["path"]
        stage["tensor_peak"] = max(holder["tensor_peak"], stage["tensor_end"])
        stage["rss_peak"] = max(max(p["rss_peak"] for _, p in children),
                                stage["tensor_peak"] + stage["beyond_tensors"])
        stage["transient"]["projected"] = stage["tensor_peak"] - stage["tensor_end"]


def _live_peak(stage: Stage) -> int | None:
    return stage.live_tensors.peak if stage.live_tensors else None


def _explain(stages: list[ProjectedStage]) -> Projection:
    """Each stage's `explained` (where calibration runs checked it): every part of it explained
    by its drivers, and the child its peak lies in (`peak_in`) too; `unexplained` names the rest
    with their misses, `miss` the largest. Returns the projection's own: `explained` where every
    stage is, else the stages that are not and the largest miss."""
    done: dict[str, ProjectedStage] = {}
    for stage in sorted(stages, key=lambda s: -s["path"].count("/")):  # children first
        parts = [(name, c) for name, c in stage["components"].items()]
        parts.append(("unseen tensors", stage["unseen_tensors"]))
        if "peak_in" not in stage:  # else its peak is the child's, explained or not below
            parts.append(("transient", stage["transient"]))
        if all("explained" not in part for _, part in parts):
            continue  # no calibration runs: nothing was checked
        missed: list[Unexplained] = [{"what": what, "residual": part["residual"], "allowance": part["allowance"]}
                  for what, part in parts if part.get("explained") is False]
        holder = done.get(stage.get("peak_in") or "")
        if holder is not None and not holder["explained"]:
            missed.append({"what": f"peak in {holder['path']}", "residual": holder["miss"]})
        stage["explained"] = not missed
        if missed:
            stage["unexplained"], stage["miss"] = missed, max(m["residual"] for m in missed)
        done[stage["path"]] = stage
    if not done:
        return {}
    wrong = [s for s in stages if s.get("explained") is False]
    if not wrong:
        return {"explained": True}
    worst = max(wrong, key=lambda s: (s["miss"], s["path"].count("/")))  # where it arises, not its parents
    what = next(m["what"] for m in worst["unexplained"] if m["residual"] == worst["miss"])
    return {"explained": False, "unexplained_stages": [s["path"] for s in wrong],
            "miss": {"stage": worst["path"], "bytes": worst["miss"], "what": what}}
