"""The run report's opening: what was alive at the peak, here and at each target, and the fixes.

    answer = peak_answer(census, weights)      # one table: by category, its components under it
    fixes = fix_table(found)                   # one row a finding, each validating variant once

A reader's first questions are "where did my memory go, what would it need at the target,
what do I change". The answer is the census at the end of the stage holding the peak, with
what rose inside the stage on top of it, so its rows add up to the peak; each projection of
the record is a column of the same rows. The fixes are the findings, each with the first
words of its remedy, its saving here and at each target, and the measured variants that
implement it (named in the row, described once below the table).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from auditor.analysis.findings.program_kind import ProgramKind
from auditor.analysis.findings.rules import Finding, stage_transient
from auditor.analysis.projection.reasons import TRANSIENT, Why, shrinking
from auditor.analysis.projection.views import ProjectedStage, ProjectionView, method_words
from auditor.analysis.run.attribution import BEYOND_CENSUS, BEYOND_LIVE, UNSEEN_TENSORS, Attribution
from auditor.record.schema import RunRecord

REMEDY_WORDS = 160  # a remedy's headline in the fixes table; the whole remedy is in the details


@dataclass
class AtTarget:
    """A figure at one projection's target."""
    bytes: int | None = None    # None: not projected
    miss: int | None = None     # its drivers do not explain it: this miss, never a number
    estimated: int = 0          # of `bytes`, resting on estimated data-dependent sizes
    why: str | None = None      # why the figure does not grow with the model, or is not projected
    failed: str | None = None   # its traced run stopped part-way ("failed at stage `X`: ..."): no figure
    withheld: str | None = None  # a scaled figure not shown ("not shown: differs from the traced ..."),
    # `bytes` kept for the details (ProjectionView.withheld)


@dataclass
class AnswerRow:
    kind: Literal["category", "component", "beyond", "of which", "transient", "peak"]
    name: str                   # a category, a component, or what the row is in words
    bytes: int | None
    at_targets: list[AtTarget]  # one per `Answer.views`


@dataclass
class Answer:
    """What was alive at the peak: the peak stage's census and what rose inside the stage."""
    stage: str                  # the stage whose census it is
    weights: int                # parameters (module buffers not counted), for "x the weights"
    buffers: int
    views: list[ProjectionView]  # the columns at the targets
    hows: list[str]             # how each was projected, in words (method_words), one per view
    rows: list[AnswerRow]


@dataclass
class Variant:
    """A measured variant that implements a remedy, as the record's `validated_remedies` says."""
    name: str
    what: str
    peak_saving: int | None     # whole-run peak RSS against the baseline
    claims_saving: bool         # the saving is beyond the noise
    agreement: str | None       # its result against the baseline's
    measured_by: str            # where and how it was measured, in words


@dataclass
class Fix:
    finding: Finding
    subject: str                # what it is about, `code` spans marked with backticks
    remedy: str                 # the remedy's first words
    saving: int | None          # upper bound here
    at_targets: list[AtTarget]  # one per `Fixes.targets`
    variants: list[str]         # names of `Fixes.variants` that implement the remedy


@dataclass
class Fixes:
    targets: list[str] = field(default_factory=list)   # "mistral-7b (scaled)"
    rows: list[Fix] = field(default_factory=list)
    variants: list[Variant] = field(default_factory=list)
    kind: ProgramKind | None = None   # the kind of program the remedies are worded for, and why


def peak_answer(census: Attribution, projected: list[tuple[ProjectionView, ProjectedStage | None]],
                record: RunRecord | None = None) -> Answer:
    """The answer table's rows: each category with its components under it, then what the census
    does not hold, what rose inside the stage, and the peak. With the record, a figure that does
    not grow with the model says why (`auditor.analysis.projection.reasons`)."""
    stages = [p for _, p in projected]
    whys = shrinking(record, census.stage) if record is not None else {}
    reasons: list[dict[str, Why]] = [whys.get((v.target, v.method), {}) for v, _ in projected]

    def each(get, parts=lambda p: ()) -> list[AtTarget]:
        cells = []
        for p in stages:
            if p is None:
                cells.append(AtTarget())
                continue
            missed = [p.unexplained[k] or 0 for k in parts(p) if k in p.unexplained]
            cells.append(AtTarget(miss=max(missed)) if missed else AtTarget(get(p)))
        return cells

    def component(p: ProjectedStage | None, name: str) -> AtTarget:
        if p is None:
            return AtTarget()
        if name in p.unexplained:
            return AtTarget(miss=p.unexplained[name])
        return AtTarget(p.components.get(name), estimated=p.estimated.get(name) or 0)

    def noted(cells: list[AtTarget], key: str, here: int | None) -> list[AtTarget]:
        """Each cell with its reason where its figure falls below `here` (a component's reason
        holds for every projection of it: a traced run measures the same architecture)."""
        anywhere = next((r[key] for r in reasons if key in r), None)
        for cell, own in zip(cells, reasons, strict=False):
            why = own.get(key) or (anywhere if key != TRANSIENT else None)
            if why is None or cell.miss is not None or cell.bytes is None or here is None or cell.bytes >= here:
                continue
            cell.why = why.text
            if not why.projected:
                cell.bytes = None
        return cells

    rows: list[AnswerRow] = []
    for category, total in census.categories:
        names = [r.name for r in census.rows if r.category == category]
        rows.append(AnswerRow("category", category, total,
                              each(lambda p, ns=names: _sum(p.components.get(n) for n in ns), lambda p, ns=names: ns)))
        rows += [AnswerRow("component", r.name, r.bytes, noted([component(p, r.name) for p in stages], r.name, r.bytes))
                 for r in census.rows if r.category == category]
    rows.append(AnswerRow("beyond", BEYOND_CENSUS, census.beyond_census,
                          each(lambda p: None if p.unseen is None and p.beyond_tensors is None
                               else (p.unseen or 0) + (p.beyond_tensors or 0), lambda p: ["unseen"])))
    if census.unseen:  # the census missed live tensors: say how much of the rest they are
        rows.append(AnswerRow("of which", UNSEEN_TENSORS, census.unseen,
                              each(lambda p: p.unseen, lambda p: ["unseen"])))
        rows.append(AnswerRow("of which", BEYOND_LIVE, census.beyond_live, each(lambda p: p.beyond_tensors)))
    if census.rss_peak is not None and census.rss_end is not None:
        risen = census.rss_peak - census.rss_end
        rows.append(AnswerRow("transient", "risen inside the stage and freed by its end", risen,
                              noted(each(stage_transient, lambda p: ["transient"]), TRANSIENT, risen)))
    rows.append(AnswerRow("peak", "peak RSS", census.rss_peak if census.rss_peak is not None else census.rss_end,
                          each(lambda p: p.rss_peak, lambda p: ["peak"])))
    for i, (view, _) in enumerate(projected):  # a traced run that stopped part-way fills no cell,
        if view.failed is not None:             # nor does a scaled one the traced one does not bear out
            for row in rows:
                row.at_targets[i] = AtTarget(failed=view.failed.phrase)
        elif view.withheld is not None:
            for row in rows:
                row.at_targets[i] = AtTarget(withheld=view.withheld)
    return Answer(census.stage, census.weights, census.buffers, [v for v, _ in projected],
                  [method_words(v) for v, _ in projected], rows)


def _sum(values) -> int | None:
    found = list(values)
    return None if any(v is None for v in found) else sum(found)


def fix_table(found: list[Finding], kind: ProgramKind | None = None) -> Fixes:
    """One row a finding (most severe first); the variants that validate any, each once; `kind`:
    what the remedies were worded for."""
    fixes = Fixes(kind=kind)
    variants: dict[str, Variant] = {}
    for finding in found:
        saving = finding.saving or {}
        for item in saving.get("projected") or []:
            label = f"{item['target']} ({item.get('method', 'projected')})"
            if label not in fixes.targets:
                fixes.targets.append(label)
    for finding in found:
        saving = finding.saving or {}
        by_label = {f"{p['target']} ({p.get('method', 'projected')})":
                    AtTarget(p.get("bytes"), why=p.get("why"), withheld=p.get("withheld"))
                    for p in saving.get("projected") or []}
        names = []
        for item in finding.validated:
            name = str(item["variant"])
            variants.setdefault(name, _variant(item))
            names.append(name)
        fixes.rows.append(Fix(finding, subject(finding), remedy_headline(finding.remedy),
                              saving.get("bytes"), [by_label.get(t) or AtTarget() for t in fixes.targets], names))
    fixes.variants = list(variants.values())
    return fixes


def subject(finding: Finding) -> str:
    """What a finding is about, in a few words with `code` spans."""
    evidence = finding.evidence
    if evidence.get("component") in (BEYOND_CENSUS, BEYOND_LIVE):  # not a component: said in words
        return str(evidence["component"])
    if evidence.get("component"):
        category = f" ({evidence['category']})" if evidence.get("category") else ""
        return f"`{evidence['component']}`{category}"
    if finding.rule == "retained-at-end" and evidence.get("stage"):
        return f"after `{evidence['stage']}`"
    if evidence.get("stage"):
        return f"in `{evidence['stage']}`"
    return ""


def remedy_headline(remedy: str) -> str:
    """A remedy's first words: up to its first colon or full stop, asides dropped when long."""
    if not remedy:
        return ""
    head = re.split(r"(?<=[a-z)`]): |\. ", remedy, maxsplit=1)[0].rstrip(".")
    if len(head) > REMEDY_WORDS:
        head = re.sub(r" \([^()]*\)", "", head)
    if len(head) > REMEDY_WORDS:
        head = head[:REMEDY_WORDS].rsplit(" ", 1)[0] + " ..."
    return head


def _variant(item: dict) -> Variant:
    where = [str(item["architecture"])] if item.get("architecture") else []
    if item.get("runs"):
        where.append(f"{item['runs']} runs a side")
    measured = "whole-run peak RSS against the baseline" + (f", {', '.join(where)}" if where else "")
    if item.get("source"):
        measured += f", by `{item['source']}`"
    return Variant(str(item["variant"]), str(item.get("what") or ""), item.get("peak_saving"),
                   bool(item.get("claims_saving")), item.get("agreement"), measured)
