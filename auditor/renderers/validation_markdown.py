"""The projection-validation report (markdown) and its tables: the targets met or missed, the
peaks, every stage and every component of the peak stage, real against scaled and traced, and
what the scaled projection's fit found. It formats auditor.report_models.validation's model,
made from a validation result alone (`auditor.jobs.projection_validation.validate`).
`tables(report)` gives the same tables as rows, for the terminal.
"""
from __future__ import annotations

import shlex

from auditor.facts import units
from auditor.renderers import markdown_text as md
from auditor.report_models.validation import (
    Figure,
    Fit,
    GradProbeRun,
    ProgramRun,
    Projected,
    Target,
    ValidationReport,
)

Table = tuple[list[str], list[list[str]]]


def _met(target: Target) -> str:
    if target.met is None:  # the projection printed no number to hold to the target
        return "n/a (see above)"
    return "yes" if target.met else "NO"


def _error(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2%}"


def _beside(figure: Figure, methods: tuple[str, ...]) -> list[str]:
    """Each projection's figure and its error against the real one; where the projection
    prints no figure, why not, and no error."""
    return sum(([_projected(figure.projected[m]), _error(figure.projected[m].error)] for m in methods), [])


def _projected(p: Projected) -> str:
    if p.withheld:
        return f"not shown: {p.withheld}" + (f" (miss {units.size(p.miss)})" if p.miss is not None else "")
    return units.size(p.bytes)


def tables(report: ValidationReport) -> dict[str, Table]:
    """name -> (headers, rows) for the targets, peaks, stages and components."""
    methods = report.methods
    targets = (["target", "method", "limit", "error", "met"],
               [[t.what, t.method, f"±{t.limit:.0%}", _error(t.error), _met(t)] for t in report.targets])
    pairs = sum(([m, "error"] for m in methods), [])
    peaks = (["peak", "real", *pairs],
             [[p.what, units.size(p.figure.real), *_beside(p.figure, methods)] for p in report.peaks])
    stages = (["stage", "real tensors", *pairs, "real RSS", *pairs],
              [[s.path, units.size(s.tensors.real), *_beside(s.tensors, methods),
                units.size(s.rss.real), *_beside(s.rss, methods)] for s in report.stages])
    components = (["component", "category", "real", *pairs],
                  [[c.name, c.category, units.size(c.figure.real), *_beside(c.figure, methods)]
                   for c in report.components])
    return {"targets": targets, "peaks": peaks, "stages": stages, "components": components}


def render(report: ValidationReport, command: list[str] | str | None = None) -> str:
    """`command`: the command that made it, as its words or as one line (a benchmark's record)."""
    small, target = report.small, report.target
    made = tables(report)
    out = [f"# Projection validation: {small.label} -> {target.label}", ""]
    out += [f"Audited for real at **{small.label}** ({small.parameters:,} parameters), "
            f"projected to **{target.label}** ({target.parameters:,} parameters, a "
            f"**{report.scale_up:.1f}x** scale-up in parameters), which then ran for real, "
            f"held out. {_what_ran(report)}", ""]
    if isinstance(report.ran, ProgramRun) and report.ran.held_out:
        out += [report.ran.held_out, ""]
    if not report.in_range:
        low, high = report.scale_up_range
        out += [f"Note: the targets are stated for a {low:g}x to {high:g}x scale-up; this one is "
                f"{report.scale_up:.1f}x.", ""]
    if report.missed:
        out += ["**Missed:** " + "; ".join(f"{t.what} ({t.method}) {t.error:+.2%} against ±{t.limit:.0%}"
                                           if t.error is not None else f"{t.what} ({t.method}): no reading"
                                           for t in report.missed) + ".", ""]
    else:
        out += ["**All targets met.**" if not report.not_checked else "**Every target with a number to check met.**",
                ""]
    if report.not_checked:  # nor do the tables below show such a projection's peaks
        out += ["Not checked: " + "; ".join(f"{', '.join(f'{t.what} ({t.method})' for t in unchecked)}: {why}"
                                            for why, unchecked in report.not_checked.items()) + ".", ""]
    if command:
        out += ["```", command if isinstance(command, str) else shlex.join(command), "```", ""]
    out += ["## Targets", "", _table(*made["targets"]), ""] + _resting_on_estimates(report.targets)
    out += ["## Peaks", "", "Live tensors: the highest live-tensor meter reading of any stage. RSS: the "
            "run's highest RSS.", "", _table(*made["peaks"]), ""]
    out += ["## Stages", "", "Peak inside each stage, real against projected.", "", _table(*made["stages"]), ""]
    out += [f"## Components at the end of `{report.components_stage}` ({md.text(report.components_why)})", "",
            _table(*made["components"]), ""]
    out += _data_dependent(report)
    if report.fit is not None:
        out += ["## What the scaled projection fitted", ""] + _fit(report.fit) + [""]
    out += ["## Runs", "", f"- small (real): `{small.run}`", f"- held-out target (real): `{target.run}`",
            f"- every run of this validation: `{report.folder}`",
            f"- memory available when checked: {units.size(report.available)} "
            f"(margin {units.size(report.margin)})"]
    return "\n".join(out).rstrip() + "\n"


def _resting_on_estimates(targets: list[Target]) -> list[str]:
    """The stages the every-stage target leaves out, and the worst of them, said under the table."""
    lines = []
    for t in targets:
        worst = t.resting_on_estimates
        if worst is not None:
            judged = t.stages
            assert judged is not None  # the every-stage target counts the stages it judges
            lines += [f"{t.what.capitalize()} ({t.method}) is judged on the {judged:,} "
                      f"stage{'' if judged == 1 else 's'} whose sizes are exact. "
                      f"{worst.stages:,} more rest partly on estimated "
                      "value-dependent sizes, not held to it: the run's total of such a structure is "
                      "estimated, but its split across the target's tensors depends on values. The worst "
                      f"is {worst.error:+.2%}, {md.code(worst.path)} "
                      f"({worst.estimated_share:.0%} of its projected bytes estimated).", ""]
    return lines


def _data_dependent(report: ValidationReport) -> list[str]:
    """The traced projection's data-dependent sites: each ratio and where it came from, and how
    much of the projected peak rests on them (auditor.analysis.projection.estimated_bytes)."""
    found = report.data_dependent
    if found is None:
        return []
    rows = [[f"`{s.site}`", s.op, s.source or "-", f"{s.ratio:.5f}" if s.ratio is not None else "-",
             f"{s.calls:,}", f"{s.output_numel:,}", f"{s.conflicts:,}"] for s in found.sites]
    return ["## Data-dependent sizes in the traced projection", "",
            md.text(found.note or "") + ".", "",
            "Each site's ratio: elements out per element in, observed at the same site in the small "
            "real run (or declared by the program); conflicts: calls where an estimate met a size the "
            "program computed otherwise and took the program's (auditor.capture.tracing.fake_tensors).", "",
            _table(["site", "operator", "source", "ratio", "traced calls", "elements out", "conflicts"],
                   rows), ""]


def _what_ran(report: ValidationReport) -> str:
    ran = report.ran
    if isinstance(ran, GradProbeRun):
        return (f"GradProbe variant `{ran.variant}`, strategy `{ran.strategy}`, sequence "
                f"{ran.sequence_length}, batch {ran.batch_size}, {ran.batches} "
                f"batches, sparsity {ran.sparsity}.")
    return (f"Program `{ran.ran}`, unmodified; its model built by `{ran.model_from}` (at the "
            "target's sizes in the traced run); stages: "
            + (", ".join(f"`{t}`" for t in ran.stages) or "none") + ". No scaled projection: "
            "its drivers are fitted for GradProbe's state, so a program is projected by tracing.")


def _fit(fit: Fit) -> list[str]:
    lines = [f"Method: {fit.method}.", ""]
    if fit.runs:
        lines += ["Calibration runs: " + "; ".join(
            f"{r.label} ({', '.join(f'{k} {v}' for k, v in r.overrides.items())}, "
            f"{r.tokens} tokens)" for r in fit.runs) + ".", ""]
    lines += [_table(["driver", "audited", "target", "ratio"],
                     [[d.name, f"{d.audited:,.0f}", f"{d.target:,.0f}", f"{d.ratio:,.3f}"] for d in fit.drivers]), ""]
    lines += ["Transient inside each stage (live-tensor peak minus end), split onto drivers: the "
              "bytes each driver accounts for at the audited shape, grown by its ratio.", ""]
    rows = []
    for t in fit.transients:
        shares = ", ".join(f"{d} {units.size(b)}" for d, b in t.shares.items()) or "none"
        rows.append([t.path, units.size(t.bytes), t.how + (f" (in `{t.peak_in}`)" if t.peak_in else ""),
                     shares, units.size(t.residual), units.size(t.projected)])
    lines.append(_table(["stage", "audited", "how", "shares", "largest miss", "projected"], rows))
    if fit.refitted:
        lines += ["", "Components whose a-priori driver missed a calibration run, fitted instead: "
                  + "; ".join(f"`{r.name}` in `{r.stage}` -> " + ", ".join(r.shares) for r in fit.refitted) + "."]
    return lines


def _table(headers: list[str], rows: list[list[str]]) -> str:
    """Cells of numbers and paths: only their pipes need escaping."""
    return md.table(headers, [[str(c).replace("|", "\\|") for c in row] for row in rows])
