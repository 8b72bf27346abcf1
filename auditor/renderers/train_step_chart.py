"""The training-step sweep as a PNG: per configuration, the components of one step stacked, with
the measured full-step and forward-only peaks of live tensors marked beside them (matplotlib,
a bare Agg figure: no pyplot, no display), drawn from the report's model
(auditor.report_models.train_step)."""
from __future__ import annotations

from pathlib import Path

from auditor.facts import safe_files, units
from auditor.renderers.plot_text import fit_title
from auditor.report_models.train_step import Configuration, TrainStepReport

COLOURS = {"parameters": "#4c72b0", "gradients": "#dd8452", "optimizer state": "#55a868",
           "saved activations": "#c44e52", "autocast weight copies": "#8172b3",
           "model buffers": "#937860", "temporaries": "#da8bc3"}


def render(report: TrainStepReport, path: str | Path) -> Path:
    path = Path(path)
    with safe_files.replaced(path, "wb") as file:  # a link planted at `path` is replaced, never followed
        draw(report).savefig(file, format=path.suffix[1:] or "png")
    return path


def draw(report: TrainStepReport):
    """The chart as a matplotlib Figure (Agg canvas), its title wrapped to the figure's width."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    shown = [(c, c.study) for c in report.configurations if c.study is not None]  # a step finished
    figure = Figure(figsize=(max(6.0, 1.3 * len(shown) + 3), 4.8), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    labelled: set[str] = set()
    for x, (_, study) in enumerate(shown):
        bottom = 0.0
        for row in study.components:
            height = (row.measured or 0) / units.MiB
            axes.bar(x, height, bottom=bottom, width=0.6, color=COLOURS.get(row.name, "#999999"),
                     label=None if row.name in labelled else row.name)
            labelled.add(row.name)
            bottom += height
        peaks = study.forward_only.get("live_tensors")
        full_step, forward_only = (peaks.full_step, peaks.forward_only) if peaks is not None else (0, 0)
        axes.plot([x - 0.35, x + 0.35], [full_step / units.MiB] * 2, color="black",
                  lw=2, label="full-step peak" if x == 0 else None)
        axes.plot([x - 0.35, x + 0.35], [forward_only / units.MiB] * 2, color="black",
                  lw=1.5, ls="--", label="forward-only peak" if x == 0 else None)
    axes.set_xticks(range(len(shown)), [_label(c) for c, _ in shown], fontsize=8)
    axes.set_ylabel("MiB (live tensors)")
    fit_title(figure, axes.set_title, "Components of one training step (stacked) against the measured peaks",
              fontsize=11, share=0.9)
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return figure


def _label(configuration: Configuration) -> str:
    c = configuration
    return f"{c.architecture}\nseq {c.sequence_length}\n{c.precision}"
