"""The report's projection sections: audited scale and each target side by side, per stage and
per component (auditor.analysis.projection_side_by_side makes the rows, for the run report's
model: its `projections`)."""
from __future__ import annotations

from auditor import units
from auditor.analysis.projection_side_by_side import SideBySide
from auditor.renderers import markdown_text as md

MOST_COMPONENTS = 20
_HOW = {
    "traced": "the program run again on fake tensors at the target's shapes: tensors are measured "
              "exactly; RSS adds the audited run's memory beyond tensors (interpreter, libraries, "
              "allocator), which does not grow with the model",
    "scaled": "each audited component grown by what drives it (parameters, activations...), "
              "fitted on traced calibration runs where the record has them",
}


def sections(sides: list[SideBySide]) -> str:
    """The sections of projections already set side by side (the run report's model holds them)."""
    return "\n\n".join(_section(side) for side in sides)


def _section(side: SideBySide) -> str:
    lead = f"How: {_HOW.get(side.method, md.text(side.method))}."
    notes = "".join(f"\n\n> **{md.text(note)}**" for note in side.notes)
    return (f"## Projection to {md.text(side.target)} ({md.text(side.how)})\n\n{lead}{notes}\n\n"
            f"### Stages\n\n{_stage_table(side)}\n\n### Components\n\n{_component_table(side)}")


def _stage_table(side: SideBySide) -> str:
    rows = [["&emsp;" * s.depth + md.text(s.name.rsplit("/", 1)[-1]), _calls(s.audited_calls),
             _calls(s.target_calls), units.size(s.audited_tensor_peak),
             *([unexplained(s.target_miss), "", units.size(s.audited_rss_peak), unexplained(s.target_miss)]
               if s.target_miss is not None else
               [units.size(s.target_tensor_peak), units.ratio(s.target_tensor_peak, s.audited_tensor_peak),
                units.size(s.audited_rss_peak), units.size(s.target_rss_peak)])] for s in side.stages]
    head = ["stage", "calls audited", "calls at target", "live tensors peak, audited",
            "projected", "growth", "RSS peak, audited", "projected"]
    return ("Each stage's highest call on each side; repeated calls are one row.\n\n"
            + md.table(head, rows, right=range(1, 8)))


def unexplained(miss: int | None) -> str:
    """A scaled figure its drivers do not explain (auditor.analysis.projection), in place of the number."""
    return f"not explained by its drivers (miss {units.size(miss)}): see traced"


def _calls(n: int) -> str:
    return f"{n:,}" if n else "-"


def _component_table(side: SideBySide) -> str:
    shown = side.components[:MOST_COMPONENTS]
    rows = [[md.code(c.name), md.text(c.category), units.size(c.audited) if c.audited_instances else "-",
             *([unexplained(c.target_miss), ""] if c.target_miss is not None else
               [units.size(c.target) if c.target_instances else "-", units.ratio(c.target, c.audited)]),
             f"{c.audited_instances:,} / {c.target_instances:,}"] for c in shown]
    more = (f"\n\n{len(side.components) - len(shown):,} smaller components are in the record's "
            "`projections`." if len(side.components) > len(shown) else "")
    return ("The most each component's instances held together at one stage end, audited and "
            "at the target.\n\n"
            + md.table(["component", "category", "audited", "projected", "growth",
                        "instances at once (audited / target)"], rows, right=range(2, 6)) + more)
