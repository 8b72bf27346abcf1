"""Attribution: where the RSS of a stage goes, by component and by category.

A stage's census is taken at its end, so attribution explains the stage's **end** RSS:

    components (census)                                 sum = census total
    tensors held by autograd / not reachable            live-tensor meter minus census (when metered)
    RSS beyond the census (allocator slack, ...)        RSS at the end minus census total
    ------------------------------------------------------------------------------------
    RSS at the end of the stage                         = census total + beyond the census

"RSS beyond the census" is never dropped, even when it is negative (a census larger than
RSS means pages counted as tensor bytes were never touched). Where the live-tensor meter is
present, it splits into the tensors the census cannot reach and the rest.

"Weights", as the ratios in the report use the word, are the parameters: the components of
category "weights" other than module buffers (`*.buffers`: attention masks, rotary tables),
which algorithms do not copy. On a real model the two differ by a few percent; on a tiny test
model the causal-mask buffers can outweigh the parameters.

Projection columns come from the record's `projections` list (see `projection_views`).
Everything here is a pure function of the run record.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from auditor.analysis.projection.standing import Failure, stand_in, traced_failure
from auditor.facts import units
from auditor.record.schema import AtPeak, Readings, RunRecord, Stage, Unstaged

WEIGHTS = "weights"
BEYOND_CENSUS = "RSS beyond the census (allocator slack, interpreter, libraries)"
UNSEEN_TENSORS = "tensors held by autograd / not reachable (live-tensor meter minus census)"
BEYOND_LIVE = "RSS beyond live tensors (allocator slack, interpreter, libraries)"


@dataclass
class ComponentRow:
    name: str
    category: str
    bytes: int
    share: float | None  # of the stage's RSS at its end


@dataclass
class Attribution:
    """One stage's end RSS, attributed."""
    stage: str
    status: str
    rss_end: int | None
    rss_peak: int | None
    rows: list[ComponentRow]              # largest first
    categories: list[tuple[str, int]]     # (category, bytes), largest first
    census: int                           # sum of the components
    beyond_census: int | None             # rss_end - census
    live_tensors_end: int | None          # the live-tensor meter at the stage end, when present
    unseen: int | None                    # live_tensors_end - census, when metered
    beyond_live: int | None               # rss_end - live_tensors_end, when metered
    weights: int                          # parameters (category weights, buffers excluded)
    buffers: int                          # module buffers (category weights)

    def share(self, value: int | None) -> float | None:
        if value is None or not self.rss_end:
            return None
        return value / self.rss_end


def is_traced(record: RunRecord) -> bool:
    """A run on fake tensors (a projection by tracing): its RSS is the tracing process's."""
    return bool((record.options or {}).get("traced"))


def stage_depths(record: RunRecord) -> dict[str, int]:
    """Depth of each stage path: 0 for top-level stages."""
    depths: dict[str, int] = {}
    for entry in record.stages:  # start order: a parent comes before its children
        parent = entry.parent
        depths[entry.path] = 0 if parent is None else depths.get(parent, 0) + 1
    return depths


def finished(record: RunRecord) -> list[Stage]:
    return [s for s in record.stages if s.status != "open" and s.end_s is not None]


def ended(entry: Stage | Unstaged) -> float:
    """When a finished stage or an unstaged interval ended: the record always says (a stage
    never finished is not among `finished`)."""
    assert entry.end_s is not None, "a finished stage or an interval has its end_s"
    return entry.end_s


METERS = ("rss", "py_heap", "live_tensors")


def meter(entry: Stage | Unstaged, key: str) -> Readings | None:
    """A stage's or an unstaged interval's meter by its name in the record (`METERS`); None
    where it was off."""
    if key not in METERS:
        raise KeyError(f"no meter {key!r}; the record has {', '.join(METERS)}")
    return getattr(entry, key)


def census_order(record: RunRecord) -> list[Stage]:
    """The finished stages that carry a census, in the order their censuses were taken."""
    return sorted((s for s in finished(record) if s.components is not None),
                  key=lambda s: (ended(s), s.id or 0))


def peak_stage(record: RunRecord) -> Stage | None:
    """The stage entry holding the run's peak RSS (by id, else by path)."""
    stage_id, path = record.peak.stage_id, record.peak.stage
    for entry in record.stages:
        if stage_id is not None and entry.id == stage_id:
            return entry
    for entry in record.stages:
        if path is not None and entry.path == path:
            return entry
    return None


def census_before(record: RunRecord, stage: Stage) -> Stage | None:
    """The last census taken before `stage` began (the stage end just before it), if any."""
    earlier = [s for s in census_order(record) if ended(s) <= stage.start_s and s is not stage]
    return earlier[-1] if earlier else None


def peak_at_start(stage: Stage) -> bool:
    """Whether the stage's peak is nearer its start reading than its end reading: then the
    census at its end describes the memory after the peak, the one before it the peak."""
    rss = stage.rss
    if rss.peak is None or rss.end is None:
        return False
    assert rss.start is not None, "a stage's RSS has its start reading"
    return rss.peak - rss.start < rss.peak - rss.end


def final_stage(record: RunRecord) -> Stage | None:
    """The last stage to finish with a census: what is left when the algorithm returns."""
    ordered = census_order(record)
    return ordered[-1] if ordered else None


def is_buffer(name: str) -> bool:
    return name == "buffers" or name.endswith(".buffers")


def weights_bytes(stage: Stage) -> int | None:
    """Parameters at the stage end (category weights, module buffers excluded); None without a census."""
    components = stage.components
    if components is None:
        return None
    weights = [(n, c.bytes) for n, c in components.items() if c.category == WEIGHTS]
    parameters = sum(b for n, b in weights if not is_buffer(n))
    return parameters if parameters else sum(b for _, b in weights)


def run_weights(record: RunRecord) -> int | None:
    """The weights for the run's ratios: at the peak stage, else at the last census."""
    for entry in (peak_stage(record), final_stage(record)):
        if entry is not None and entry.components is not None:
            return weights_bytes(entry)
    return None


def live_tensor_peak(record: RunRecord) -> tuple[int, str] | None:
    """The highest live-tensor meter reading of the run and the stage holding it, if metered."""
    best = None
    for entry in finished(record):
        peak = entry.live_tensors.peak if entry.live_tensors else None
        if peak is not None and (best is None or peak > best[0]):
            best = (peak, entry.path)
    return best


def live_tensor_high(record: RunRecord) -> tuple[int, str] | None:
    """The run's highest live-tensor reading, stages and unstaged intervals alike, and where it
    was in words (markdown): "in stage `X`" or "after the last stage (`X`)"."""
    from auditor.analysis.run.unstaged import describe, intervals
    best = live_tensor_peak(record)
    place = None if best is None else (best[0], f"in stage `{best[1]}`")
    for interval in intervals(record):
        peak = interval.live_tensors.peak if interval.live_tensors else None
        if peak is not None and (place is None or peak > place[0]):
            place = (peak, f"in time no stage covers, {describe(interval)}")
    return place


def attribute(stage: Stage) -> Attribution | None:
    """The stage's end RSS by component and category; None when the stage has no census."""
    components = stage.components
    if components is None:
        return None
    rss_end = stage.rss.end
    census = sum(c.bytes for c in components.values())

    def share(value: int) -> float | None:
        return value / rss_end if rss_end else None

    rows = sorted((ComponentRow(name, c.category or "other", c.bytes, share(c.bytes))
                   for name, c in components.items()), key=lambda r: (-r.bytes, r.name))
    totals: dict[str, int] = {}
    for row in rows:
        totals[row.category] = totals.get(row.category, 0) + row.bytes
    live_end = stage.live_tensors.end if stage.live_tensors else None
    weights = weights_bytes(stage) or 0
    buffers = sum(c.bytes for n, c in components.items() if c.category == WEIGHTS and is_buffer(n))
    return Attribution(
        stage=stage.path, status=stage.status, rss_end=rss_end,
        rss_peak=stage.rss.peak, rows=rows,
        categories=sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])), census=census,
        beyond_census=None if rss_end is None else rss_end - census,
        live_tensors_end=live_end,
        unseen=None if live_end is None else live_end - census,
        beyond_live=None if live_end is None or rss_end is None else rss_end - live_end,
        weights=weights, buffers=buffers)


def attributions(record: RunRecord) -> list[Attribution]:
    """Every stage with a census, in census order."""
    return [a for a in (attribute(s) for s in census_order(record)) if a is not None]


# -- projections -------------------------------------------------------------------------

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
    unexplained: dict[str, int] = field(default_factory=dict)
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
    unexplained: dict | None = None  # {stage, bytes}: the headline's drivers miss; its figures are None
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


def estimate_note(item: dict) -> str | None:
    from auditor.analysis.projection.estimated_bytes import estimate_note as note
    return note(item)


def projection_views(record: RunRecord) -> list[ProjectionView]:
    """The record's `projections` (an annotation: JSON), grouped by target with scaled before traced.

    An item is either a dict as `auditor.analysis.projection.scaled.project` returns (method,
    target, stages[{path, components{name: {projected}}, unseen_tensors, transient,
    beyond_tensors, tensor_peak, rss_peak}], peak), or a traced run: a run record of its own
    (`schema` present), or `{method, target, target_dtype?, record}`; a traced run's bytes
    are taken as its projection: its component bytes and live-tensor meter (the RSS of a
    traced run is the tracing process's, not the target's, so it is not used). Items of
    neither shape are skipped; a traced run that is not a valid run record is a RunRecordError.
    """
    views = []
    for item in record.annotations.get("projections") or []:
        if isinstance(item, RunRecord):  # held typed by a caller: the run itself
            view = _traced_run_view(item)
        elif not isinstance(item, dict):
            continue
        elif "schema" in item or isinstance(item.get("record"), (dict, RunRecord)):
            view = _traced_run_view(item)
        elif isinstance(item.get("stages"), list):
            view = _hide_unexplained(_projection_view(item), item)
            view.failed, view.stand_in = traced_failure(item), stand_in(item)
        else:
            view = None
        if view is not None:
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
    from auditor.analysis.projection.validation import TARGETS, error
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


def _projection_view(item: dict) -> ProjectionView:
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


def rss_basis(item: dict, stage_path: str | None) -> str | None:
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


def _hide_unexplained(view: ProjectionView, item: dict) -> ProjectionView:
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


UNCALIBRATED = ("uncalibrated: each quantity grown by an assumed driver (transients by parameters, "
                "unseen tensors by activations), fitted on no run; it can be off by several times, "
                "so trust the traced projection (a run without --no-trace calibrates this one)")


def scaled_caveat(item: dict) -> str | None:
    """A projection of an algorithm that cannot be projected says why (`not_projected`); a scaled
    projection made without calibration runs says so (`fit.runs` empty)."""
    if item.get("not_projected"):
        return str(item["not_projected"])
    fit = item.get("fit")
    if item.get("method", "scaled") != "scaled" or not isinstance(fit, dict):
        return None
    return UNCALIBRATED if not fit.get("runs") else None


def _traced_run_view(item: dict | RunRecord) -> ProjectionView:
    """A traced run as a projection: `item` is the run (its JSON, or typed), or holds it in
    `record` beside its method, target and target_dtype."""
    about = item.annotations if isinstance(item, RunRecord) else item  # method, target...: JSON
    held = about.get("record") if isinstance(about.get("record"), (dict, RunRecord)) else item
    run = held if isinstance(held, RunRecord) else RunRecord.from_json(held, "a traced run in the record's projections")
    workload = run.annotations.get("workload") or {}
    stages = {}
    for entry in run.stages:
        live, components = entry.live_tensors, entry.components
        stages[entry.path] = ProjectedStage(
            components={n: c.bytes for n, c in (components or {}).items()},
            unseen=(live.end - sum(c.bytes for c in components.values()))
            if live is not None and live.end is not None and components else None,
            tensor_peak=live.peak if live is not None else None)
    metered = [(s.tensor_peak, path) for path, s in stages.items() if s.tensor_peak is not None]
    best = max(metered) if metered else (None, None)
    return ProjectionView(method=about.get("method", "traced"),
                          target=str(about.get("target") or workload.get("architecture") or run.name),
                          target_dtype=about.get("target_dtype") or workload.get("dtype"),
                          peak_rss=None, peak_stage=best[1], live_tensor_peak=best[0], stages=stages)


# -- what grew inside a stage ------------------------------------------------------------

@dataclass
class Grower:
    """State that grew inside a stage: a component (by owner), or temporaries by creating op."""
    name: str             # a component name, or "temporaries from `op` in `stage`"
    category: str
    bytes: int
    kept: bool            # still alive at the stage's end
    basis: str            # "at_peak" (alive at the live-tensor high) or "census" (end minus before)


def within(path: str | None, stage_path: str) -> bool:
    """Whether a stage path is the stage itself or a stage inside it."""
    return path is not None and (path == stage_path or path.startswith(stage_path + "/"))


def growers(record: RunRecord, stage: Stage) -> list[Grower] | None:
    """What the stage added, largest first: from its `live_tensors.at_peak` (storages created
    inside it and alive at its live-tensor high) when the record has it, else from the census
    at its end minus the census just before it began; None when neither can tell."""
    at_peak = stage.live_tensors.at_peak if stage.live_tensors else None
    if at_peak is not None:
        groups: dict[tuple[str, str], tuple[int, bool]] = {}
        for row in at_peak.rows:
            if not within(row.created_in, stage.path):
                continue  # alive before the stage began: it did not grow here
            if row.owner:
                key = (row.owner, row.category or "other")
            else:
                op = f"`{row.op}`" if row.op else "an unknown op"
                key = (f"temporaries from {op} in `{row.created_in}`", row.category or "other")
            held, kept = groups.get(key, (0, False))
            groups[key] = (held + row.bytes, kept or bool(row.alive_at_end))
        return sorted((Grower(name, category, b, kept, "at_peak") for (name, category), (b, kept) in groups.items()),
                      key=lambda g: (-g.bytes, g.name))
    before = census_before(record, stage)
    if stage.components is None or before is None:
        return None
    earlier = before.components or {}
    grown = [Grower(name, c.category or "other", c.bytes - (earlier[name].bytes if name in earlier else 0),
                    True, "census") for name, c in stage.components.items()]
    return sorted((g for g in grown if g.bytes > 0), key=lambda g: (-g.bytes, g.name))


def at_peak_categories(at_peak: AtPeak) -> list[tuple[str, int]]:
    """An `at_peak` composition's bytes by category, largest first (rows left out apart)."""
    totals: dict[str, int] = {}
    for row in at_peak.rows:
        category = row.category or "other"
        totals[category] = totals.get(category, 0) + row.bytes
    return sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))


def largest_weights(record: RunRecord) -> int | None:
    """The most parameters any census saw: the weights to compare with when the stage at hand
    has none in its census (a helper's stage, a census after the model was freed)."""
    seen = [weights_bytes(s) for s in census_order(record)]
    return max((w for w in seen if w), default=None)
