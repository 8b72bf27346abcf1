"""The run report's content: everything the memory report says, computed once from the record.

    report = run_report(record)
    report.summary.peak_rss, report.stages.lines, report.findings.found, ...

One object per section, in the report's order: banner (how the run ended), the answer (what
was alive at the peak, here and at each target) and the fixes (auditor.report_models.answer),
summary, stages, timeline, theoretical minimum; then the details: components, projections,
allocation sites, findings, environment.
Each holds numbers, names, the record's own parts and analysis results (`StageRow`s, `Finding`s,
`ProjectionView`s...), never markdown: auditor.renderers.markdown only formats it, and the
timeline and components PNGs are drawn from it (auditor.renderers.timeline_plot,
components_plot), so every analysis call the report needs is made here. Where the report is
written (its links, the flamegraph's) is the renderers' business.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from auditor.analysis.findings.program_kind import program_kind
from auditor.analysis.findings.rules import SEVERITIES, Finding, Outcome, evaluate, ordered
from auditor.analysis.projection.side_by_side import SideBySide, TargetSides, by_target, side_by_side
from auditor.analysis.projection.views import ProjectedStage, ProjectionView, method_words, projection_views
from auditor.analysis.ranks.merged import Spawn, spawns
from auditor.analysis.run import source_paths, stage_groups, timeline, unstaged
from auditor.analysis.run.attribution import Attribution, attribute, largest_weights, run_weights
from auditor.analysis.run.component_history import ComponentHistory, fold_component, history
from auditor.analysis.run.growers import at_peak_categories
from auditor.analysis.run.live_tensor_peak import live_tensor_high
from auditor.analysis.run.stage_groups import StageRow
from auditor.analysis.run.stages import census_before, census_order, final_stage, is_traced, peak_at_start, peak_stage
from auditor.analysis.run.unstaged import PeakPlace
from auditor.facts.allocation_sites import passes_through
from auditor.facts.allocator_retention import threshold_fixed
from auditor.record import schema as record_schema
from auditor.record.schema import (
    AtPeak,
    Children,
    EventLogState,
    Exit,
    Machine,
    Memray,
    ProbeState,
    RunRecord,
    Site,
    Stage,
)
from auditor.report_models.answer import Answer, Fixes, fix_table, peak_answer
from auditor.report_models.shown_names import as_shown

MAX_STAGE_ROWS = 300      # rows of the stage table, after folding repeated calls
LIVE_PEAK_STAGES = 3      # stages whose live-tensor high is shown besides the peak stage's


# -- the model -----------------------------------------------------------------------------

@dataclass
class Banner:
    """What a reader must know before any number: how the run ended, whether its event log is
    whole, whether it ran on fake tensors."""
    exit: Exit | None
    event_log: EventLogState | None
    traced: bool
    stages: int                # stages in the record
    finished: list[Stage]      # those that ended (ok or failed), in start order
    still_open: list[Stage]    # those open when the run stopped
    # the torch.multiprocessing spawns this process started (auditor.capture.staging.spawned_ranks): each one's
    # folder of ranks (None: not audited) and start method; their work is in those records
    spawned: list[Spawn] = field(default_factory=list)
    # child processes that held memory outside the record (process.children); None: none did
    children: Children | None = None


@dataclass
class UnstagedTime:
    """The time no stage covers, in all (the record has an `unstaged` list)."""
    intervals: int
    seconds: float
    run_s: float | None        # the audited time, for its share


@dataclass
class ProjectionHeadline:
    """A projection's line of the summary."""
    view: ProjectionView
    how: str                   # how it was projected, in words (method_words)
    # a scaled projection its drivers do not explain: the traced one of its target standing for it
    traced: ProjectionView | None = None


@dataclass
class Summary:
    name: str
    peak_rss: int | None
    peak_place: PeakPlace
    rss_at_start: int | None
    rss_at_end: int | None
    weights: int | None              # parameters: at the peak stage, else the most a census saw
    weights_from_any_census: bool    # the peak stage's census holds none
    buffers: int                     # module buffers of the peak stage, not in `weights`
    live_tensor_high: tuple[int, str] | None  # (bytes, where in words with `code`)
    largest_census: int              # live bytes of the largest census at a stage end
    projections: list[ProjectionHeadline]
    unstaged: UnstagedTime | None
    findings: dict[str, int]         # severity -> findings, most severe first


@dataclass
class StageLine:
    """A row of the stage table, with what the row alone does not know."""
    row: StageRow
    holds_peak: bool
    highest_call: str | None       # the call with the highest RSS peak (a folded row's)
    highest_live_call: str | None  # the call with the highest live-tensor peak


@dataclass
class Stages:
    recorded: int                  # stages in the record
    lines: list[StageLine]         # the rows shown, in reading order
    left_out: list[StageRow]       # rows beyond MAX_STAGE_ROWS
    unstaged_rows: bool            # intervals shown as rows of their own
    folded: bool                   # some row holds repeated calls
    live_tensors: bool             # columns the record has readings for
    py_heap: bool
    cuda: bool
    unstaged: UnstagedTime | None


@dataclass
class AliveAt:
    """What was alive at a live-tensor high (the record's `at_peak`), with its bytes by category."""
    at_peak: AtPeak
    categories: list[tuple[str, int]]


@dataclass
class UnstagedPeak:
    """What was alive at the run's peak when it fell in time no stage covers."""
    place: PeakPlace               # its interval, when the record has one matching
    alive: AliveAt | None          # measured in the interval
    census: Attribution | None     # else the census at the end of the last stage before it


@dataclass
class LiveHigh:
    """What was alive at one stage's live-tensor high."""
    stage: Stage
    call: str                      # which call it was (the stage's name when not a staged call)
    is_peak_stage: bool            # else one of the top live-tensor peaks
    alive: AliveAt


@dataclass
class StageCensus:
    """One stage's end census, attributed, beside each projection's figures for that stage."""
    moment: Literal["just before the peak stage", "at the peak stage", "at the last stage"]
    stage: Stage
    attribution: Attribution | None
    projected: list[tuple[ProjectionView, ProjectedStage | None]]


@dataclass
class OneCensus:
    """A run with a single census (one stage around the work): no timeline to draw, so its
    stage's live-tensor high beside its end, each by folded component."""
    stage: Stage | None            # the stage the census was taken at the end of
    at_high: dict[str, int]        # folded component -> bytes at the live-tensor high; empty: not metered
    at_end: dict[str, int]         # folded component -> bytes in the census


@dataclass
class Components:
    census_ends: int                      # stage ends with a census; 0: the record has none
    over_the_run: list[ComponentHistory]  # largest first
    run_s: float | None                   # the audited time: the plot holds the last census to it
    unstaged_peak: UnstagedPeak | None
    live_highs: list[LiveHigh]
    peak_stage: Stage | None
    censuses: list[StageCensus]           # before the peak stage (when it peaked at its start), at it, at the end
    one_census: OneCensus | None = None   # the census was taken once: what the components plot draws instead

    @property
    def has_census(self) -> bool:
        return self.census_ends > 0


@dataclass
class Timeline:
    """The run's memory over time, for its plot: the stages' readings with the unstaged
    intervals' joined (auditor.analysis.run.timeline, unstaged.on_timeline)."""
    line: timeline.Timeline
    unstaged_peaks: list[timeline.Peak]   # intervals' peaks above both their ends, at their middle


@dataclass
class StackFrame:
    function: str
    where: str                     # its file and line without the machine's folders; "" unknown


@dataclass
class SiteLine:
    site: Site
    where: str                     # its location without the machine's folders
    stack: list[StackFrame]        # innermost first, torch's call plumbing left out
    native: bool                   # no Python frame: the stack is native


@dataclass
class Sites:
    """memray's allocation sites alive at its high-water mark."""
    memray: Memray | None
    probe: ProbeState | None       # memray's probe: why there is no trace
    lines: list[SiteLine]


@dataclass
class Findings:
    found: list[Finding]           # most severe first
    outcomes: list[Outcome]        # every rule: fired, silent or not checked
    shown_sites: dict[str, str]    # a memray site named in evidence -> as shown


@dataclass
class Minimum:
    """The theoretical minimum the job declared, against what the run measured."""
    items: list[dict]              # {name, bytes, why} as the job wrote them; empty: none declared
    total: int
    note: str | None
    peak_rss: int | None
    live_tensor_high: tuple[int, str] | None


@dataclass
class Environment:
    software: record_schema.Environment
    machine: Machine | None
    device: str
    command: str                   # as run, the audited code's paths shortened
    started_at: str
    finished_at: str | None
    audited_s: float | None
    exit: Exit | None
    overhead_s: dict[str, float]
    probes: dict[str, ProbeState]
    live_tensors_absent: bool      # no meter readings and no probe saying why
    malloc_threshold_fixed: bool   # glibc's mmap threshold stays where the run's malloc settings put it
    warnings: list[str]


@dataclass
class RunReport:
    """The memory report of one run, section by section."""
    banner: Banner
    answer: Answer | None          # None: no census at the peak stage
    fixes: Fixes
    summary: Summary
    stages: Stages
    components: Components
    projections: list[SideBySide]
    targets: list[TargetSides]     # the projections above, each target's methods together
    timeline: Timeline
    sites: Sites
    findings: Findings
    minimum: Minimum
    environment: Environment


# -- making it -----------------------------------------------------------------------------

def run_report(record: RunRecord) -> RunReport:
    """Everything the run report says about `record` (a pure function of it)."""
    record = as_shown(record)  # stage names shown with their control characters escaped
    outcomes = evaluate(record)
    found = ordered([f for o in outcomes for f in o.findings])
    views = projection_views(record)
    place = unstaged.peak_place(record)
    time = _unstaged_time(record)
    components = _components(record, place, views)
    at_peak = next((c for c in components.censuses if c.moment == "at the peak stage"), None)
    sides = side_by_side(record)
    return RunReport(
        banner=_banner(record),
        answer=peak_answer(at_peak.attribution, at_peak.projected, record) if at_peak and at_peak.attribution else None,
        fixes=fix_table(found, program_kind(record)), summary=_summary(record, place, views, found, time),
        stages=_stages(record, time), components=components, projections=sides, targets=by_target(sides),
        timeline=_timeline(record), sites=sites(record),
        findings=_findings(record, found, outcomes), minimum=_minimum(record), environment=environment(record))


def _banner(record: RunRecord) -> Banner:
    return Banner(exit=record.exit, event_log=record.event_log, traced=is_traced(record),
                  stages=len(record.stages),
                  finished=[s for s in record.stages if s.status != "open"],
                  still_open=[s for s in record.stages if s.status == "open"],
                  spawned=spawns(record), children=record.process.children)


def _unstaged_time(record: RunRecord) -> UnstagedTime | None:
    if record.unstaged is None:  # an older record: it does not say
        return None
    count, seconds = unstaged.total(record)
    return UnstagedTime(count, seconds, record.duration_s)


def _summary(record: RunRecord, place: PeakPlace, views: list[ProjectionView], found: list[Finding],
             time: UnstagedTime | None) -> Summary:
    weights, largest = run_weights(record), largest_weights(record)
    holder = peak_stage(record)
    attribution = attribute(holder) if holder is not None else None
    return Summary(
        name=record.name, peak_rss=record.peak.rss, peak_place=place,
        rss_at_start=record.process.rss_at_start, rss_at_end=record.process.rss_at_end,
        weights=weights or largest, weights_from_any_census=not weights and bool(largest),
        buffers=attribution.buffers if attribution is not None else 0,
        live_tensor_high=live_tensor_high(record),
        largest_census=max(((s.tensors.live_bytes if s.tensors else None) or 0 for s in record.stages), default=0),
        projections=[ProjectionHeadline(v, method_words(v), _traced_for(v, views)) for v in views], unstaged=time,
        findings={s: sum(1 for f in found if f.severity == s) for s in SEVERITIES})


def _traced_for(view: ProjectionView, views: list[ProjectionView]) -> ProjectionView | None:
    """The traced projection of the same target that stands for `view` when its drivers do not
    explain it (and the traced one has figures)."""
    if view.unexplained is None:
        return None
    return next((v for v in views if v.method == "traced" and v.target == view.target
                 and v.target_dtype == view.target_dtype and v.live_tensor_peak is not None), None)


def _stages(record: RunRecord, time: UnstagedTime | None) -> Stages:
    stages = record.stages
    shown_intervals = unstaged.notable(record) if stages else []  # no stages: no table
    every = stage_groups.stage_rows(record, shown_intervals)
    kept, left = stage_groups.limit(every, MAX_STAGE_ROWS, record)
    return Stages(
        recorded=len(stages), lines=[_stage_line(row, record) for row in kept], left_out=left,
        unstaged_rows=bool(shown_intervals), folded=any(r.kind == "folded" for r in every),
        live_tensors=any(s.live_tensors is not None for s in stages),
        py_heap=any(s.py_heap is not None for s in stages), cuda=any(s.cuda is not None for s in stages),
        unstaged=time)


def _stage_line(row: StageRow, record: RunRecord) -> StageLine:
    at, live_at = row.highest("rss")[1], row.highest("live_tensors")[1]
    return StageLine(row, stage_groups.holds(row, record),
                     stage_groups.call_name(at) if isinstance(at, Stage) else None,  # an interval has no call
                     stage_groups.call_name(live_at) if isinstance(live_at, Stage) else None)


def _components(record: RunRecord, place: PeakPlace, views: list[ProjectionView]) -> Components:
    ends = census_order(record)
    holder = peak_stage(record)
    components = Components(
        census_ends=len(ends), over_the_run=history(record) if ends else [], run_s=record.duration_s,
        unstaged_peak=_unstaged_peak(record, place) if place.kind == "unstaged" else None,
        live_highs=_live_highs(record, place), peak_stage=holder,
        censuses=_censuses(record, holder, views) if ends and holder is not None else [])
    items = components.over_the_run
    if items and len(items[0].series) < 2:
        components.one_census = _one_census(components)
    return components


def _one_census(components: Components) -> OneCensus:
    """The single census's stage: its live-tensor high (the `at_peak` rows, named by the
    censuses taken inside it) and its end, by folded component."""
    stage: Stage | None
    if components.censuses:
        stage = components.censuses[-1].stage
    elif components.peak_stage is not None:
        stage = components.peak_stage
    else:
        highs = sorted(components.live_highs, key=lambda high: not high.is_peak_stage)
        stage = highs[0].stage if highs else None
    meter = stage.live_tensors if stage is not None else None
    at_high: dict[str, int] = {}
    for row in meter.at_peak.rows if meter is not None and meter.at_peak is not None else []:
        name = fold_component(row.owner) if row.owner else f"({row.category or 'unnamed'})"
        at_high[name] = at_high.get(name, 0) + row.bytes
    return OneCensus(stage, at_high, {item.name: item.series[-1][1] for item in components.over_the_run})


def _alive(at_peak: AtPeak) -> AliveAt:
    return AliveAt(at_peak, at_peak_categories(at_peak))


def _unstaged_peak(record: RunRecord, place: PeakPlace) -> UnstagedPeak:
    found = unstaged.composition(record, place.interval) if place.interval is not None else None
    if found is None:
        return UnstagedPeak(place, None, None)
    _, value = found
    if isinstance(value, AtPeak):  # measured in the interval; else the census of a stage before it
        return UnstagedPeak(place, _alive(value), None)
    return UnstagedPeak(place, None, attribute(value))


def _live_highs(record: RunRecord, place: PeakPlace) -> list[LiveHigh]:
    """The peak stage's live-tensor high and the top live peaks, none shown twice."""
    chosen: list[Stage] = []
    holder = next((s for s in record.stages if s.path == place.stage), None) if place.stage else None
    if holder is not None and holder.live_tensors is not None and holder.live_tensors.at_peak is not None:
        chosen.append(holder)
    interval = place.interval  # the run's peak in unstaged time: its high is shown above
    shown = interval.live_tensors if interval is not None else None
    for stage in stage_groups.top_live_peaks(record, LIVE_PEAK_STAGES):
        same = (interval is not None and shown is not None and shown.at_peak is not None
                and stage.path == interval.parent
                and stage.live_tensors is not None and stage.live_tensors.peak == shown.peak)
        if not same and all(stage is not c for c in chosen):  # not the moment shown above again
            chosen.append(stage)
    highs = []
    for stage in chosen[:LIVE_PEAK_STAGES + 1]:
        meter = stage.live_tensors
        assert meter is not None and meter.at_peak is not None  # chosen for it
        highs.append(LiveHigh(stage, stage_groups.call_name(stage), stage is holder, _alive(meter.at_peak)))
    return highs


def _censuses(record: RunRecord, holder: Stage, views: list[ProjectionView]) -> list[StageCensus]:
    def census(moment, stage: Stage) -> StageCensus:
        return StageCensus(moment, stage, attribute(stage), [(v, v.stages.get(stage.path)) for v in views])

    before = census_before(record, holder) if peak_at_start(holder) else None
    found = [census("just before the peak stage", before)] if before is not None else []  # what made the peak
    found.append(census("at the peak stage", holder))
    last = final_stage(record)
    if last is not None and last is not holder:
        found.append(census("at the last stage", last))
    return found


def _timeline(record: RunRecord) -> Timeline:
    line = timeline.timeline(record)
    return Timeline(line, unstaged.on_timeline(record, line))  # which also joins the intervals' readings


def sites(record: RunRecord) -> Sites:
    """The allocation sites section (the training-step report has one per configuration)."""
    memray = record.memray
    probe = _memray_probe(record)
    root = source_paths.code_root(record)
    lines = [_site_line(site, root) for site in memray.sites] if memray is not None else []
    return Sites(memray, probe, lines)


def _memray_probe(record: RunRecord) -> ProbeState | None:
    """memray's probe as the report states it: one that traced but whose trace was never read
    back (the process killed first) failed, saying why."""
    probe = (record.probes or {}).get("memray")
    if record.memray is None and probe is not None and probe.state == "on":
        return ProbeState(state="failed", method=probe.method, reason=_unread_trace(record))
    return probe


def _unread_trace(record: RunRecord) -> str:
    """Why a run memray traced has no memray section: its trace was never read back."""
    if record.exit is not None and record.exit.status == "unfinished":
        return ("memray traced this run, but the process was killed before the audit ended (an OOM kill or "
                "SIGKILL gives it no chance to finish), and memray writes its trace only at the end: "
                "memray.bin is empty or cut short, and unreadable")
    return "memray traced this run, but its trace was not read back into the record"


def _site_line(site: Site, root: str | None) -> SiteLine:
    frames, native = site.python_stack, not site.python_stack
    # a Python stack leaves out torch's call plumbing: it says nothing about who asked for the memory
    frames = site.native_stack if native else [f for f in frames if not passes_through(*_function_and_file(f))]
    return SiteLine(site, source_paths.shown_path(site.location, root),
                    [_frame(f, root) for f in frames], native)


def _frame(frame: str, root: str | None) -> StackFrame:
    function, _, where = frame.removesuffix(" (<unknown>)").partition(" at ")  # native: no known file
    return StackFrame(function, source_paths.shown_path(where, root) if where else "")


def _function_and_file(frame: str) -> tuple[str, str]:
    function, _, where = frame.partition(" at ")
    return function, where.rsplit(":", 1)[0]


def _findings(record: RunRecord, found: list[Finding], outcomes: list[Outcome]) -> Findings:
    root = source_paths.code_root(record)
    named = {f.evidence["memray_site"] for f in found if f.evidence.get("memray_site")}
    return Findings(found, outcomes, {site: source_paths.shown_path(site, root) for site in named})


def _minimum(record: RunRecord) -> Minimum:
    declared = record.annotations.get("minimum")  # the job's own JSON
    if not isinstance(declared, dict) or not declared.get("items"):
        declared = {}
    items = declared.get("items") or []
    total = declared.get("total")
    return Minimum(items=items, total=sum(i.get("bytes") or 0 for i in items) if total is None else total,
                   note=declared.get("note") or None, peak_rss=record.peak.rss,
                   live_tensor_high=live_tensor_high(record))


def environment(record: RunRecord) -> Environment:
    """The environment section (the training-step report shows its first configuration's)."""
    probes = dict(record.probes or {})
    if "memray" in probes:
        probes["memray"] = _memray_probe(record) or probes["memray"]
    return Environment(
        software=record.environment, machine=record.machine, device=record.device,
        command=source_paths.shown_command(record.command, source_paths.code_root(record)),
        started_at=record.started_at, finished_at=record.finished_at, audited_s=record.duration_s,
        exit=record.exit, overhead_s=record.audit_overhead_s or {}, probes=probes,
        live_tensors_absent=(not any(s.live_tensors is not None for s in record.stages)
                             and "live_tensors" not in probes),
        malloc_threshold_fixed=threshold_fixed(record.environment.malloc or {}),
        warnings=record.warnings)
