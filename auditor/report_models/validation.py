"""The projection-validation report's content: everything it says, computed once from a
validation result (auditor.jobs.projection_validation.validate, or program_validation's).

    report = validation_report(result)
    report.missed, report.peaks[0].real, report.stages[0].tensors.projected["traced"].error, ...

Numbers, names and words, never markdown: auditor.renderers.validation_markdown only formats
it, for the markdown report and for the terminal's tables. Bytes throughout; an error is a
fraction (projected / real - 1).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from auditor.analysis.projection.estimated_bytes import estimate_note
from auditor.analysis.projection.validation import error, no_number
from auditor.record import derived

METHODS = ("scaled", "traced")


# -- the model -----------------------------------------------------------------------------

@dataclass
class Projected:
    bytes: int | None
    error: float | None            # against the real figure; None: nothing to compare
    withheld: str | None = None    # why no figure is shown: the run report prints none there either
    miss: int | None = None        # with `withheld`: the miss of the drivers that do not explain it


@dataclass
class Figure:
    """A real figure beside each projection's (method -> projected)."""
    real: int | None
    projected: dict[str, Projected]


@dataclass
class PeakLine:
    what: str                      # "live tensors" | "RSS"
    figure: Figure


@dataclass
class StageLine:
    path: str
    tensors: Figure                # the live-tensor peak inside the stage
    rss: Figure                    # its RSS peak


@dataclass
class ComponentLine:
    name: str
    category: str
    figure: Figure


@dataclass
class RestingOnEstimates:
    """The stages an every-stage target leaves out, resting partly on estimated sizes: the worst."""
    stages: int
    error: float
    path: str
    estimated_share: float         # of its projected bytes


@dataclass
class Target:
    what: str
    method: str
    limit: float
    error: float | None
    met: bool | None               # None: the projection printed no number to hold to it
    not_printed: str | None        # why, when met is None
    stages: int | None             # the every-stage target: the stages it is judged on
    resting_on_estimates: RestingOnEstimates | None


@dataclass
class Side:
    label: str
    parameters: int
    run: str                       # its run record


@dataclass
class GradProbeRun:
    variant: str
    strategy: str
    sequence_length: int
    batch_size: int
    batches: int
    sparsity: float


@dataclass
class ProgramRun:
    ran: str                       # the script and its arguments, or the function called
    model_from: str
    stages: list[str]
    held_out: str | None = None    # which held-out real run it was, in a sentence


@dataclass
class DataDependentSite:
    site: str
    op: str
    source: str | None             # "observed" | "declared" | "unknown"
    ratio: float | None            # elements out per element in
    calls: int
    output_numel: int
    conflicts: int


@dataclass
class DataDependent:
    """The traced projection's data-dependent sites, and how much of its peak rests on them."""
    note: str | None
    sites: list[DataDependentSite]


@dataclass
class CalibrationRun:
    label: str
    overrides: dict
    tokens: int


@dataclass
class Driver:
    name: str
    audited: float
    target: float
    ratio: float


@dataclass
class Transient:
    """A stage's transient (live-tensor peak minus end), split onto drivers."""
    path: str
    bytes: int
    how: str
    peak_in: str | None            # the inner stage holding the peak
    shares: dict[str, int]         # driver -> bytes at the audited shape
    residual: int | None           # the largest miss
    projected: int


@dataclass
class Refitted:
    """A component whose a-priori driver missed a calibration run, fitted instead."""
    stage: str
    name: str
    shares: list[str]


@dataclass
class Fit:
    method: str
    runs: list[CalibrationRun]
    drivers: list[Driver]          # those the stages use, by name
    transients: list[Transient]
    refitted: list[Refitted]


@dataclass
class ValidationReport:
    small: Side
    target: Side
    ran: GradProbeRun | ProgramRun
    scale_up: float                # in parameters
    scale_up_range: tuple[float, float]  # the one the targets are stated for
    methods: tuple[str, ...]       # the projections the result has
    targets: list[Target]
    missed: list[Target]
    not_checked: dict[str, list[Target]]  # why -> the targets with no number to check
    peaks: list[PeakLine]
    stages: list[StageLine]
    components_stage: str | None   # the real run's peak stage (or its live-tensor high's)
    components: list[ComponentLine]
    data_dependent: DataDependent | None
    fit: Fit | None                # the scaled projection's
    folder: str
    available: int | None          # memory available when checked
    margin: int
    components_why: str = "the real run's peak stage"  # why the components are that stage's

    @property
    def in_range(self) -> bool:
        low, high = self.scale_up_range
        return low <= self.scale_up <= high


# -- making it -----------------------------------------------------------------------------

def validation_report(result: dict) -> ValidationReport:
    """Everything the validation report says about `result` (a pure function of it)."""
    methods = tuple(m for m in METHODS if m in result["peak"])  # a program is projected by tracing alone
    found = targets(result["targets"])
    low, high = result.get("scale_up_range", (4, 20))
    return ValidationReport(
        small=_side(result["small"]), target=_side(result["target"]), ran=_ran(result["small"], result.get("held_out")),
        scale_up=result["scale_up"], scale_up_range=(low, high), methods=methods, targets=found,
        missed=[t for t in found if t.met is False], not_checked=_not_checked(found),
        peaks=_peaks(result, methods), stages=_stages(result, methods),
        components_stage=result["components_stage"], components=_components(result, methods),
        data_dependent=_data_dependent(result), fit=_fit(result), folder=result["folder"],
        available=result["available"], margin=result["margin"],
        components_why=result.get("components_why") or "the real run's peak stage")


def targets(checked: list[dict]) -> list[Target]:
    """The targets as checked (auditor.analysis.projection.validation.check_targets)."""
    return [Target(what=t["what"], method=t["method"], limit=t["limit"], error=t["error"], met=t["met"],
                   not_printed=t.get("not_printed"), stages=t.get("stages"),
                   resting_on_estimates=_resting(t.get("resting_on_estimates"))) for t in checked]


def _resting(worst: dict | None) -> RestingOnEstimates | None:
    if not worst:
        return None
    return RestingOnEstimates(worst["stages"], worst["error"], worst["path"], worst["estimated_share"])


def _not_checked(found: list[Target]) -> dict[str, list[Target]]:
    reasons: dict[str, list[Target]] = {}
    for t in found:
        if t.met is None:
            reasons.setdefault(t.not_printed or "no number", []).append(t)
    return reasons


def _side(side: dict) -> Side:
    return Side(side["label"], side["parameters"], side["run"])


def _ran(small: dict, held_out: dict | None = None) -> GradProbeRun | ProgramRun:
    if "program" in small:  # a program of the user's, its model swapped at --model-from
        program = small["program"]
        ran = shlex.join([program["script"].rsplit("/", 1)[-1], *program["args"]]) if program.get("script") \
            else f"{program['function']}()"
        return ProgramRun(ran, small["model_from"], small["stages"], (held_out or {}).get("sentence"))
    s = small["settings"]
    return GradProbeRun(s["variant"], s["strategy"], s["sequence_length"], s["batch_size"], s["batches"],
                        s["sparsity"])


Withheld = dict[str, tuple[str, int | None]]  # method -> (why its figure is not shown, the miss)


def _figure(real: int | None, projected: dict[str, int | None], withheld: Withheld | None = None) -> Figure:
    shown = {}
    for m, value in projected.items():
        why, miss = (withheld or {}).get(m, (None, None))
        shown[m] = Projected(None, None, why, miss) if why else Projected(value, error(value, real))
    return Figure(real, shown)


def _projection(result: dict, method: str) -> dict:
    return (result.get("projections") or {}).get(method) or {}


def _peaks(result: dict, methods: tuple[str, ...]) -> list[PeakLine]:
    """A projection that prints no number (auditor.analysis.projection.validation.no_number)
    shows none here either: a figure nobody may read is no figure to compare."""
    peak = result["peak"]
    withheld: Withheld = {m: (why, None) for m in methods if (why := no_number(_projection(result, m)))}
    return [PeakLine(what, _figure(peak["real"][key], {m: peak[m][key] for m in methods}, withheld))
            for what, key in (("live tensors", "live_tensors"), ("RSS", "rss"))]


_UNEXPLAINED = "not explained by its drivers"


def _stages(result: dict, methods: tuple[str, ...]) -> list[StageLine]:
    """Each stage; a projected stage its drivers do not explain (`explained: false`,
    auditor.analysis.projection.scaled) shows no figure, as in the run report."""
    from auditor.analysis.projection.scaled import json_stage_keys
    keyed = {m: json_stage_keys(_projection(result, m)) for m in methods}
    lines: list[StageLine] = []
    seen: dict[str, int] = {}
    for s in result["stages"]:
        n = seen[s["path"]] = seen.get(s["path"], -1) + 1
        entries = {m: keyed[m].get((s["path"], n)) or {} for m in methods}
        withheld: Withheld = {m: (_UNEXPLAINED, e.get("miss"))
                              for m, e in entries.items() if e.get("explained") is False}
        tensors, rss = (_figure(s["real"][key], {m: (s[m] or {}).get(key) for m in methods}, withheld)
                        for key in ("tensor_peak", "rss_peak"))
        lines.append(StageLine(s["path"], tensors, rss))
    return lines


def _components(result: dict, methods: tuple[str, ...]) -> list[ComponentLine]:
    """Each component at the real run's peak stage; one its drivers do not explain at that
    stage (in any call of it) shows no figure, as in the run report."""
    path = result["components_stage"]
    missed: dict[str, Withheld] = {}
    for m in methods:
        for entry in _projection(result, m).get("stages") or []:
            if entry.get("path") != path:
                continue
            for name, item in (entry.get("components") or {}).items():
                if isinstance(item, dict) and item.get("explained") is False:
                    missed.setdefault(name, {})[m] = (_UNEXPLAINED, item.get("residual"))
    return [ComponentLine(c["name"], c["category"], _figure(c["real"], {m: c[m] for m in methods},
                                                           missed.get(c["name"])))
            for c in result["components"]]


def _data_dependent(result: dict) -> DataDependent | None:
    traced = derived.check(derived.Projection, result["projections"].get("traced") or {}, "the traced projection")
    found = (traced.get("data_dependent") or {}).get("sites") or []
    if not found:
        return None
    return DataDependent(estimate_note(traced), [
        DataDependentSite(site=s["site"], op=s["op"], source=s.get("source"), ratio=s.get("ratio"),
                          calls=s["calls"], output_numel=s["output_numel"], conflicts=s.get("conflicts") or 0)
        for s in found])


def _fit(result: dict) -> Fit | None:
    fit = result.get("fit")
    if "scaled" not in result["projections"] or not fit:
        return None
    stages = result["projections"]["scaled"]["stages"]
    used = sorted({d for s in stages for d in s["transient"]["shares"]} | {"parameters", "buffers"})
    return Fit(
        method=fit["method"],
        runs=[CalibrationRun(r["label"], r["overrides"] or {}, r["tokens"]) for r in fit["runs"]],
        drivers=[Driver(d, fit["drivers"][d]["audited"], fit["drivers"][d]["target"], fit["drivers"][d]["ratio"])
                 for d in used if d in fit["drivers"]],
        transients=[Transient(s["path"], s["transient"]["bytes"], s["transient"]["how"], s.get("peak_in"),
                              s["transient"]["shares"], s["transient"].get("residual"), s["transient"]["projected"])
                    for s in stages],
        refitted=[Refitted(s["path"], n, c["shares"]) for s in stages
                  for n, c in s["components"].items() if c.get("how") == "fitted"])
