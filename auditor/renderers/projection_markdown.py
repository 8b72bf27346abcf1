"""The report's projection details: for each target, the audited run and every projection of it
(scaled, traced) as columns of one stage table and one component table, with how each was made
and what its figures rest on (auditor.analysis.projection.side_by_side makes the rows, for the run
report's model: its `targets`)."""
from __future__ import annotations

from collections.abc import Sequence

from auditor.analysis.projection.side_by_side import ComponentSide, StageSide, TargetSides
from auditor.analysis.projection.views import ProjectionView
from auditor.facts import units
from auditor.renderers import markdown_text as md

MOST_COMPONENTS = 20
_HOW = {
    "traced": "the program run again on fake tensors at the target's shapes: tensors are measured "
              "exactly; RSS adds the audited run's memory beyond tensors (interpreter, libraries, "
              "allocator), which does not grow with the model",
    "scaled": "each audited component grown by what drives it (parameters, activations...), "
              "fitted on traced calibration runs where the record has them",
}
# a traced projection whose RSS has a band (auditor.analysis.projection.rss_band); older records have none
_HOW_BANDED = ("the program run again on fake tensors at the target's shapes: tensors are measured exactly; "
               "RSS adds the audited run's memory beyond tensors (interpreter, libraries, allocator) and the "
               "allocator's modeled growth, with a band for what that part may do at the target's size")


def heading(target: str) -> str:
    """The heading of a target's projection details (the answer's caveats link to it)."""
    return f"Projection to {target}"


def sections(targets: list[TargetSides], views: Sequence[ProjectionView] = ()) -> str:
    """Each target's projection details; `views` (the record's projections) say what each
    method's figures rest on."""
    return "\n\n".join(_section(target, views) for target in targets)


def _section(target: TargetSides, views: Sequence[ProjectionView]) -> str:
    lines = []
    for side in target.sides:
        view = next((v for v in views if v.method == side.method and v.target == side.target), None)
        rests = [md.text(t) for t in (view.estimates, view.basis) if t] if view is not None else []
        if side.target_model:
            rests.insert(0, f"Its model: {md.text(side.target_model)}")
        if view is not None and view.withheld:  # its figures are here, its headline is not
            rests.insert(0, f"**Its headline figures are {md.text(view.withheld)}**")
        rests += [f"**{md.text(note)}**" for note in side.notes]
        if side.rss_band_basis:
            rests.append(f"RSS band: {md.text(side.rss_band_basis)}")
        how = _HOW_BANDED if side.rss_band_basis else _HOW.get(side.method, md.text(side.method))
        lines.append(md.wrapped(f"- {md.text(side.how)}: {how}."))
        lines += [md.wrapped(f"  - {r[0].upper()}{r[1:]}." if not r.startswith("**") else f"  - {r}.", indent="    ")
                  for r in rests]
    return (f"### {md.text(heading(target.target))}\n\nHow each projection was made, and what its figures rest on:"
            f"\n\n" + "\n".join(lines) + f"\n\n{_stage_table(target)}\n\n{_component_table(target)}")


def _stage_table(target: TargetSides) -> str:
    head = ["stage", "calls audited", "calls at target", "live tensors peak, audited", "RSS peak, audited"]
    for side in target.sides:
        head += [f"live tensors, {md.text(side.how)}", f"RSS, {md.text(side.how)}"]
    rows = []
    for first, each in target.stages:
        row = ["&emsp;" * first.depth + md.text(first.name.rsplit("/", 1)[-1]), _calls(first.audited_calls),
               _calls_each(s.target_calls if s else 0 for s in each),
               units.size(first.audited_tensor_peak), units.size(first.audited_rss_peak)]
        for s in each:
            row += _stage_cells(s)
        rows.append(row)
    return ("Each stage's highest call, audited and at the target; repeated calls are one row.\n\n"
            + md.table(head, rows, right=range(1, len(head))))


def _stage_cells(s: StageSide | None) -> list[str]:
    if s is None:
        return ["-", "-"]
    if s.target_miss is not None:
        return [unexplained(s.target_miss), unexplained(s.target_miss)]
    return [units.size(s.target_tensor_peak), rss_with_band(s.target_rss_peak, s.target_rss_low, s.target_rss_high)]


def rss_with_band(rss: int | None, low: int | None, high: int | None) -> str:
    """A projected RSS as "X (band L to H)", or X alone where it has no band."""
    if low is None or high is None:
        return units.size(rss)
    return f"{units.size(rss)} (band {units.size(low)} to {units.size(high)})"


def unexplained(miss: int | None) -> str:
    """A scaled figure its drivers do not explain (auditor.analysis.projection.scaled), in place of the number."""
    return f"not explained by its drivers (miss {units.size(miss)}): see traced"


def _calls(n: int) -> str:
    return f"{n:,}" if n else "-"


def _calls_each(counts) -> str:
    shown = list(dict.fromkeys(_calls(n) for n in counts))
    return " / ".join(shown)


def _component_table(target: TargetSides) -> str:
    shown = target.components[:MOST_COMPONENTS]
    head = ["component", "category", "audited", *(f"at target, {md.text(s.how)}" for s in target.sides),
            "instances at once (audited / target)"]
    rows = []
    notes = md.Notes(marks="")
    for first, each in shown:
        why = next((c.why for c in each if c is not None and c.why), None)
        mark = notes.mark(why) if why else ""
        rows.append([md.code(first.name), md.text(first.category),
                     units.size(first.audited) if first.audited_instances else "-",
                     *(_component_cell(c) + (mark if c is not None and c.target_instances else "") for c in each),
                     f"{first.audited_instances:,} / "
                     + " / ".join(dict.fromkeys(f"{c.target_instances if c else 0:,}" for c in each))])
    more = (f"\n\n{len(target.components) - len(shown):,} smaller components are in the run record."
            if len(target.components) > len(shown) else "")
    return ("The most each component's instances held together at one stage end, audited and at the target.\n\n"
            + md.table(head, rows, right=range(2, 2 + 1 + len(target.sides))) + more + notes.text())


def _component_cell(c: ComponentSide | None) -> str:
    if c is None or not c.target_instances and c.target_miss is None:
        return "-"
    if c.target_miss is not None:
        return unexplained(c.target_miss)
    return units.size(c.target)
