"""Results derived from a finished run, as types: the files beside run.json.

    projections.json   list[Projection]        each projection to a target (scaled or traced)
    calibration.json   list[CalibrationRun]    the compact records of the calibration runs
    (annotation)       EstimatedBytes          a traced run's bytes resting on estimated sizes

Each is a TypedDict: what the code writes is named here once, key by key, and nothing else can
be read (mypy refuses a key these types do not list, so a reader cannot wait on a key no code
writes). The JSON on disk is the same dict: `check` reads it back against its type (every
problem named by its path, as run.json's fields are) when it is written and when it is loaded
(auditor.record.run_folder.write_derived / with_derived). Keys written by an older version and
not listed here are kept, never read.
"""
from __future__ import annotations

import types
import typing
from typing import Any, Literal, TypedDict, Union

from auditor.record.schema import RunRecordError

# -- projections.json -------------------------------------------------------------------------


class Grown(TypedDict, total=False):
    """One quantity of a stage at the target: a component, the unseen tensors or the transient."""
    category: str
    bytes: int | None        # measured in the audited run (None: a traced component the run lacks)
    projected: int | None    # at the target (None: unexplained by its drivers)
    estimated: int           # traced: bytes resting on estimated data-dependent sizes
    how: str                 # scaled: the drivers it grows by, in words
    shares: dict[str, float]
    residual: int
    allowance: int
    explained: bool


class Unexplained(TypedDict, total=False):
    what: str
    residual: int
    allowance: int


class RssBand(TypedDict, total=False):
    """Where a traced projection's RSS may land (auditor.analysis.projection.rss_band)."""
    low: int
    high: int
    basis: str           # the run's peak band: its basis in a sentence
    retained: int        # a stage's band: the audited run's retention above its least beyond tensors
    grown: int           # that retention grown to the target
    grown_by: float
    grown_with: str      # "heap" or "tensors": what the growth follows


class Miss(TypedDict, total=False):
    stage: str | None
    what: str
    bytes: int | None


class ProjectedStage(TypedDict, total=False):
    path: str
    parent: str | None
    components: dict[str, Grown]
    unseen_tensors: Grown
    transient: Grown
    tensor_end: int
    tensor_peak: int
    rss_peak: int
    rss_band: RssBand
    beyond_tensors: int
    beyond_measured: int
    beyond_from: str
    allocator_growth: int
    allocator_growth_range: list[int]
    estimated: int
    explained: bool
    miss: int                # bytes its drivers leave unexplained
    unexplained: list[Unexplained]
    peak_in: str
    rss_may_add: int | None  # ranks: what the heap may keep beyond the band (auditor.analysis.ranks.projection)


class ProjectedPeak(TypedDict, total=False):
    stage: str | None
    rss: int | None
    live_tensors: int | None
    estimated: int
    rss_band: RssBand


class DataDependentSite(TypedDict, total=False):
    site: str
    op: str
    calls: int
    input_numel: int
    output_numel: int
    conflicts: int | None
    replayed_calls: int | None
    ratio: float | None
    source: str | None


class DataDependent(TypedDict, total=False):
    sites: list[DataDependentSite]
    unknown: list[DataDependentSite]
    method: str | None


class Projection(TypedDict, total=False):
    """A projection to one target: `scaled` (auditor.analysis.projection.scaled) or `traced`
    (auditor.analysis.projection.traced and the jobs that trace a program)."""
    method: str
    target: str
    target_dtype: str | None
    stages: list[ProjectedStage]
    peak: ProjectedPeak | None
    live_tensor_peak: int | None
    not_projected: str                     # the algorithm says it cannot be projected: why
    # scaled
    target_overrides: dict[str, Any]
    audited: dict[str, Any]                # the audited shape's facts (auditor.analysis.projection.drivers)
    shape: dict[str, Any]                  # the target's
    fit: dict[str, Any] | None             # the calibration fit: method, tolerance, runs, drivers
    explained: bool
    miss: Miss
    unexplained_stages: list[str]
    # traced
    run: str                               # the traced run's name
    run_folder: str
    data_dependent_ops: dict[str, int]
    data_dependent: DataDependent
    model_from: Any                        # --model-from as the traced run saw it
    target_built: dict[str, Any]           # how the target's model was built ("says": in words)
    traced_as_rank: dict[str, Any]         # the one rank a sharded run was traced as
    leaves_out: str                        # what the projection cannot see (children's memory)
    incomplete: str                        # the stage where the traced run stopped early
    failed_stage: str | None               # the stage where the traced run failed


# -- calibration.json and estimated bytes ------------------------------------------------------


class CalibrationRun(TypedDict, total=False):
    """A calibration run's compact record (auditor.jobs.calibration)."""
    label: str
    name: str
    workload: dict[str, Any]
    stages: list[dict[str, Any]]
    estimated_sizes: list[dict[str, Any]]


class EstimatedStage(TypedDict, total=False):
    path: str
    live_tensors: int
    peak_rise: int
    components: dict[str, int]


class EstimatedBytes(TypedDict, total=False):
    """How much of a traced run's figures rests on estimated data-dependent sizes
    (auditor.analysis.projection.estimated_bytes)."""
    stages: list[EstimatedStage]
    sites: list[dict[str, Any]]
    method: str


# The derived files: annotation key -> (file name, its type).
FILES: dict[str, tuple[str, Any]] = {
    "calibration": ("calibration.json", list[CalibrationRun]),
    "projections": ("projections.json", list[Projection]),
}


def check(kind: Any, value: Any, where: str) -> Any:
    """`value` if it is a `kind` (a type above, a list or dict of one); else RunRecordError, one
    line naming every problem by its path."""
    problems: list[str] = []
    _check(kind, value, "", problems)
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise RunRecordError(f"{where}: {shown}")
    return value


def projections(value: Any, where: str = "projections") -> list[Projection]:
    """A record's `projections` annotation, checked: the one shape every reader takes."""
    return typing.cast(list[Projection], check(list[Projection], value or [], where))


_WORDS = {str: "text", int: "a whole number", float: "a number", bool: "true or false"}


def _check(kind: Any, value: Any, path: str, problems: list[str]) -> None:
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        options = typing.get_args(kind)
        if value is None and type(None) in options:
            return
        (kind,) = [option for option in options if option is not type(None)]
        _check(kind, value, path, problems)
        return
    if kind is Any:
        return
    if origin is Literal:
        if value not in typing.get_args(kind):
            problems.append(f"{path or 'value'} should be one of {typing.get_args(kind)}, found {value!r}")
        return
    if origin is list:
        if not isinstance(value, list):
            problems.append(f"{path or 'value'} should be a list, found {type(value).__name__}")
            return
        (item,) = typing.get_args(kind)
        for i, v in enumerate(value):
            _check(item, v, f"{path}[{i}]", problems)
        return
    if origin is dict or typing.is_typeddict(kind):
        if not isinstance(value, dict):
            problems.append(f"{path or 'value'} should be a JSON object, found {type(value).__name__}")
            return
        prefix = f"{path}." if path else ""
        if origin is dict:
            item = typing.get_args(kind)[1]
            for k, v in value.items():
                _check(item, v, f"{prefix}{k}", problems)
            return
        hints = typing.get_type_hints(kind)
        missing = [k for k in kind.__required_keys__ if k not in value]
        if missing:
            problems.append(f"{path or 'value'} lacks {', '.join(sorted(missing))}")
        for k, v in value.items():
            if k in hints:  # a key an older version wrote and this one does not list: kept, unread
                _check(hints[k], v, f"{prefix}{k}", problems)
        return
    ok = (isinstance(value, bool) if kind is bool else
          not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else kind))
    if not ok:
        problems.append(f"{path or 'value'} should be {_WORDS.get(kind, kind.__name__)}, found {value!r:.40}")
