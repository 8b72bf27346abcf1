"""Findings: what a run record shows, detected by rules with stated thresholds.

    for finding in findings(record):
        finding.severity, finding.statement, finding.evidence

Each rule is a pure function of the record; none is written by hand for a particular run.
`RULES` lists them with their thresholds (the report prints them); `evaluate` says for each
what it found, or why it could not be checked (a probe absent).

"Weights" are the parameters at each stage's census (see `auditor.analysis.run.components`);
"peak" is the run's peak RSS.

Each rule also says how to remove what it found (`Rule.remedy`, in plain words; a finding may
word it for its evidence) and what that would save (`Finding.saving`): the bytes of the
evidence at the audited scale and, where the record has projections, the same components'
projected bytes at each target. A saving is an upper bound ("up to"): the remedy removes what
the evidence names, and whatever the algorithm still needs of it comes back. Where the job
that ran the algorithm put measured variants in the record (`validated_remedies`), the
findings they answer cite them (`Finding.validated`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from auditor.analysis.findings.child_processes import CHILD_HIGH, CHILD_SHARE, child_memory
from auditor.analysis.findings.finding import SEVERITIES, Finding
from auditor.analysis.findings.noise_band import BORDERLINE, RSS_BAND, Band, rss_band, tensor_band
from auditor.analysis.findings.program_kind import Kind, program_kind
from auditor.analysis.findings.remedies import GENERIC, TEMPORARIES, remedy
from auditor.analysis.findings.rss_rules import (
    RETENTION_SHARE,
    TENSOR_GAP_SHARE,
    UNTRACKED_SHARE,
    tensor_gap,
    untracked,
)
from auditor.analysis.projection.views import ProjectedStage, method_words, projection_views
from auditor.analysis.run import source_paths, unstaged
from auditor.analysis.run.attribution import is_buffer, largest_weights, weights_bytes
from auditor.analysis.run.growers import growers
from auditor.analysis.run.live_tensor_peak import live_tensor_peak
from auditor.analysis.run.stages import census_order, finished, is_traced, peak_stage
from auditor.facts import units
from auditor.facts.allocation_sites import DDP_BUCKETS, communication_buffer
from auditor.record.schema import Component, RunRecord, Stage

__all__ = ["SEVERITIES", "Finding", "Rule", "Outcome", "RULES", "REMEDIES", "evaluate", "findings", "ordered",
           "saving", "stage_transient", "RETENTION_SHARE", "TENSOR_GAP_SHARE", "UNTRACKED_SHARE"]

FULL_COPY_RATIO = 0.95        # (a) a copy of at least this share of the weights is a full copy (high),
PARTIAL_COPY_SHARE = 0.20     #     of at least this share a partial one (medium), at any census;
FULL_COPY_MIN_STAGES = 2      #     without provenance: FULL_COPY_RATIO of the weights' bytes at this
                              #     many consecutive stage ends, said to rest on size only
NEVER_COPIES = frozenset({"buffers"})  # a model's own buffers (causal masks): its state, not a copy
MODEL_STATE = frozenset({"weights", "buffers"})  # the model itself: never "retained" (rule (d))
SIZE_ONLY = ("(by size only: no live-tensor meter in this record followed copies, so nothing "
             "says it was copied from the weights)")
DENSE_GRADIENT_RATIO = 0.90   # (b) gradients / gradient records at least this fraction of the weights
TRANSIENT_SHARE = 0.10        # (c) peak inside - max(start, end) above this fraction of the peak
RETAINED_RATIO = 0.10         # (d) tensors beyond the weights at the last stage end, vs the weights
                              #     (vs the peak RSS when the record knows no weights); also (h)
# (e), (f): UNTRACKED_SHARE, TENSOR_GAP_SHARE, RETENTION_SHARE in auditor.analysis.findings.rss_rules

DDP_BUCKETS_REMEDY = ("DDP keeps a bucket copy of every gradient for its all-reduce: "
                      "`DistributedDataParallel(model, gradient_as_bucket_view=True)` makes the gradients "
                      "views into the buckets, so the two are one buffer with the same values (code that "
                      "calls `detach_()` on a gradient cannot use it, torch's documentation says).")

PER_PARAMETER = frozenset({"weights", "gradients", "gradient records"})  # rules (a) and (b) own these
GRADIENT_CATEGORIES = ("gradients", "gradient records")
ACTIVATIONS = "activations and temporaries"
CYCLES = "unreachable.cycles"            # the census's component for tensors only a cycle keeps
CYCLE_CATEGORY = "retained by a reference cycle"
GROWERS_NAMED = 3


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    threshold: str
    needs: tuple[str, ...]   # inputs: "census", "peak census", "live_tensors", "real rss"
    check: Callable[[RunRecord], list[Finding]]
    remedy: str = ""         # the change that removes what the rule finds, in plain words


@dataclass(frozen=True)
class Outcome:
    rule: Rule
    findings: tuple[Finding, ...]
    not_checked: str | None  # why the rule could not be checked (an input absent), else None


def evaluate(record: RunRecord) -> list[Outcome]:
    """Every rule applied to the record: what it found, or why it could not be checked."""
    outcomes = []
    kind = program_kind(record).kind  # the remedies' words, the same for every finding
    for rule in RULES:
        why = missing_input(record, rule)
        found = () if why else tuple(_with_remedy(f, rule, record, kind) for f in rule.check(record))
        outcomes.append(Outcome(rule, found, why))
    return outcomes


def findings(record: RunRecord) -> list[Finding]:
    """Every finding the rules detect in the record, most severe first (rule order within)."""
    return ordered([f for outcome in evaluate(record) for f in outcome.findings])


def ordered(found: list[Finding]) -> list[Finding]:
    return sorted(found, key=lambda f: SEVERITIES.index(f.severity))


def missing_input(record: RunRecord, rule: Rule) -> str | None:
    if "real rss" in rule.needs and is_traced(record):
        return "a traced run on fake tensors: its RSS is the tracing process's, not the workload's"
    if "census" in rule.needs and not census_order(record):
        return "no stage carries a tensor census (run with census on)"
    if "peak census" in rule.needs:
        holder = peak_stage(record)
        if holder is None or holder.components is None:
            return "the stage holding the peak has no census"
    if "live_tensors" in rule.needs and live_tensor_peak(record) is None:
        return "no live-tensor meter in this record"
    return None


# -- (a) copies of the weights ----------------------------------------------------------

def _full_copies(record: RunRecord) -> list[Finding]:
    """Components made by copying the weights, from the live-tensor meter's provenance
    (auditor.capture.census.provenance): one census is enough, and nothing else is a copy however large. A
    record without it (no meter, or an older one) falls back to size, and says so."""
    snapshots = census_order(record)
    if not _follows_copies(record):
        return _copies_by_size(snapshots, lambda name: True)
    # DDP's gradient buckets are copies of the gradients, not of the weights: found by size
    return (_copies_by_provenance(snapshots)
            + _copies_by_size(snapshots, lambda name: communication_buffer(name) == DDP_BUCKETS))


def _follows_copies(record: RunRecord) -> bool:
    meter = (record.probes or {}).get("live_tensors")
    return meter is not None and meter.state == "on" and bool(meter.copies)


def _copies_by_provenance(snapshots: list[Stage]) -> list[Finding]:
    found = []
    for name in _component_names(snapshots):
        hits: list[tuple[Stage, Component, int]] = []
        for stage in snapshots:
            item = (stage.components or {}).get(name)
            weights = weights_bytes(stage)
            if (item and item.category not in PER_PARAMETER and item.weights_copied and weights
                    and _exact(PARTIAL_COPY_SHARE * weights, item.weights_copied)):
                hits.append((stage, item, weights))
        if not hits:
            continue
        stage, top, weights = max(hits, key=lambda h: (h[1].weights_copied or 0) / h[2])
        first, last = hits[0][0], hits[-1][0]
        copied, held = top.weights_copied or 0, top.copy_bytes or 0
        share = copied / weights
        full = _exact(FULL_COPY_RATIO * weights, copied)
        tensors = _parameter_tensors(stage)
        of = (f"{top.parameters_copied} of the {tensors} parameter tensors" if top.parameters_copied and tensors
              else "parameter tensors")
        precision = ("" if abs(held - copied) <= 0.01 * copied else
                     f", {held / copied:.0%} of the bytes they copy: another precision")
        span = (f"from stage `{first.path}` to the end" if last is snapshots[-1]
                else f"at the end of stage `{first.path}` (gone after it)" if first is last
                else f"from stage `{first.path}` {_until(last, snapshots)}")
        found.append(Finding("full-copy", "high" if full else "medium",
                             f"`{name}` ({top.category}) holds a copy of {share:.0%} of the weights "
                             f"({units.size(held)} copied from {of}{precision}) {span}.",
                             {"component": name, "category": top.category, "bytes": held,
                              "weights_copied": copied, "share_of_weights": round(share, 4),
                              "parameters_copied": top.parameters_copied, "parameter_tensors": tensors,
                              "ratio_to_weights": round(top.bytes / weights, 4), "basis": "provenance",
                              "from_stage": first.path, "to_stage": last.path, "stages": len(hits),
                              "to_the_end": last is snapshots[-1]}))
    return found


def _parameter_tensors(stage: Stage) -> int:
    """Parameter storages at the stage end (weights components other than module buffers)."""
    return sum(c.tensors or 0 for n, c in (stage.components or {}).items()
               if c.category == "weights" and not is_buffer(n))


def _copies_by_size(snapshots: list[Stage], wanted: Callable[[str], bool]) -> list[Finding]:
    """Without provenance: a component as large as the weights at consecutive stage ends."""
    found = []
    for name in filter(wanted, _component_names(snapshots)):
        runs: list[list[tuple[Stage, int, float, str]]] = []
        current: list[tuple[Stage, int, float, str]] = []
        for stage in snapshots:
            item = (stage.components or {}).get(name)
            weights = weights_bytes(stage)
            if (item and item.category not in PER_PARAMETER | NEVER_COPIES and weights
                    and _exact(FULL_COPY_RATIO * weights, item.bytes)):
                current.append((stage, item.bytes, item.bytes / weights, item.category))
            elif current:
                runs.append(current)
                current = []
        if current:
            runs.append(current)
        longest = max(runs, key=len, default=[])
        if len(longest) < FULL_COPY_MIN_STAGES:
            continue
        first, last = longest[0][0], longest[-1][0]
        top = max(longest, key=lambda r: r[1])
        held = (f"a full copy of the weights ({units.size(top[1])}, {top[2]:.2f}x)" if top[2] < 1.5
                else f"{top[2]:.2f}x the size of the weights ({units.size(top[1])})")
        if top[3] == ACTIVATIONS:  # not a copy: buffers of inputs or activations as large as the weights
            held = f"as many bytes as the weights or more ({units.size(top[1])}, {top[2]:.2f}x)"
        buckets = communication_buffer(name) == DDP_BUCKETS
        found.append(Finding("full-copy", "high",
                             f"`{name}` ({top[3]}) holds {held} from stage `{first.path}` "
                             f"{_until(last, snapshots)}" + ("." if buckets else f" {SIZE_ONLY}."),
                             {"component": name, "category": top[3], "bytes": top[1],
                              "ratio_to_weights": round(top[2], 4), "from_stage": first.path,
                              "to_stage": last.path, "stages": len(longest),
                              "to_the_end": last is snapshots[-1], "basis": "size"},
                             remedy=DDP_BUCKETS_REMEDY if buckets else ""))
    return found


# -- (b) dense gradients for the whole model ----------------------------------------------

def _dense_gradients(record: RunRecord) -> list[Finding]:
    snapshots = census_order(record)
    found = []
    for name in _component_names(snapshots):
        hits = []
        for stage in snapshots:
            item = (stage.components or {}).get(name)
            weights = weights_bytes(stage)
            if (item and item.category in GRADIENT_CATEGORIES and weights
                    and _exact(DENSE_GRADIENT_RATIO * weights, item.bytes)):
                hits.append((stage, item.bytes, item.bytes / weights, item.category))
        if not hits:
            continue
        top = max(hits, key=lambda h: h[1])
        first, last = hits[0][0], hits[-1][0]
        span = (f"at the end of stage `{first.path}`" if len(hits) == 1
                else f"from stage `{first.path}` {_until(last, snapshots)}")
        found.append(Finding("dense-gradients", "high",
                             f"`{name}` is a dense {top[3]} buffer for the whole model "
                             f"({units.size(top[1])}, {top[2]:.2f}x the weights) {span}.",
                             {"component": name, "category": top[3], "bytes": top[1],
                              "ratio_to_weights": round(top[2], 4), "from_stage": first.path,
                              "to_stage": last.path, "stages": len(hits)}))
    return found


# -- (c) transient spikes ------------------------------------------------------------------

def _transients(record: RunRecord) -> list[Finding]:
    run_peak = record.peak.rss
    if not run_peak:
        return []
    stages = finished(record)
    child_peaks: dict[str, set[int | None]] = {}
    for s in stages:
        if s.parent is not None:
            child_peaks.setdefault(s.parent, set()).add(s.rss.peak)
    memray = record.memray
    found = []
    for stage in stages:
        rss = stage.rss
        assert rss.start is not None and rss.end is not None and rss.peak is not None, "a finished stage's RSS"
        transient = rss.peak - max(rss.start, rss.end)
        band = rss_band(record, TRANSIENT_SHARE * run_peak, f"{TRANSIENT_SHARE:.0%} of the peak")
        side = band.side(transient)
        if side == "below":
            continue
        if rss.peak in child_peaks.get(stage.path, ()):
            continue  # the child holding the same peak reports it, more precisely
        holds_peak = rss.peak == run_peak
        holding = _holds_peak(record, stage, stages)
        statement = (f"Transient spike of {units.size(transient)} in stage `{stage.path}`"
                     f"{_own_time(record, stage)} "
                     f"({transient / run_peak:.0%} of peak): RSS rose to {units.size(rss.peak)} "
                     f"inside it, against {units.size(rss.start)} at its start and "
                     f"{units.size(rss.end)} at its end")
        evidence = {"stage": stage.path, "transient": transient, "rss_peak": rss.peak,
                    "share_of_peak": round(transient / run_peak, 4), "holds_run_peak": holds_peak,
                    "band": band.evidence()}
        statement += _what_grew(record, stage, evidence)
        sites = memray.sites if memray is not None else []
        if sites and memray is not None and memray.stage == stage.path:
            site = sites[0]
            location = source_paths.shown_path(site.location, source_paths.code_root(record))
            where = f"`{location}`" + (f" in `{site.function}`" if site.function else "")
            statement += (f"; memray's largest site alive at its high-water mark is {where} "
                          f"({units.size(site.bytes)})")
            evidence["memray_site"] = site.location
        if side == "inside":  # the band last: what the transient is comes first
            statement += band.borderline("the transient")
        elif holding.side(rss.peak) == "inside":
            statement += holding.borderline("its peak (which stage holds the run's peak)")
            evidence["peak_band"] = holding.evidence()
        else:
            statement += band.beyond()
        severity = (BORDERLINE if "inside" in (side, holding.side(rss.peak))
                    else "high" if holds_peak else "medium")
        found.append(Finding("transient-spike", severity, statement + ".", evidence))
    return found


def _holds_peak(record: RunRecord, stage: Stage, stages: list[Stage]) -> Band:
    """The band that says whether the stage holds the run's peak RSS under noise: its peak is
    compared with the run's (or, holding it, the highest other stage's not nested with it),
    within the RSS band: "inside" when another run could put the peak elsewhere."""
    run_peak = record.peak.rss or 0
    others = [s.rss.peak for s in stages if s.rss.peak is not None and s is not stage
              and not s.path.startswith(stage.path + "/") and not stage.path.startswith(s.path + "/")]
    rival = max(others, default=0) if stage.rss.peak == run_peak else run_peak
    return rss_band(record, rival, "the peak of the stage holding the run's peak"
                    if stage.rss.peak != run_peak else "the highest peak of another stage")


def _own_time(record: RunRecord, stage: Stage) -> str:
    """Where in the stage's own time (no child covering it) its peak was, when the record says."""
    for item in unstaged.intervals(record):
        if item.parent == stage.path and item.rss.peak == stage.rss.peak:
            return f", in its own time {unstaged.describe(item, inside_parent=True)}"
    return ""


def _what_grew(record: RunRecord, stage: Stage, evidence: dict) -> str:
    """The clause naming what grew inside the stage (never the weights unless they grew);
    fills evidence["growers"] {name: bytes}."""
    grown = growers(record, stage)
    if grown is None:
        return ("; the record cannot name what grew (no live-tensor composition at its high and "
                "no census before it)")
    if not grown:
        how = ("nothing created inside it was alive at its live-tensor high" if
               stage.live_tensors is not None and stage.live_tensors.at_peak is not None else
               "no component grew between the census before it and the one at its end: "
               "temporaries made and freed inside it")
        return f"; {how}"
    named = grown[:GROWERS_NAMED]
    evidence["growers"] = {g.name: g.bytes for g in named}
    parts = ", ".join(f"{_quoted(g.name)} {units.size(g.bytes)} ({g.category}"
                      + ("" if g.kept else ", freed before its end") + ")" for g in named)
    more = f" and {len(grown) - len(named)} more" if len(grown) > len(named) else ""
    if named[0].basis == "at_peak":
        return f"; made inside it and alive at its live-tensor high: {parts}{more}"
    return (f"; what it added by its end (census before it to the one at its end; what was "
            f"freed before the end is not in a census): {parts}{more}")


def _quoted(name: str) -> str:
    return name if "`" in name else f"`{name}`"


# -- (d) memory retained after the algorithm returns ---------------------------------------

def _retained(record: RunRecord) -> list[Finding]:
    ends = census_order(record)
    last = ends[-1]
    weights = largest_weights(record)
    peak = record.peak.rss
    base, base_words = (weights, "the weights") if weights else (peak, "the peak RSS")
    if not base:
        return []
    kept = sorted(((n, c) for n, c in (last.components or {}).items()  # a census: never None here
                   if c.category not in MODEL_STATE and n != CYCLES and c.category != CYCLE_CATEGORY),
                  key=lambda kv: -kv[1].bytes)
    total = sum(c.bytes for _, c in kept)
    label = f"{RETAINED_RATIO:.0%} of {base_words}"
    band = tensor_band(RETAINED_RATIO * base, label) if weights else rss_band(record, RETAINED_RATIO * base, label)
    side = band.side(total)
    if side == "below":
        return []
    listed = [(n, c) for n, c in kept if c.bytes >= 0.01 * total]
    left_by = {n: _left_by(record, ends, n) for n, _ in listed}
    parts = ", ".join(f"`{n}` {units.size(c.bytes)} ({c.category}"
                      + (f", left by `{left_by[n]}`" if left_by[n] else "") + ")" for n, c in listed[:6])
    if len(listed) > 6:
        parts += f" and {len(listed) - 6} more"
    start, end = record.process.rss_at_start, record.process.rss_at_end
    rss = (f"; RSS at the end is {units.size(end)} against {units.size(start)} at the start "
           f"({units.signed_size(end - start)})" if start is not None and end is not None else "")
    severity = "high" if weights and total >= weights else "medium"
    if side == "inside":
        severity, rss = BORDERLINE, rss + band.borderline("what stays alive")
    else:
        rss += band.beyond()
    return [Finding("retained-at-end", severity,
                    f"After the last stage (`{last.path}`) {units.size(total)} of tensors beyond "
                    f"the weights stay alive ({total / base:.2f}x {base_words}): {parts}{rss}.",
                    {"stage": last.path, "bytes": total, "band": band.evidence(),
                     "ratio_to_weights": round(total / weights, 4) if weights else None,
                     "components": {n: c.bytes for n, c in listed},
                     "left_by": {n: s for n, s in left_by.items() if s},
                     "rss_at_start": start, "rss_at_end": end})]


def _left_by(record: RunRecord, ends: list[Stage], name: str) -> str | None:
    """The top-level stage at whose end (or inside which) the component first appeared."""
    first = next((s for s in ends if name in (s.components or {})), None)
    if first is None:
        return None
    by_path = {s.path: s for s in record.stages}
    stage = first
    while stage.parent is not None and stage.parent in by_path:
        stage = by_path[stage.parent]
    return stage.path


# -- (h) tensors alive only through a reference cycle ---------------------------------------

def _cycles(record: RunRecord) -> list[Finding]:
    """Tensors the census found reachable only through an unreachable reference cycle: alive
    after the call that made them returned, until the cycle collector next runs."""
    ends = census_order(record)
    seen: list[tuple[Stage, Component]] = [(s, c) for s in ends for n, c in (s.components or {}).items()
                                           if n == CYCLES or c.category == CYCLE_CATEGORY]
    if not seen:  # any size: a leak is a leak, and the census only checks storages of 1 MiB or more
        return []
    stage, top = max(seen, key=lambda sc: sc[1].bytes)
    first, last = seen[0][0], seen[-1][0]
    weights = largest_weights(record)
    how = "returned" if first.call is not None else "ended"
    span = ("seen at that stage end only" if first is last
            else f"seen from that stage end {_until(last, ends)}")
    severity = "high" if weights and _exact(RETAINED_RATIO * weights, top.bytes) else "medium"
    return [Finding("reference-cycle", severity,
                    f"{units.size(top.bytes)} of tensors stay alive after `{first.path}` {how} "
                    f"only through a reference cycle (`{CYCLES}`, {span}): freed only by the cycle collector, "
                    f"whenever it next runs, not when the call returns.",
                    {"component": CYCLES, "stage": stage.path, "bytes": top.bytes,
                     "from_stage": first.path, "to_stage": last.path,
                     "ratio_to_weights": round(top.bytes / weights, 4) if weights else None})]


# -- (g) stages that failed, runs that did not finish --------------------------------------

def _failures(record: RunRecord) -> list[Finding]:
    found = []
    for stage in record.stages:
        if stage.status == "failed":
            found.append(Finding("failed-stage", "high",
                                 f"Stage `{stage.path}` failed ({stage.error or 'no error recorded'}): "
                                 f"its readings end where it failed.",
                                 {"stage": stage.path, "error": stage.error}))
        elif stage.status == "open":
            found.append(Finding("failed-stage", "high",
                                 f"Stage `{stage.path}` never finished: it has a start reading only.",
                                 {"stage": stage.path}))
    exit_ = record.exit
    if exit_ is not None and exit_.status != "ok":
        found.append(Finding("failed-stage", "high",
                             f"The run ended {exit_.status}"
                             + (f" ({exit_.error})" if exit_.error else "")
                             + ": later stages and the final readings may be missing.",
                             {"exit": exit_.status, "error": exit_.error}))
    return found


def _exact(threshold: float, value: int) -> bool:
    """A tensor-bytes rule's ">=": exact bytes, the same in identical runs, so no noise band."""
    return tensor_band(threshold, "").side(value) == "above"


def _component_names(snapshots: list[Stage]) -> list[str]:
    names: dict[str, None] = {}
    for stage in snapshots:
        names.update(dict.fromkeys(stage.components or {}))
    return list(names)


def _until(last: Stage, snapshots: list[Stage]) -> str:
    return "to the end" if last is snapshots[-1] else f"to stage `{last.path}` (gone after it)"


# -- remedies and what they save ---------------------------------------------------------

REMEDIES = GENERIC  # each rule's remedy where the record cannot tell the program's kind


def _with_remedy(finding: Finding, rule: Rule, record: RunRecord, kind: Kind) -> Finding:
    text = finding.remedy or _remedy_words(finding, kind, record) or rule.remedy
    return Finding(finding.rule, finding.severity, finding.statement, finding.evidence, text,
                   saving(finding, record), _validated(finding, record))


def _remedy_words(finding: Finding, kind: Kind, record: RunRecord) -> str | None:
    """A rule's remedy worded for the program's kind and its evidence (`auditor.analysis.findings.remedies`)."""
    category = finding.evidence.get("category")
    if finding.rule == "retained-at-end":  # the category of the most it retains
        held = finding.evidence.get("components") or {}
        stage = next((s for s in census_order(record) if s.path == finding.evidence.get("stage")), None)
        if held and stage is not None and stage.components:
            largest = max(held, key=lambda n: (stage.components[n].bytes if n in stage.components else 0))
            category = stage.components[largest].category if largest in stage.components else None
    if finding.rule == "transient-spike":
        grown = finding.evidence.get("growers") or {}
        category = TEMPORARIES if grown and next(iter(grown)).startswith("temporaries from") else None
    return remedy(finding.rule, kind, category)


def saving(finding: Finding, record: RunRecord) -> dict | None:
    """What the remedy would save: the evidence's bytes here and at each projection target.

    {bytes, projected: [{target, method, bytes | None, why?, withheld?}], basis}; None for rules
    whose remedy saves nothing in the algorithm's tensors (RSS beyond the census, the live-tensor
    gap, failures). `withheld`: a scaled projection the traced one does not bear out
    (ProjectionView.withheld): its figure is for the details, not the fixes table."""
    evidence = finding.evidence
    if finding.rule in ("full-copy", "dense-gradients", "reference-cycle"):
        names, stage, here = [evidence["component"]], evidence.get("to_stage") or evidence.get("stage"), evidence["bytes"]
        if finding.rule == "reference-cycle":
            stage = evidence["stage"]
    elif finding.rule == "retained-at-end":
        names, stage, here = list(evidence["components"]), evidence["stage"], evidence["bytes"]
    elif finding.rule == "transient-spike":
        names, stage, here = None, evidence["stage"], evidence["transient"]
    else:
        return None
    if stage is None:
        return None
    projected = []
    for view in projection_views(record):
        at, why = view.stages.get(stage), None
        if view.failed is not None:  # a traced run that stopped part-way: no figure at the target
            value, why = None, f"the traced run {view.failed.plain}"
        elif at is None:
            value, why = None, f"the projection has no stage `{stage}`"
        elif names is None:  # a projection below what was measured here did not model this
            value = stage_transient(at)
            if value is None:
                why = "the projection does not model this stage's transient"
            elif value < here:
                value, why = None, ("at the target the projection's transient for this stage is smaller than "
                                    "what rose here: what rose here is not modeled there, so no saving is claimed")
        else:
            found = [at.components.get(n) for n in names]
            value = None if any(v is None for v in found) else sum(v for v in found if v is not None)
            if value is None:
                why = "the projection does not model " + ("these components" if len(names) > 1 else "this component")
        held = {"withheld": view.withheld} if view.withheld and value is not None else {}  # the details keep it
        projected.append({"target": view.target, "method": method_words(view), "bytes": value,
                          **({"why": why} if why else {}), **held})
    basis = ("the transient inside the stage" if names is None else
             f"the evidence's components at stage `{stage}`")
    return {"bytes": here, "projected": projected, "basis": basis}


def stage_transient(at: ProjectedStage) -> int | None:
    """A projected stage's transient: its own figure, else (a traced run measures no transient
    apart) its live-tensor peak above its census and unseen tensors at the end."""
    if at.transient is not None or "transient" in at.unexplained or "peak" in at.unexplained:
        return at.transient  # a figure its drivers do not explain stays None
    if at.tensor_peak is None or not at.components or any(v is None for v in at.components.values()):
        return None
    end = sum(v for v in at.components.values() if v is not None) + (at.unseen or 0)
    return at.tensor_peak - end if at.tensor_peak >= end else None


def _validated(finding: Finding, record: RunRecord) -> tuple:
    """The record's validated remedies that answer this finding: one of their components is
    in its evidence (and its rule among theirs, when they name rules), or, naming no
    components, its rule is among theirs."""
    named = set()
    for key in ("component", "components", "growers"):
        value = finding.evidence.get(key)
        named |= {value} if isinstance(value, str) else set(value or ())
    found = []
    for item in record.annotations.get("validated_remedies") or []:
        if not isinstance(item, dict) or not item.get("variant"):
            continue
        components, rules = set(item.get("components") or ()), set(item.get("rules") or ())
        answers = (named & components if components else bool(rules)) and (not rules or finding.rule in rules)
        if answers:
            found.append(item)
    return tuple(found)


_EXACT = " (tensor bytes: exact, no noise band)"
_RSS_NOISE = (f"; within ± the larger of {RSS_BAND:.0%} of the peak (measured over identical runs) and "
              "what glibc may keep between runs: borderline")

RULES: tuple[Rule, ...] = (
    Rule("full-copy", "A component holds a copy of the weights",
         f"made by copying the weights (the live-tensor meter's provenance) and holding >= "
         f"{FULL_COPY_RATIO:.0%} of their bytes (high) or >= {PARTIAL_COPY_SHARE:.0%} (medium) at a "
         f"stage end; without the meter, by size only: bytes >= {FULL_COPY_RATIO:.0%} of the weights at "
         f">= {FULL_COPY_MIN_STAGES} consecutive stage ends (categories other than weights, gradients, "
         "gradient records)" + _EXACT,
         ("census",), _full_copies, REMEDIES["full-copy"]),
    Rule("dense-gradients", "Dense gradients or gradient records for the whole model",
         f"a gradients / gradient records component >= {DENSE_GRADIENT_RATIO:.0%} of the weights "
         "at a stage end" + _EXACT, ("census",), _dense_gradients, REMEDIES["dense-gradients"]),
    Rule("transient-spike", "Transient spike inside a stage",
         f"peak inside - max(start, end) > {TRANSIENT_SHARE:.0%} of the run's peak RSS "
         "(reported at the deepest stage holding it; high when it holds the run's peak)" + _RSS_NOISE, ("real rss",), _transients,
         REMEDIES["transient-spike"]),
    Rule("retained-at-end", "Memory retained after the algorithm returns",
         f"tensors other than weights at the last stage end >= {RETAINED_RATIO:.0%} of the weights "
         "(the most any census saw, exact; of the peak RSS when no census saw weights" + _RSS_NOISE + ")",
         ("census",), _retained, REMEDIES["retained-at-end"]),
    Rule("reference-cycle", "Tensors kept alive only by a reference cycle",
         f"`{CYCLES}` present at a stage end (the census checks unowned storages of 1 MiB or more)",
         ("census",), _cycles, REMEDIES["reference-cycle"]),
    Rule("untracked-rss", "RSS beyond the census",
         f"RSS at the end of the peak stage minus its census > {UNTRACKED_SHARE:.0%} of the peak" + _RSS_NOISE,
         ("census", "peak census", "real rss"), untracked, REMEDIES["untracked-rss"]),
    Rule("rss-above-live-tensors", "Peak RSS above the live-tensor peak",
         f"peak RSS - live-tensor peak > {TENSOR_GAP_SHARE:.0%} of the peak" + _RSS_NOISE,
         ("live_tensors", "real rss"), tensor_gap, REMEDIES["rss-above-live-tensors"]),
    Rule("child-memory", "Child processes held memory of their own",
         f"the children's own memory (USS; RSS where USS is not readable) at a top-level stage end or the run's "
         f"end >= {CHILD_SHARE:.0%} of this process's peak RSS (high: >= {CHILD_HIGH:.0%})",
         ("real rss",), child_memory, REMEDIES["child-memory"]),
    Rule("failed-stage", "Failed or unfinished stages", "any stage failed or open, or the run "
         "did not end ok", (), _failures, REMEDIES["failed-stage"]),
)
