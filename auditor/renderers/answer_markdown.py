"""The run report's opening sections and the findings behind them: what was alive at the peak
(here, x the weights, at each target), the fixes (with the variants that validated them, each
described once), and, folded, each finding in full with the rules checked. Formats
auditor.report_models.answer's `Answer` and `Fixes` and the run report's `findings` only.
"""
from __future__ import annotations

import re

from auditor.analysis.projection.side_by_side import TargetSides
from auditor.analysis.run.unstaged import PeakPlace
from auditor.facts import units
from auditor.renderers import markdown_text as md
from auditor.renderers.components_markdown import unstaged_peak
from auditor.renderers.markdown_text import INDENT
from auditor.renderers.projection_markdown import heading as projection_heading
from auditor.renderers.projection_markdown import unexplained
from auditor.report_models.answer import Answer, AtTarget, Fixes, Variant
from auditor.report_models.run import Components, Findings

FINDINGS = "Findings"  # the folded section's heading, linked from the fixes and the summary


def answer_section(answer: Answer | None, place: PeakPlace, components: Components,
                   targets: list[TargetSides]) -> str:
    head = "## What was alive at the peak"
    no_census = ("\n\nNo tensor census in this record (run with census on to see which structure holds "
                 "the memory)." if not components.has_census else "")
    if components.unstaged_peak is not None:  # the peak fell between stages: what was alive there
        return f"{head}\n\n{unstaged_peak(components.unstaged_peak)}{no_census}"
    if answer is None:
        return f"{head}" + (no_census or "\n\nThe stage holding the peak has no census.") + _live_only(components)
    notes = md.Notes()
    columns = [f"at {md.text(_target(v.target, v.target_dtype))} ({md.text(how)})"
               + (notes.mark(v.stand_in) if v.stand_in and v.failed is None else "")
               for v, how in zip(answer.views, answer.hows, strict=True)]
    rows = []
    for row in answer.rows:
        ratio = units.ratio(row.bytes, answer.weights)
        cells = [_cell(c, notes, row.kind == "peak") for c in row.at_targets]
        if row.kind == "category":
            rows.append([f"**{md.text(row.name)}**", f"**{units.size(row.bytes)}**", ratio, *cells])
        elif row.kind == "component":
            rows.append([INDENT + md.code(row.name), units.size(row.bytes), ratio, *cells])
        elif row.kind == "of which":
            rows.append([INDENT + "of which " + md.text(row.name), units.size(row.bytes), ratio, *cells])
        elif row.kind == "peak":
            rows.append(["**peak RSS**", f"**{units.size(row.bytes)}**", f"**{ratio}**",
                         *(c if a.failed or a.withheld else f"**{c}**"
                           for a, c in zip(row.at_targets, cells, strict=False))])
        else:
            rows.append([md.text(row.name), units.size(row.bytes), ratio, *cells])
    table = md.table(["category / component", "bytes here", "x the weights", *columns], rows,
                     right=range(1, 3 + len(columns)))
    buffers = (f" (module buffers, {units.size(answer.buffers)}, are under weights but not in the ratio)"
               if answer.buffers else "")
    lead = (f"The census at the end of {md.code(answer.stage)}, the stage holding the peak, with what rose "
            f"inside the stage on top, so the rows add up to its peak; the weights are "
            f"{units.size(answer.weights)} of parameters{buffers}.")
    if targets:
        lead += " At each target the same stage is projected; the title gives the target's own peak, wherever it falls."
    return f"{head}\n\n{lead}\n\n{table}" + notes.text() + _withheld(answer) + _caveats(targets, components)


def _withheld(answer: Answer) -> str:
    """Each scaled column not shown: why, and where its figures are."""
    lines = [md.wrapped(f"At {md.text(_target(v.target, v.target_dtype))} ({md.text(how)}): "
                        f"{md.text(v.withheld)}; its figures are in the details "
                        f"([how]({md.anchor(projection_heading(v.target))})).")
             for v, how in zip(answer.views, answer.hows, strict=True) if v.withheld and v.failed is None]
    return "".join(f"\n\n{line}" for line in lines)


def _live_only(components: Components) -> str:
    """Without a census: the live tensors at the peak stage's high, by category, where metered."""
    high = next((h for h in components.live_highs if h.is_peak_stage), None)
    if high is None:
        return ""
    total = high.alive.at_peak.bytes
    rows = [[md.text(c), units.size(b), units.share(b, total)] for c, b in high.alive.categories]
    rows.append(["**live tensors at the high**", f"**{units.size(total)}**", ""])
    return (f"\n\nThe live tensors at the highest moment of {md.code(high.stage.path)}, the stage holding the peak, "
            "by category (each storage in the details):\n\n"
            + md.table(["category", "bytes", "share"], rows, right={1, 2}))


def _caveats(targets: list[TargetSides], components: Components) -> str:
    """What the figures rest on, a sentence each, linking to the detail."""
    lines = []
    if any(c.moment == "just before the peak stage" for c in components.censuses):
        lines.append("The peak came near the stage's start: the census just before it, in the details, "
                     "shows what made it.")
    for target in targets:
        link = md.anchor(projection_heading(target.target))
        for side in target.sides:
            for note in side.notes:
                plain = re.sub(r" \([^()]*\)", "", note)
                lines.append(md.wrapped(f"At {md.text(target.target)} ({md.text(side.how)}): {md.text(plain)} "
                                        f"([how]({link}))."))
    return "".join(f"\n\n{line}" for line in lines)


def _target(target: str, dtype: str | None) -> str:
    return f"{target} {dtype}" if dtype else target


def _cell(at: AtTarget, notes: md.Notes, peak: bool = False) -> str:
    """A figure at a target; a traced run that stopped part-way says where in its peak row, no
    figure in any (what it finished is in the projection's details)."""
    if at.failed is not None:
        return md.phrase(at.failed) if peak else "-"
    if at.withheld is not None:  # a scaled figure the traced projection does not bear out
        return md.text(at.withheld) if peak else "-"
    if at.miss is not None:
        return unexplained(at.miss)
    if at.bytes is None and at.why:
        return "not projected" + notes.mark(at.why)
    text = units.size(at.bytes)
    return (text + (f" (est. {units.size(at.estimated)})" if at.estimated else "")
            + (notes.mark(at.why) if at.why else ""))


def fixes_section(fixes: Fixes) -> str:
    head = "## Fixes"
    more = f"[{FINDINGS}]({md.anchor(FINDINGS)})"
    if not fixes.rows:
        return f"{head}\n\nNo rule fired on this record; the rules checked are in the details ({more})."
    lead = ("One row a finding, most severe first; each saving is an upper bound, the bytes of the finding's "
            f"evidence (what the algorithm still needs of them comes back). Each finding in full: {more}.")
    if fixes.kind is not None and fixes.kind.kind == "unknown":
        lead += f" Remedies are generic: the program's kind is unknown ({md.phrase(fixes.kind.evidence)})."
    elif fixes.kind is not None:
        lead += f" Remedies are for {fixes.kind.words}: {md.phrase(fixes.kind.evidence)}."
    headers = ["finding", "remedy", "saves here", *(f"at {md.text(t)}" for t in fixes.targets), "validated by"]
    rows = []
    notes = md.Notes()
    for fix in fixes.rows:
        f = fix.finding
        what = f"**{f.severity}** {md.text(f.rule)}" + (f": {md.phrase(fix.subject)}" if fix.subject else "")
        targets = ["-" if fix.saving is None else "not shown" + notes.mark(c.withheld) if c.withheld
                   else units.size(c.bytes) if c.bytes is not None
                   else "not projected" + (notes.mark(c.why) if c.why else "") for c in fix.at_targets]
        rows.append([what, md.phrase(fix.remedy) or "-", units.size(fix.saving), *targets,
                     ", ".join(md.code(v) for v in fix.variants) or "-"])
    table = md.table(headers, rows, right=range(2, 3 + len(fixes.targets)))
    return f"{head}\n\n{lead}\n\n{table}" + notes.text() + _variants(fixes.variants)


def _variants(variants: list[Variant]) -> str:
    """Each variant named in the table, described once."""
    if not variants:
        return ""
    shared = {v.measured_by for v in variants}
    lines = []
    for v in variants:
        if v.peak_saving is None:
            saved = "no measured saving"
        elif v.claims_saving:
            saved = f"{units.size(v.peak_saving)} less peak RSS"
        else:
            saved = f"no saving beyond the noise ({units.signed_size(-v.peak_saving)} peak RSS)"
        agreement = f", result {md.text(v.agreement)}" if v.agreement else ""
        own = f" ({md.phrase(v.measured_by)})" if len(shared) > 1 else ""
        what = f"{md.phrase(v.what)}; " if v.what else ""
        lines.append(f"- {md.code(v.name)}: {what}{saved}{agreement}{own}.")
    how = f", each measured as {md.phrase(next(iter(shared)))}" if len(shared) == 1 else ""
    return f"\n\nVariants that implement a remedy{how}:\n\n" + "\n".join(lines)


def findings_detail(findings: Findings) -> str:
    """Each finding in full (statement, evidence, remedy, saving at each target) and every rule."""
    found, outcomes = findings.found, findings.outcomes
    if found:
        lines = []
        for f in found:
            site = f.evidence.get("memray_site")
            shown = {**f.evidence, "memray_site": findings.shown_sites[site]} if site else f.evidence
            evidence = ", ".join(f"{k.replace('_', ' ')} {md.code(v)}" for k, v in shown.items()
                                 if k in ("stage", "component", "from_stage", "to_stage", "memray_site") and v)
            lines.append(md.wrapped(f"- **{f.severity}** ({f.rule}): {f.statement}"))
            if evidence:
                lines.append(md.wrapped(f"  - Evidence: {evidence}.", indent="    "))
            if f.remedy:
                lines.append(md.wrapped(f"  - Remedy: {f.remedy}{_saving(f.saving)}", indent="    "))
        body = "\n".join(lines)
    else:
        body = "No rule fired on this record."
    rows = []
    for o in outcomes:
        result = (f"not checked: {md.text(o.not_checked)}" if o.not_checked
                  else f"fired ({len(o.findings)})" if o.findings else "silent")
        rows.append([md.code(o.rule.id), md.text(o.rule.title), md.text(o.rule.threshold), result])
    rules = md.table(["rule", "looks for", "threshold", "result"], rows)
    return (f"## {FINDINGS}\n\nDetected from the record by the rules below, not written by hand."
            f"\n\n{body}\n\nRules checked:\n\n{rules}")


def _saving(saving: dict | None) -> str:
    if not saving:
        return ""
    text = f" Saves up to {units.size(saving['bytes'])} here"
    projected = list(saving.get("projected") or [])
    if not projected:
        return text + " (no projection in this record)."
    parts = [f"{units.size(p['bytes'])} at {p['target']} ({p.get('method', 'projected')}"
             + (f"; {p['withheld']}" if p.get("withheld") else "") + ")"
             if p["bytes"] is not None else f"not projected at {p['target']} ({p.get('method', 'projected')})"
             + (f": {p['why']}" if p.get("why") else "")
             for p in projected]
    return text + "; " + "; ".join(parts) + "."
