"""The training-step report: the sweep table with its commentary and a components chart
(train_step_chart), then one section per configuration (components, activation calculator, one
step against many, leak/spike/stable, largest allocations). What it says is computed once from
the run records by auditor.report_models.train_step (`train_step_report(records)`), before it
is handed here; this module only formats it.

    write(train_step_report(records), "reports/train-step-tinystories-33m.md", folders=folders,
          command="auditor train-step ...")
"""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from auditor.facts import safe_files, units
from auditor.renderers import markdown_text as md
from auditor.renderers.markdown import environment_section
from auditor.renderers.sites_markdown import section as sites_section
from auditor.report_models.train_step import (
    MEASURES,
    Calculator,
    Configuration,
    Intro,
    NoFormula,
    Study,
    Sweep,
    TrainStepReport,
    Unfinished,
)


def write(report: TrainStepReport, out: str | os.PathLike, *, folders: list[Path], command: str) -> Path:
    """The markdown to `out` and its components chart beside it; `folders`: each configuration's
    run folder, in sweep order."""
    from auditor.renderers import train_step_chart
    out = Path(out)
    chart = None
    if any(c.study is not None for c in report.configurations):  # no step finished: no bars
        chart = train_step_chart.render(report, out.with_name(out.stem + "-components.png")).name
    safe_files.write_text(out, render(report, folders=folders, command=command, report_folder=out.parent,
                                      chart=chart))
    return out


def render(report: TrainStepReport, *, folders: list[Path], command: str,
           report_folder: Path | None = None, chart: str | None = None) -> str:
    """The report's markdown; `folders`: each configuration's run folder; `chart`: the
    components PNG's path relative to the report."""
    parts = [f"# Training-step memory: {md.text(', '.join(report.architectures))}",
             _intro(report.intro, command), _sweep(report.sweep),
             f"![components against the measured peaks]({quote(chart, errors='surrogateescape')})" if chart else ""]
    for configuration, folder in zip(report.configurations, folders, strict=False):
        parts.append(_configuration(configuration, folder, report_folder))
    parts.append(environment_section(report.environment, head="## Environment (first configuration)"))
    return "\n\n".join(p for p in parts if p).rstrip() + "\n"


def _intro(intro: Intro, command: str) -> str:
    """`command`: what made the report, unless the records name the sweep they all came from
    (then the report made again from them reads the same)."""
    command = intro.sweep_command or command
    return (f"Produced by {md.code(command)}: each configuration ran in a fresh process on "
            f"{md.text(intro.device)}, batch {intro.batch_size}, "
            f"{intro.accumulation} micro-batch(es) per step, {intro.steps} steps, optimizer "
            f"{md.code(intro.optimizer)}, synthetic tokens (seed {intro.seed}). Live tensors are counted "
            f"storage by storage (exact); peak RSS is the per-stage kernel high-water mark; "
            f"`forward only` is one micro-batch without autograd (inference).")


def _sweep(sweep: Sweep) -> str:
    rows = sweep.rows
    measures = [(k, label) for k, label in MEASURES.items() if any(r.step.get(k) for r in rows)]
    headers = ["architecture", "sequence", "precision"]
    for _, label in measures:
        headers += [f"forward only: peak {label}", f"full step: peak {label}"]
    headers += ["saved activations", "full step / forward only"]
    table = []
    for r in rows:
        cells = [md.text(r.architecture), str(r.sequence_length), md.text(r.precision)]
        for key, _ in measures:
            cells += [units.size(r.forward.get(key)), units.size(r.step.get(key))]
        cells += [units.size(r.saved_activations),
                  units.ratio(r.step.get("live_tensors"), r.forward.get("live_tensors"))]
        if r.ending is not None:
            cells[2] += f" ({md.text(r.ending)})"
        table.append(cells)
    right = set(range(3, len(headers)))
    text = "\n".join(f"- {md.text(line)}" for line in sweep.commentary) or "- One configuration: nothing to compare."
    return ("## Peak memory: forward only against the full step\n\n"
            + md.table(headers, table, right) + "\n\n" + text)


def _configuration(configuration: Configuration, folder: Path, report_folder: Path | None) -> str:
    c = configuration
    head = f"## {md.text(c.architecture)}, sequence {c.sequence_length}, {md.text(c.precision)}"
    unfinished = _unfinished(c.unfinished) if c.unfinished is not None else None
    study = c.study
    if study is None:
        return f"{head}\n\n{unfinished}\n\nNo training step finished."
    parts = [head, unfinished, f"Run record: {md.code(folder / 'run.json')}.", _components(study),
             _calculator(study.calculator), _steps(study), _stability(study),
             _allocations(c, folder, report_folder)]
    return "\n\n".join(p for p in parts if p)


def _unfinished(unfinished: Unfinished) -> str:
    """The line saying the run did not finish, how it ended and which stages finished."""
    cut = unfinished.cut
    return (f"**This configuration did not finish: {md.text(unfinished.ending)}.** Finished stages: "
            f"{', '.join(md.code(p) for p in unfinished.finished) or 'none'}"
            + (f"; cut short: {', '.join(md.code(p) for p in cut)}" if cut else "") + ".")


def _components(study: Study) -> str:
    rows = []
    for row in study.components:
        exact = "-" if row.exact is None else ("yes, to the byte" if row.exact else "**no**")
        rows.append([md.text(row.name), units.size(row.measured), f"{row.measured:,}",
                     f"{row.expected:,}" if row.expected is not None else "-", exact,
                     md.text(row.how)])
    check = study.activation_check
    line = ""
    if check:
        verdict = "within" if check.within_tolerance else "**outside**"
        line = (f"\n\nSaved-tensor accounting: {units.size(check.saved)} ({check.saved:,} B); "
                f"live tensors the first forward left behind: {units.size(check.live_growth)} "
                f"({check.live_growth:,} B); difference {check.difference:+,} B "
                f"({check.relative:+.3%}), {verdict} the {check.tolerance:.0%} tolerance "
                f"(the input ids and the loss account for the rest).")
    return ("### Components of one step\n\n"
            + md.table(["component", "size", "bytes", "expected from the config", "equal", "how"],
                     rows, right={1, 2, 3}) + line)


def _calculator(calc: Calculator | NoFormula | None) -> str:
    if calc is None:
        return ""
    if isinstance(calc, NoFormula):
        return ("### Activation size from the config\n\n"
                f"No formula for this model: {md.text(calc.why)}.")
    measured = calc.measured_layers
    same = all(m == calc.computed_per_layer for m in measured)
    return ("### Activation size from the config\n\n"
            f"One residual-stream tensor: {md.text(calc.residual_stream)}.\n\n"
            f"Saved for backward by one decoder layer ({md.text(calc.layer_family)}):\n\n"
            f"```\n{calc.layer_derivation}\n```\n\n"
            f"Measured by the saved-tensor hooks per layer: "
            f"{', '.join(f'{m:,}' for m in measured)} B "
            f"({'equal to' if same else 'against'} the computed {calc.computed_per_layer:,} B). "
            f"Whole model: computed {units.size(calc.computed_total)} ({calc.computed_total:,} B), "
            f"measured {units.size(calc.measured_total)} ({calc.measured_total:,} B)."
            + (f" Autocast weight copies: computed {calc.computed_weight_copies:,} B, measured "
               f"{calc.measured_weight_copies:,} B." if calc.computed_weight_copies else "")
            + "\n\n"
            f"```\n{calc.whole_derivation}\n```")


def _steps(study: Study) -> str:
    series = study.series
    keys = [(k, label) for k, label in MEASURES.items() if series.get(k)]
    rows = []
    for index, number in enumerate(study.steps):
        cells = [str(number)] + [units.size(series[k][index]) for k, _ in keys]
        cells.append(md.code(study.peak_stages[index]))
        rows.append(cells)
    table = md.table(["step"] + [f"peak {label}" for _, label in keys] + ["stage of the live-tensor peak"],
                   rows, right=set(range(1, len(keys) + 1)))
    side = md.table(["measure", "one-step breakdown (components summed)", "step 1 peak",
                   f"peak over {len(study.steps)} steps"],
                  [[r.measure, units.size(r.summed), units.size(r.first_step),
                    units.size(r.all_steps)] for r in study.one_against_many], right={1, 2, 3})
    lines = "\n".join(f"- {md.text(line)}" for line in study.explanations)
    return f"### One step against many\n\n{side}\n\nStep by step:\n\n{table}\n\n{lines}"


def _stability(study: Study) -> str:
    lines = [f"- {s.measure}: **{s.verdict}**. {md.text(s.evidence)}" for s in study.stability]
    return "### Leak, spike or stable\n\n" + "\n".join(lines)


def _allocations(configuration: Configuration, folder: Path, report_folder: Path | None) -> str:
    parts = [sites_section(configuration.sites, report_folder, folder, head="### Largest allocations at the peak")]
    history = configuration.cuda_history
    if history:
        target = Path(folder) / history
        link = md.relative_link(target, report_folder) if report_folder is not None else str(target)
        parts.append(f"CUDA allocation history for https://pytorch.org/memory_viz, allocations labelled "
                     f"with their stage (`step K/forward`, `backward`, `optimizer`): [{md.text(history)}]({link}).")
    return "\n\n".join(parts)
