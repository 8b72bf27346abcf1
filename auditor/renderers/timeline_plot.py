"""The run's memory over time as a PNG (matplotlib, Agg backend: no display needed).

Above: RSS readings at stage boundaries and marks joined by a line, each stage's peak drawn inside
the stage (see `auditor.analysis.run.timeline`), the peaks of unstaged intervals (time no stage covers)
at their middle, memray's RSS snapshots and the live-tensor meter when the record has them, and
under the line what the tensors were, stacked: the census's components at each stage end, or,
in a record without a census, each innermost stage's live tensors at its peak by category.
Below, on the same time axis: the stages as spans, a row per nesting depth, named where the name
fits (shortened with an ellipsis, left out on spans too narrow); the peak's stage is always
named, outlined in red. Drawn from the run report's model (its `timeline` and `components`,
auditor.report_models.run) on a bare matplotlib Figure with an Agg canvas: no pyplot, no
global backend switch.
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from auditor.analysis.run.timeline import Composition, Span
from auditor.facts import safe_files, units
from auditor.renderers.plot_text import component_name, fit_title, shorten, text_width
from auditor.report_models.run import RunReport

SPAN_COLOURS = ("#dbe9f6", "#fbe5d0")
FAILED_COLOUR = "#f4c7c3"
PEAK_COLOUR = "#c62828"
STACK_COLOURS = ("#9ecae1", "#fdae6b", "#a1d99b", "#c5b0d5", "#f7b6d2", "#dbdb8d", "#9edae5")
REST_COLOUR = "#e0e0e0"
TOP = 7                 # stacked components named; the rest summed into one band
ROWS = 3                # stage rows: top level, nested, nested deeper (all deeper ones share it)
LABEL_SIZE = 7
MIN_LABEL_PX = 14       # a span narrower than this is not named (the peak's always is)
PAD_PX = 3              # between a label and its span's edges


@dataclass
class Stack:
    """What is stacked under the RSS line: steps that hold from each time to the next."""
    title: str
    times: list[float]
    bands: list[tuple[str, list[int]]]   # (legend label, bytes at each time), bottom first


def render(report: RunReport, path: str | Path) -> Path:
    """Draw the report's timeline into `path` (a .png); returns the path."""
    path = Path(path)
    with safe_files.replaced(path, "wb") as file:  # a link planted at `path` is replaced, never followed
        draw(report).savefig(file, format="png")
    return path


def draw(report: RunReport):
    """The timeline as a matplotlib Figure (Agg canvas), every label inside the figure. The
    memory axes are `figure.axes[0]`, the stage rows `figure.axes[1]`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # a bare Figure: no pyplot state, no backend switch

    line, gaps = report.timeline.line, report.timeline.unstaged_peaks
    stack = census_stack(report) or composition_stack(line.compositions, line.end_s)
    stacked_top = max((sum(b[i] for _, b in stack.bands) for i in range(len(stack.times))), default=0) \
        if stack else 0
    peak = max([v for _, v in line.rss] + [v for _, v in line.memray] + [v for _, v in line.live_tensors]
               + [stacked_top, 1])
    unit, scale = ("GiB", units.GiB) if peak >= units.GiB else ("MiB", units.MiB)
    spans = line.spans + line.nested
    rows = min(max((s.depth for s in spans), default=0) + 1, ROWS)

    figure = Figure(figsize=(11, 6.2 + 0.25 * rows), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    axes, band = figure.subplots(2, 1, sharex=True, height_ratios=[5, 0.42 * rows + 0.2])
    end = max(line.end_s, max((t for t, _ in line.rss), default=0), 1e-3)
    if stack:
        times = stack.times + [end]
        colours = [STACK_COLOURS[i % len(STACK_COLOURS)] for i in range(len(stack.bands))]
        if len(stack.bands) > TOP:
            colours[-1] = REST_COLOUR
        axes.stackplot(times, *[[v / scale for v in values] + [values[-1] / scale] for _, values in stack.bands],
                       labels=[label for label, _ in stack.bands], colors=colours, step="post", lw=0, zorder=1)
    if line.memray:
        axes.plot([t for t, _ in line.memray], [v / scale for _, v in line.memray], color="#9e9e9e",
                  lw=0.8, label="RSS, memray snapshots", zorder=2)
    if line.rss:
        axes.plot([t for t, _ in line.rss], [v / scale for _, v in line.rss], color="#1f4e9c",
                  lw=1.6, marker=".", ms=3, label="RSS (stage boundaries, marks, peaks)", zorder=3)
    if line.live_tensors:
        axes.plot([t for t, _ in line.live_tensors], [v / scale for _, v in line.live_tensors],
                  color="#2e7d32", lw=1.3, ls="--", label="live tensors (total)", zorder=3)
    if line.peaks:
        axes.scatter([p.t for p in line.peaks], [p.value / scale for p in line.peaks], marker="^",
                     color=PEAK_COLOUR, s=28, label="peak inside a stage", zorder=4)
    if gaps:
        axes.scatter([p.t for p in gaps], [p.value / scale for p in gaps], marker="v",
                     color="#ef6c00", s=28, label="peak in unstaged time", zorder=4)
    peak_label = None
    if line.run_peak is not None:
        p = line.run_peak
        where = textwrap.fill(p.stage, width=48, max_lines=2, placeholder=" …")
        peak_label = axes.annotate(f"peak {units.size(p.value)}\n{where}", (p.t, p.value / scale),
                                   xytext=(0, 0), textcoords="offset points", fontsize=8, color=PEAK_COLOUR, zorder=5,
                                   bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1})
        _beside(peak_label, right=p.t > 0.6 * end)
    if line.marks:
        axes.plot([t for t, _, _ in line.marks], [v / scale for _, _, v in line.marks], ls="none",
                  marker="o", color="#6a1b9a", ms=3.5, label="mark", zorder=4)
    if len(line.spans) <= 20:  # the top-level stages' edges, carried up from the rows below
        for span in line.spans:
            axes.axvline(span.start, color="#9e9e9e", lw=0.5, ls=":", zorder=0)
    axes.set_xlim(0, end)
    axes.set_ylim(0, peak / scale * 1.12)
    axes.set_ylabel(unit)
    axes.tick_params(labelbottom=False)
    axes.grid(axis="y", lw=0.4, alpha=0.6)
    fit_title(figure, axes.set_title, f"{report.summary.name}: memory over time")
    handles, labels = axes.get_legend_handles_labels()
    stacked = {label for label, _ in stack.bands} if stack else set()
    order = sorted(range(len(labels)), key=lambda i: labels[i] in stacked)  # the lines first
    handles, labels = [handles[i] for i in order], [labels[i] for i in order]
    if handles:
        figure.legend(handles, labels, loc="outside lower center",
                      ncols=min(4, len(handles)), fontsize=7, frameon=False,
                      title=stack.title if stack else None, title_fontsize=7)

    _draw_rows(band, spans, rows, end)
    band.set_xlabel("seconds since the audit began (census time excluded)")
    figure.draw_without_rendering()   # the layout settles: the rows' width in pixels is known
    figure.set_layout_engine("none")  # and stays as it is while the stage names are placed
    _name_spans(figure, band, spans, rows, line.run_peak)
    if peak_label is not None:
        _clear_of_lines(figure, axes, peak_label, right=line.run_peak is not None and line.run_peak.t > 0.6 * end)
    return figure


PEAK_LABEL_PLACES = ((-8, -4, "right", "top"), (8, -4, "left", "top"), (-8, 6, "right", "bottom"),
                     (8, 6, "left", "bottom"), (0, -12, "center", "top"), (0, 10, "center", "bottom"))


def _beside(label, right: bool, place: tuple | None = None) -> None:
    """Puts the peak's label at `place` (offset points, alignment) or, by default, below the
    marker on the side with more room."""
    dx, dy, ha, va = place or PEAK_LABEL_PLACES[0 if right else 1]
    label.set_position((dx, dy))
    label.set_horizontalalignment(ha)
    label.set_verticalalignment(va)


def _clear_of_lines(figure, axes, label, right: bool) -> None:
    """Moves the peak's label to the first place around its marker (the far-from-the-edge side
    first) where it crosses none of the plotted lines and stays inside the axes; where there is
    none, it stays below the marker, on its white ground."""
    renderer = figure.canvas.get_renderer()
    paths = [line.get_transform().transform_path(line.get_path()) for line in axes.lines
             if len(line.get_xdata()) > 1 and line.get_linestyle() not in ("None", "none", "")]
    places = sorted(PEAK_LABEL_PLACES, key=lambda place: (place[2] == ("left" if right else "right")))
    for place in places:
        _beside(label, right, place)
        box = label.get_window_extent(renderer).padded(2)
        inside = axes.bbox.x0 <= box.x0 and box.x1 <= axes.bbox.x1 and axes.bbox.y0 <= box.y0 and box.y1 <= axes.bbox.y1
        if inside and not any(path.intersects_bbox(box, filled=False) for path in paths):
            return
    _beside(label, right)


def census_stack(report: RunReport) -> Stack | None:
    """The census's largest components at each stage end, the rest summed; None without a census."""
    items = report.components.over_the_run
    if not items:
        return None
    times = [t for t, _ in items[0].series]
    bands = [(component_name(item.name), [v for _, v in item.series]) for item in items[:TOP]]
    rest = items[TOP:]
    if rest:
        bands.append((_rest(len(rest)), [sum(v) for v in zip(*([v for _, v in i.series] for i in rest), strict=False)]))
    return Stack("stacked: tensors by component at each stage end (census), held to the next", times, bands)


def composition_stack(compositions: list[Composition], end_s: float) -> Stack | None:
    """Each innermost stage's live tensors at its peak by category, over the stage; None without."""
    if not compositions:
        return None
    totals: dict[str, int] = {}
    for item in compositions:
        for category, size in item.by_category.items():
            totals[category] = max(totals.get(category, 0), size)
    named = sorted(totals, key=lambda c: (-totals[c], c))
    top, rest = named[:TOP], set(named[TOP:])
    times: list[float] = []
    columns: list[dict[str, int]] = []
    for item in sorted(compositions, key=lambda c: c.start):
        column = {c: item.by_category.get(c, 0) for c in top}
        if rest:
            column["rest"] = sum(v for c, v in item.by_category.items() if c in rest)
        times += [item.start, item.end]
        columns += [column, {}]  # nothing is known between two stages
    bands = [(category, [column.get(category, 0) for column in columns]) for category in top]
    if rest:
        bands.append((_rest(len(rest)), [column.get("rest", 0) for column in columns]))
    return Stack("stacked: live tensors at each innermost stage's peak, by category, over that stage",
                 times, bands)


def _draw_rows(band, spans: list[Span], rows: int, end: float) -> None:
    least = end / 1500  # about a pixel: a span of a millisecond still shows
    by_row: dict[int, list[Span]] = {}
    for span in spans:
        by_row.setdefault(min(span.depth, rows - 1), []).append(span)
    for row, members in by_row.items():
        members.sort(key=lambda s: s.start)
        band.broken_barh([(s.start, max(s.end - s.start, least)) for s in members], (row + 0.08, 0.84),
                         facecolors=[FAILED_COLOUR if s.status != "ok" else SPAN_COLOURS[i % 2]
                                     for i, s in enumerate(members)], lw=0, zorder=1)
        failed = [s for s in members if s.status != "ok"]
        if failed:
            band.broken_barh([(s.start, max(s.end - s.start, 1e-9)) for s in failed], (row + 0.08, 0.84),
                             facecolors="none", edgecolor=PEAK_COLOUR, hatch="//", lw=0, zorder=2)
    band.set_ylim(rows, 0)
    names = ["stages", "nested", "nested deeper"][:rows]
    if rows == ROWS and any(s.depth >= ROWS for s in spans):
        names[-1] = f"nested {ROWS - 1}+ deep"
    band.set_yticks([r + 0.5 for r in range(rows)], names, fontsize=7)
    band.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        band.spines[side].set_visible(False)


def _name_spans(figure, band, spans: list[Span], rows: int, run_peak) -> None:
    """Names the spans that have room, widest first, never two names overlapping; the peak's
    stage first and always, beside its span (on a white ground) when the span is too narrow."""
    x0, x1 = band.get_xlim()
    width_px = band.bbox.width
    per_s = width_px / max(x1 - x0, 1e-12)
    taken: dict[int, list[tuple[float, float]]] = {}

    def place(row: int, centre_px: float, text: str, colour: str, weight: str, ground: bool) -> None:
        half = text_width(figure, text, LABEL_SIZE, weight) / 2
        centre_px = min(max(centre_px, half + PAD_PX), width_px - half - PAD_PX)  # inside the rows
        band.text(x0 + centre_px / per_s, row + 0.5, text, ha="center", va="center", fontsize=LABEL_SIZE,
                  color=colour, weight=weight, clip_on=False, zorder=4,
                  bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5} if ground else None)
        taken.setdefault(row, []).append((centre_px - half - PAD_PX, centre_px + half + PAD_PX))

    peak_span = next((s for s in spans if run_peak is not None and s.path == run_peak.stage), None)
    if peak_span is not None:
        row = min(peak_span.depth, rows - 1)
        band.broken_barh([(peak_span.start, max(peak_span.end - peak_span.start, 1e-9))], (row + 0.08, 0.84),
                         facecolors="none", edgecolor=PEAK_COLOUR, lw=1.4, zorder=3)
        inner = (peak_span.end - peak_span.start) * per_s - 2 * PAD_PX
        name = _with_status(peak_span)
        fits = text_width(figure, name, LABEL_SIZE, "bold") <= inner
        text = shorten(figure, name, width_px - 2 * PAD_PX, LABEL_SIZE, weight="bold") or name[:1]
        place(row, ((peak_span.start + peak_span.end) / 2 - x0) * per_s, text, PEAK_COLOUR, "bold", not fits)
    elif run_peak is not None:  # the peak fell in time no stage covers: say so where it is
        covering = [s for s in spans if s.start <= run_peak.t <= s.end]
        row = min(max((s.depth + 1 for s in covering), default=0), rows - 1)
        text = shorten(figure, "peak: no stage", width_px - 2 * PAD_PX, LABEL_SIZE, weight="bold") or "peak"
        band.axvline(run_peak.t, ymin=1 - (row + 1) / rows, ymax=1 - row / rows, color=PEAK_COLOUR, lw=1.4)
        place(row, (run_peak.t - x0) * per_s, text, PEAK_COLOUR, "bold", True)

    for span in sorted(spans, key=lambda s: (-(s.end - s.start), s.start)):
        if span is peak_span:
            continue
        inner = (span.end - span.start) * per_s - 2 * PAD_PX
        if inner < MIN_LABEL_PX:
            break  # every span after this one is narrower still
        row = min(span.depth, rows - 1)
        label = _fitted(figure, span, inner)
        if label is None:
            continue
        half = text_width(figure, label, LABEL_SIZE) / 2
        centre = ((span.start + span.end) / 2 - x0) * per_s
        if any(a < centre + half + PAD_PX and centre - half - PAD_PX < b for a, b in taken.get(row, [])):
            continue  # the peak's name, written beside its narrow span, is here
        place(row, centre, label, "#333333", "normal", span.status != "ok")  # over a hatched span: a ground


def _fitted(figure, span: Span, width_px: float) -> str | None:
    """The span's name shortened to `width_px`; a staged method (`Class.method`) by its method
    alone before its name is cut, since its neighbours are mostly the same class's."""
    whole = shorten(figure, _with_status(span), width_px, LABEL_SIZE)
    method = re.fullmatch(r"[A-Z]\w*\.(\w.*)", span.label)
    if whole == _with_status(span) or method is None:
        return whole
    return shorten(figure, _with_status(span, method.group(1)), width_px, LABEL_SIZE)


def _with_status(span: Span, label: str | None = None) -> str:
    label = span.label if label is None else label
    return label if span.status == "ok" else f"{label} [{span.status}]"


def _rest(count: int) -> str:
    return f"{count} smaller one" + ("s" if count > 1 else "")
