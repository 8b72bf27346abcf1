"""The comparison chart (PNG): per side, the median peak RSS split into the loaded inputs and
the algorithm's overhead above them, with min-max whiskers; beside it, the wall time.

Drawn on a bare matplotlib Figure (Agg canvas): no pyplot, no global backend switch.
"""
from __future__ import annotations

from pathlib import Path

MiB = 1 << 20
LOADED_COLOUR, OVERHEAD_COLOUR, TIME_COLOUR = "#b8c4d6", "#3b6fb6", "#8c8c8c"


def render(record: dict, summary: dict, path: str | Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = [side["name"] for side in record["sides"]]
    stats = [summary["sides"][name] for name in names]
    figure = Figure(figsize=(4.0 + 1.6 * len(names), 4.6), dpi=110)
    FigureCanvasAgg(figure)
    memory, time = figure.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    positions = range(len(names))

    peaks = [s["peak_rss"]["median"] / MiB for s in stats]
    loaded = [s["loaded_rss"]["median"] / MiB if s["loaded_rss"] else 0.0 for s in stats]
    over = [peak - base for peak, base in zip(peaks, loaded)]
    low = [peak - s["peak_rss"]["min"] / MiB for peak, s in zip(peaks, stats)]
    high = [s["peak_rss"]["max"] / MiB - peak for peak, s in zip(peaks, stats)]
    memory.bar(positions, loaded, color=LOADED_COLOUR, label="loaded (inputs, model)")
    memory.bar(positions, over, bottom=loaded, color=OVERHEAD_COLOUR, label="peak over loaded",
               yerr=[low, high], capsize=5, ecolor="black")
    for x, peak, top in zip(positions, peaks, high):
        memory.annotate(f"{peak:,.0f}", (x, peak + top), textcoords="offset points", xytext=(0, 4),
                        ha="center", fontsize=8)
    _names_under(memory, names)
    memory.set_ylabel("peak RSS, MiB (median; whiskers min-max)")
    memory.set_ylim(0, max(p + h for p, h in zip(peaks, high)) * 1.12)
    memory.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1 if len(names) <= 3 else -0.2), ncol=2,
                  fontsize=8, frameon=False)
    memory.set_title("peak RSS per side", fontsize=10)

    walls = [s["wall_s"]["median"] for s in stats]
    time.bar(positions, walls, color=TIME_COLOUR,
             yerr=[[w - s["wall_s"]["min"] for w, s in zip(walls, stats)],
                   [s["wall_s"]["max"] - w for w, s in zip(walls, stats)]], capsize=5, ecolor="black")
    _names_under(time, names)
    time.set_ylabel("wall time, s (median; whiskers min-max)")
    time.set_title("wall time", fontsize=10)

    runs = summary["sides"][names[0]]["runs"]
    figure.suptitle(f"{record['name']}: {runs} runs per side, fresh processes", fontsize=10)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    return path


def _names_under(axes, names: list[str]) -> None:
    tilted = len(names) > 3
    axes.set_xticks(range(len(names)), names, rotation=25 if tilted else 0, ha="right" if tilted else "center",
                    rotation_mode="anchor" if tilted else "default")
