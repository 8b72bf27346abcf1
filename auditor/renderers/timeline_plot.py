"""The run's memory over time as a PNG (matplotlib, Agg backend: no display needed).

RSS readings at stage boundaries and marks joined by a line, each stage's peak drawn inside
the stage (see `auditor.analysis.timeline`), the peaks of unstaged intervals (time no stage
covers) at their middle, memray's RSS snapshots and the live-tensor meter when the record has
them, top-level stages shaded as labelled spans. Drawn from the run report's model (its
`timeline`, auditor.analysis.run_report) on a bare matplotlib Figure with an Agg canvas: no
pyplot, no global backend switch.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

from auditor import units
from auditor.analysis.run_report import RunReport

SPAN_COLOURS = ("#dbe9f6", "#fbe5d0")
FAILED_COLOUR = "#f4c7c3"
LABEL_CHARS = 28
MAX_LABELS = 40          # top-level stages named on the plot, the widest first ...
MIN_LABEL_WIDTH = 0.005  # ... when there are more, only those at least this share of the run
TITLE_CHARS, TITLE_LINES = 110, 3  # a line of the 10 pt title, first guess for the 11 in figure


def write_png(report: RunReport, path: str | Path) -> Path:
    """Draw the report's timeline into `path` (a .png); returns the path."""
    path = Path(path)
    draw(report).savefig(path, format="png")
    return path


def draw(report: RunReport):
    """The timeline as a matplotlib Figure (Agg canvas), every label inside the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # a bare Figure: no pyplot state, no backend switch

    line, gaps = report.timeline.line, report.timeline.unstaged_peaks
    peak = max([v for _, v in line.rss] + [v for _, v in line.memray] + [v for _, v in line.live_tensors] + [1])
    unit, scale = ("GiB", units.GiB) if peak >= 10 * units.GiB else ("MiB", units.MiB)

    figure = Figure(figsize=(11, 4.8), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    total = max(line.end_s, 1e-9)
    labelled = {id(s) for s in sorted(line.spans, key=lambda s: s.end - s.start, reverse=True)[:MAX_LABELS]
                if s.end - s.start >= MIN_LABEL_WIDTH * total or len(line.spans) <= MAX_LABELS}
    for index, span in enumerate(line.spans):
        colour = FAILED_COLOUR if span.status != "ok" else SPAN_COLOURS[index % 2]
        axes.axvspan(span.start, max(span.end, span.start + 1e-9), color=colour, alpha=0.9, lw=0,
                     hatch="//" if span.status != "ok" else None, zorder=0)
        if id(span) not in labelled:
            continue  # many stages: only the widest are named
        label = span.label if len(span.label) <= LABEL_CHARS else span.label[:LABEL_CHARS - 1] + "…"
        if span.status != "ok":
            label += f" [{span.status}]"
        axes.text((span.start + span.end) / 2, 0.98, label, transform=axes.get_xaxis_transform(),
                  rotation=90, ha="center", va="top", fontsize=7, color="#333333", clip_on=True)
    if line.memray:
        axes.plot([t for t, _ in line.memray], [v / scale for _, v in line.memray], color="#9e9e9e",
                  lw=0.8, label="RSS, memray snapshots", zorder=2)
    if line.rss:
        axes.plot([t for t, _ in line.rss], [v / scale for _, v in line.rss], color="#1f4e9c",
                  lw=1.6, marker=".", ms=3, label="RSS (stage boundaries, marks, peaks)", zorder=3)
    if line.live_tensors:
        axes.plot([t for t, _ in line.live_tensors], [v / scale for _, v in line.live_tensors],
                  color="#2e7d32", lw=1.3, ls="--", label="live tensors", zorder=3)
    if line.peaks:
        axes.scatter([p.t for p in line.peaks], [p.value / scale for p in line.peaks], marker="^",
                     color="#c62828", s=28, label="peak inside a stage", zorder=4)
    if gaps:
        axes.scatter([p.t for p in gaps], [p.value / scale for p in gaps], marker="v",
                     color="#ef6c00", s=28, label="peak in unstaged time", zorder=4)
    if line.run_peak is not None:
        p = line.run_peak
        right = p.t > 0.7 * total  # near the right edge: write the label to the left
        axes.annotate(f"peak {units.size(p.value)}\n{_short(p.stage)}", (p.t, p.value / scale),
                      xytext=(-8 if right else 8, -4), textcoords="offset points", fontsize=8,
                      color="#c62828", va="top", ha="right" if right else "left", zorder=5)
    if line.marks:
        axes.plot([t for t, _, _ in line.marks], [v / scale for _, _, v in line.marks], ls="none",
                  marker="o", color="#6a1b9a", ms=3.5, label="mark", zorder=4)
    axes.set_xlim(0, max(line.end_s, max((t for t, _ in line.rss), default=0), 1e-3))
    axes.set_ylim(0, peak / scale * 1.12)
    axes.set_xlabel("seconds since the audit began (census time excluded)")
    axes.set_ylabel(unit)
    _fit_title(figure, axes, f"{report.summary.name}: memory over time")
    axes.grid(axis="y", lw=0.4, alpha=0.6)
    axes.legend(loc="best", fontsize=7, framealpha=0.85)
    return figure


def _fit_title(figure, axes, text: str) -> None:
    """The title wrapped to the figure's width, measured (a long run name, or wide letters,
    would run off both edges), at most TITLE_LINES lines."""
    chars = TITLE_CHARS
    renderer = figure.canvas.get_renderer()
    for _ in range(4):
        title = axes.set_title(textwrap.fill(text, width=chars, max_lines=TITLE_LINES,
                                             placeholder=" …"), fontsize=10)
        width = title.get_window_extent(renderer).width
        if width <= 0.95 * figure.bbox.width:
            return
        chars = max(int(chars * 0.9 * figure.bbox.width / width), 10)


def _short(text: str | None) -> str:
    text = text or ""
    return text if len(text) <= 40 else "…" + text[-39:]
