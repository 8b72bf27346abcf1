"""The components over the run as a PNG: each folded component's bytes at every stage end.

The largest components (by the most each held at once) are stacked in time order, the rest
summed into one band, so the top edge is the census total at each stage end. Steps hold a
value from one stage end to the next: the census is taken only at stage ends. Drawn from the
run report's model (its `components`, auditor.analysis.run_report) on a bare matplotlib Figure
with an Agg canvas, as the timeline is (no pyplot, no backend switch).
"""
from __future__ import annotations

from pathlib import Path

from auditor import units
from auditor.analysis.component_history import ComponentHistory
from auditor.analysis.run_report import RunReport
from auditor.renderers.plot_text import component_name, fit_title

TOP = 8
COLOURS = ("#1f4e9c", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#827717")
REST_COLOUR = "#bdbdbd"


def write_png(report: RunReport, path: str | Path) -> Path | None:
    """Draw the report's component timeline into `path`; None (nothing written) without a census."""
    figure = draw(report)
    if figure is None:
        return None
    path = Path(path)
    figure.savefig(path, format="png")
    return path


def draw(report: RunReport):
    """The figure, or None when the record has no census at any stage end."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    items = report.components.over_the_run
    if not items:
        return None
    times = [t for t, _ in items[0].series]
    top, rest = items[:TOP], items[TOP:]
    peak = max(sum(v for _, v in values) for values in zip(*(i.series for i in items)))
    unit, scale = ("GiB", units.GiB) if peak >= 10 * units.GiB else ("MiB", units.MiB)
    bands = [[v / scale for _, v in item.series] for item in top]
    labels = [_label(item) for item in top]
    colours = list(COLOURS[:len(top)])
    if rest:
        bands.append([sum(values) / scale for values in zip(*([v for _, v in i.series] for i in rest))])
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
