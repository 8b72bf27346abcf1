"""The comparison chart (PNG): per side, the median peak RSS split into the loaded inputs and
the algorithm's overhead above them, with min-max whiskers; beside it, the wall time.

Drawn from auditor.report_models.comparison's model on a bare matplotlib Figure (Agg
canvas): no pyplot, no global backend switch.
"""
from __future__ import annotations

from pathlib import Path

from auditor.facts import safe_files
from auditor.facts.units import MiB
from auditor.renderers.plot_text import fit_title
from auditor.report_models.comparison import ComparisonReport, Spread

LOADED_COLOUR, OVERHEAD_COLOUR, TIME_COLOUR = "#b8c4d6", "#3b6fb6", "#8c8c8c"


def render(report: ComparisonReport, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with safe_files.replaced(path, "wb") as file:  # a link planted at `path` is replaced, never followed
        draw(report).savefig(file, format=path.suffix[1:] or "png")
    return path


def draw(report: ComparisonReport):
    """The chart as a matplotlib Figure (Agg canvas), laid out so that no text leaves it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = [side.name for side in report.sides]
    peak_rss, walls_s = [_read(side.peak_rss) for side in report.sides], [_read(side.wall_s) for side in report.sides]
    figure = Figure(figsize=(4.0 + 1.6 * len(names), 4.8), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    memory, time = figure.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    positions = range(len(names))

    peaks = [s.median / MiB for s in peak_rss]
    loaded = [side.loaded_rss.median / MiB if side.loaded_rss else 0.0 for side in report.sides]
    over = [peak - base for peak, base in zip(peaks, loaded, strict=False)]
    low = [peak - s.min / MiB for peak, s in zip(peaks, peak_rss, strict=False)]
    high = [s.max / MiB - peak for peak, s in zip(peaks, peak_rss, strict=False)]
    memory.bar(positions, loaded, color=LOADED_COLOUR, label="loaded (inputs, model)")
    memory.bar(positions, over, bottom=loaded, color=OVERHEAD_COLOUR, label="peak over loaded",
               yerr=[low, high], capsize=5, ecolor="black")
    for x, peak, top in zip(positions, peaks, high, strict=False):
        memory.annotate(f"{peak:,.0f}", (x, peak + top), textcoords="offset points", xytext=(0, 4),
                        ha="center", fontsize=8)
    _names_under(memory, names)
    memory.set_ylabel("peak RSS, MiB (median; whiskers min-max)")
    memory.set_ylim(0, max(p + h for p, h in zip(peaks, high, strict=False)) * 1.12)
    figure.legend(handles=memory.get_legend_handles_labels()[0], loc="outside lower center", ncols=2,
                  fontsize=8, frameon=False)
    memory.set_title("peak RSS per side", fontsize=10)

    walls = [s.median for s in walls_s]
    time.bar(positions, walls, color=TIME_COLOUR,
             yerr=[[w - s.min for w, s in zip(walls, walls_s, strict=False)],
                   [s.max - w for w, s in zip(walls, walls_s, strict=False)]], capsize=5, ecolor="black")
    _names_under(time, names)
    time.set_ylabel("wall time, s (median; whiskers min-max)")
    time.set_title("wall time", fontsize=10)

    fit_title(figure, figure.suptitle, f"{report.name}: {report.sides[0].runs} runs per side, fresh processes")
    return figure


def _read(spread: Spread | None) -> Spread:
    """Every side in a comparison has run: its peak RSS and wall time have readings."""
    assert spread is not None
    return spread


def _names_under(axes, names: list[str]) -> None:
    tilted = len(names) > 3
    axes.set_xticks(range(len(names)), names, rotation=25 if tilted else 0, ha="right" if tilted else "center",
                    rotation_mode="anchor" if tilted else "default")
