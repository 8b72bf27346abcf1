"""The training-step sweep as a PNG: per configuration, the components of one step stacked, with
the measured full-step and forward-only peaks of live tensors marked beside them (matplotlib,
a bare Agg figure: no pyplot, no display)."""
from __future__ import annotations

from pathlib import Path

from auditor import units
from auditor.analysis import training
from auditor.record_schema import RunRecord

COLOURS = {"parameters": "#4c72b0", "gradients": "#dd8452", "optimizer state": "#55a868",
           "saved activations": "#c44e52", "autocast weight copies": "#8172b3",
           "model buffers": "#937860", "temporaries": "#da8bc3"}


def write_png(records: list[RunRecord], path: str | Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    studies = [training.study(r) for r in records]
    shown = [(r, s) for r, s in zip(records, studies) if s.get("components")]
    figure = Figure(figsize=(max(6.0, 1.3 * len(shown) + 3), 4.8), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    labelled: set[str] = set()
    for x, (record, study) in enumerate(shown):
        bottom = 0.0
        for row in study["components"]:
            height = (row["measured"] or 0) / units.MiB
            axes.bar(x, height, bottom=bottom, width=0.6, color=COLOURS.get(row["name"], "#999999"),
                     label=None if row["name"] in labelled else row["name"])
            labelled.add(row["name"])
            bottom += height
        peaks = study["forward_only"].get("live_tensors") or {}
        axes.plot([x - 0.35, x + 0.35], [peaks.get("full_step", 0) / units.MiB] * 2, color="black",
                  lw=2, label="full-step peak" if x == 0 else None)
        axes.plot([x - 0.35, x + 0.35], [peaks.get("forward_only", 0) / units.MiB] * 2, color="black",
                  lw=1.5, ls="--", label="forward-only peak" if x == 0 else None)
    axes.set_xticks(range(len(shown)), [_label(r) for r, _ in shown], fontsize=8)
    axes.set_ylabel("MiB (live tensors)")
    axes.set_title("Components of one training step (stacked) against the measured peaks")
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    figure.savefig(path)
    return Path(path)


def _label(record: RunRecord) -> str:
    s = record.annotations["workload"]["settings"]
    return f"{s['architecture']}\nseq {s['sequence_length']}\n{s['precision']}"
