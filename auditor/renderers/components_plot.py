"""The components over the run as a PNG: each folded component's bytes at every stage end.

The largest components (by the most each held at once) are stacked in time order, the rest
summed into one band, so the top edge is the census total at each stage end. Steps hold a
value from one stage end to the next: the census is taken only at stage ends. With a single
census (one stage around the work) a timeline would be one step as wide as nothing, an empty
frame: the figure is then two stacked bars instead, what was alive at that stage's live-tensor
high (its `at_peak` rows, named by the censuses taken inside it) and its census at the end.
Drawn from the run report's model (its `components`, auditor.report_models.run) on a bare matplotlib Figure
with an Agg canvas, as the timeline is (no pyplot, no backend switch).
"""
from __future__ import annotations

from pathlib import Path

from auditor.analysis.run.component_history import ComponentHistory
from auditor.facts import safe_files, units
from auditor.renderers.plot_text import component_name, fit_title
from auditor.report_models.run import OneCensus, RunReport

TOP = 8
COLOURS = ("#1f4e9c", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#827717")
REST_COLOUR = "#bdbdbd"


def render(report: RunReport, path: str | Path) -> Path | None:
    """Draw the report's component timeline into `path`; None (nothing written) without a census."""
    figure = draw(report)
    if figure is None:
        return None
    path = Path(path)
    with safe_files.replaced(path, "wb") as file:  # a link planted at `path` is replaced, never followed
        figure.savefig(file, format="png")
    return path


def draw(report: RunReport):
    """The figure, or None when the record has no census at any stage end."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    items = report.components.over_the_run
    if not items:
        return None
    one = report.components.one_census
    if one is not None:
        return _draw_moments(report, one, Figure, FigureCanvasAgg)
    times = [t for t, _ in items[0].series]
    top, rest = items[:TOP], items[TOP:]
    peak = max(sum(v for _, v in values) for values in zip(*(i.series for i in items), strict=False))
    unit, scale = ("GiB", units.GiB) if peak >= 10 * units.GiB else ("MiB", units.MiB)
    bands = [[v / scale for _, v in item.series] for item in top]
    labels = [_label(item) for item in top]
    colours = list(COLOURS[:len(top)])
    if rest:
        bands.append([sum(values) / scale for values in zip(*([v for _, v in i.series] for i in rest), strict=False)])
        labels.append(f"{len(rest)} smaller components")
        colours.append(REST_COLOUR)

    figure = Figure(figsize=(11, 4.8), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    end = max(report.components.run_s or 0, times[-1] + 1e-3)  # the last census holds to the end
    times = times + [end]
    bands = [b + b[-1:] for b in bands]
    axes.stackplot(times, *bands, labels=labels, colors=colours, step="post", alpha=0.85, lw=0)
    axes.set_xlim(0, end)
    axes.set_ylim(0, peak / scale * 1.12 or 1)
    axes.set_xlabel("seconds since the audit began (a census at each stage end)")
    axes.set_ylabel(unit)
    fit_title(figure, axes.set_title, f"{report.summary.name}: components at each stage end "
              f"(largest {len(top)}, folded over instances)")
    axes.grid(axis="y", lw=0.4, alpha=0.6)
    axes.legend(loc="upper left", fontsize=7, framealpha=0.85)
    return figure


def _label(item: ComponentHistory) -> str:
    name = component_name(item.name, 44)
    count = f" x{len(item.instances)}" if len(item.instances) > 1 else ""
    return f"{name}{count} (max {units.size(item.most_at_once)})"


def _draw_moments(report: RunReport, one: OneCensus, figure_type, canvas_type):
    """One census: its stage's live-tensor high beside its end, as two stacked bars."""
    stage = one.stage
    columns: list[tuple[str, dict[str, int]]] = []
    if one.at_high:
        columns.append(("at its live-tensor high", one.at_high))
    columns.append(("at its end (census)", one.at_end))
    names = sorted({n for _, values in columns for n in values},
                   key=lambda n: -max(values.get(n, 0) for _, values in columns))
    top, rest = names[:TOP], names[TOP:]
    peak = max(sum(values.values()) for _, values in columns)
    unit, scale = ("GiB", units.GiB) if peak >= 10 * units.GiB else ("MiB", units.MiB)
    figure = figure_type(figsize=(11, 4.8), dpi=110, layout="constrained")
    canvas_type(figure)
    axes = figure.add_subplot()
    positions = list(range(len(columns)))
    bands = [(component_name(n, 44), [values.get(n, 0) for _, values in columns], COLOURS[i])
             for i, n in enumerate(top)]
    if rest:
        bands.append((f"{len(rest)} smaller components",
                      [sum(values.get(n, 0) for n in rest) for _, values in columns], REST_COLOUR))
    bottom = [0.0] * len(columns)
    for label, sizes, colour in bands:
        heights = [size / scale for size in sizes]
        axes.bar(positions, heights, 0.5, bottom=bottom, color=colour, alpha=0.85,
                 label=f"{label} (max {units.size(max(sizes))})")
        bottom = [b + h for b, h in zip(bottom, heights, strict=False)]
    axes.set_xticks(positions, [label for label, _ in columns])
    axes.set_ylim(0, peak / scale * 1.12 or 1)
    axes.set_ylabel(unit)
    where = stage.path if stage is not None else "the run"
    fit_title(figure, axes.set_title, f"{report.summary.name}: components of {where} (one census, "
              "so no timeline: its high and its end)")
    axes.grid(axis="y", lw=0.4, alpha=0.6)
    axes.legend(loc="upper right", fontsize=7, framealpha=0.85)
    return figure

