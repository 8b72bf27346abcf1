"""The training-step report: the sweep table with its commentary and a components chart
(train_step_chart), then one section per configuration (components, activation calculator, one step against many, leak/spike/stable,
largest allocations). Everything comes from the run records (auditor.analysis.training).

    write_report(records, "reports/train-step-tinystories-33m.md", command="auditor train-step ...")
"""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from auditor import units
from auditor.analysis import training
from auditor.record_schema import RunRecord
from auditor.renderers import markdown_text as md
from auditor.renderers.markdown import environment_section, sites_section

MEASURES = tuple(training.MEASURES.items())


def write_report(records: list[tuple[RunRecord, Path]], out: str | os.PathLike, *, command: str) -> Path:
    """`records`: (run record, its run folder) per configuration, in sweep order."""
    from auditor.renderers.train_step_chart import write_png
    out = Path(out)
    chart = None
    if any(training.step_numbers(record) for record, _ in records):  # no step finished: no bars
        chart = write_png([record for record, _ in records], out.with_name(out.stem + "-components.png")).name
    out.write_text(render(records, command=command, report_folder=out.parent, chart=chart),
                   encoding="utf-8")
    return out


def render(records: list[tuple[RunRecord, Path]], *, command: str, report_folder: Path | None = None,
           chart: str | None = None) -> str:
    """The report's markdown; `chart`: the components PNG's path relative to the report."""
    only = [record for record, _ in records]
    architectures = ", ".join(dict.fromkeys(_settings(r)["architecture"] for r in only))
    parts = [f"# Training-step memory: {md.text(architectures)}", _intro(only, command),
             _sweep(only), f"![components against the measured peaks]({quote(chart)})" if chart else ""]
    for record, folder in records:
        parts.append(_configuration(record, folder, report_folder))
    parts.append(environment_section(only[0], head="## Environment (first configuration)"))
    return "\n\n".join(p for p in parts if p).rstrip() + "\n"


def _settings(record: RunRecord) -> dict:
    """The configuration the train-step job ran (its `workload` annotation)."""
    return record.annotations["workload"]["settings"]


def _intro(records: list[RunRecord], command: str) -> str:
    """`command`: what made the report, unless the records name the sweep they all came from
    (then the report made again from them reads the same)."""
    s = _settings(records[0])
    sweeps = {r.annotations["workload"].get("sweep_command") for r in records}
    if len(sweeps) == 1 and None not in sweeps:
        command = sweeps.pop()
    return (f"Produced by {md.code(command)}: each configuration ran in a fresh process on "
            f"{md.text(records[0].device)}, batch {s['batch_size']}, "
            f"{s['accumulation']} micro-batch(es) per step, {s['steps']} steps, optimizer "
            f"{md.code(s['optimizer'])}, synthetic tokens (seed {s['seed']}). Live tensors are counted "
            f"storage by storage (exact); peak RSS is the per-stage kernel high-water mark; "
            f"`forward only` is one micro-batch without autograd (inference).")


def _sweep(records: list[RunRecord]) -> str:
    rows = training.sweep_rows(records)
    measures = [(k, label) for k, label in MEASURES if any(r.get(f"step_{k}") for r in rows)]
    headers = ["architecture", "sequence", "precision"]
    for _, label in measures:
        headers += [f"forward only: peak {label}", f"full step: peak {label}"]
    headers += ["saved activations", "full step / forward only"]
    table = []
    for r, record in zip(rows, records):
        cells = [md.text(r["architecture"]), str(r["sequence_length"]), md.text(r["precision"])]
        for key, _ in measures:
            cells += [units.size(r.get(f"forward_{key}")), units.size(r.get(f"step_{key}"))]
        cells += [units.size(r["saved_activations"]),
                  units.ratio(r.get("step_live_tensors"), r.get("forward_live_tensors"))]
        if not r["complete"]:
            cells[2] += f" ({md.text(_ending(record))})"
        table.append(cells)
    right = set(range(3, len(headers)))
    commentary = training.sweep_commentary(rows)
    text = "\n".join(f"- {md.text(line)}" for line in commentary) or "- One configuration: nothing to compare."
    return ("## Peak memory: forward only against the full step\n\n"
            + md.table(headers, table, right) + "\n\n" + text)


def _configuration(record: RunRecord, folder: Path, report_folder: Path | None) -> str:
    s = _settings(record)
    result = training.study(record)
    head = f"## {md.text(s['architecture'])}, sequence {s['sequence_length']}, {md.text(s['precision'])}"
    unfinished = None if result["complete"] else _unfinished(record)
    if not result.get("components"):
        return f"{head}\n\n{unfinished}\n\nNo training step finished."
    parts = [head, unfinished, f"Run record: {md.code(folder / 'run.json')}.", _components(result),
             _calculator(result["calculator"]), _steps(record, result), _stability(result),
             _allocations(record, folder, report_folder)]
    return "\n\n".join(p for p in parts if p)


def _ending(record: RunRecord) -> str:
    """How a configuration that did not finish ended: "killed by SIGKILL: out of memory?"."""
    exit_ = record.exit
    error = (exit_.error if exit_ is not None else None) or ""
    if exit_ is not None and exit_.status == "interrupted" and not error.startswith("interrupted"):
        return f"interrupted ({error})" if error else "interrupted"
    return error or "the run did not finish"


def _unfinished(record: RunRecord) -> str:
    """The line saying the run did not finish, how it ended and which stages finished."""
    done = [s.path for s in record.stages if s.status == "ok" and s.parent is None]
    cut = [s.path for s in record.stages if s.status != "ok"]
    return (f"**This configuration did not finish: {md.text(_ending(record))}.** Finished stages: "
            f"{', '.join(md.code(p) for p in done) or 'none'}"
            + (f"; cut short: {', '.join(md.code(p) for p in cut)}" if cut else "") + ".")


def _components(result: dict) -> str:
    rows = []
    for row in result["components"]:
        exact = "-" if row["exact"] is None else ("yes, to the byte" if row["exact"] else "**no**")
        rows.append([md.text(row["name"]), units.size(row["measured"]), f"{row['measured']:,}",
                     f"{row['expected']:,}" if row["expected"] is not None else "-", exact,
                     md.text(row["how"])])
    check = result["activation_check"]
    line = ""
    if check:
        verdict = "within" if check["within_tolerance"] else "**outside**"
        line = (f"\n\nSaved-tensor accounting: {units.size(check['saved'])} ({check['saved']:,} B); "
                f"live tensors the first forward left behind: {units.size(check['live_growth'])} "
                f"({check['live_growth']:,} B); difference {check['difference']:+,} B "
                f"({check['relative']:+.3%}), {verdict} the {check['tolerance']:.0%} tolerance "
                f"(the input ids and the loss account for the rest).")
    return ("### Components of one step\n\n"
            + md.table(["component", "size", "bytes", "expected from the config", "equal", "how"],
                     rows, right={1, 2, 3}) + line)


def _calculator(calc: dict | None) -> str:
    if not calc:
        return ""
    if "unavailable" in calc:
        return ("### Activation size from the config\n\n"
                f"No formula for this model: {md.text(calc['unavailable'])}.")
    per_layer = calc["saved"]["per_layer"]
    measured = calc["measured_layers"]
    same = all(m == calc["computed_per_layer"] for m in measured)
    return ("### Activation size from the config\n\n"
            f"One residual-stream tensor: {md.text(calc['residual_stream']['derivation'])}.\n\n"
            f"Saved for backward by one decoder layer ({md.text(per_layer['family'])}):\n\n"
            f"```\n{per_layer['derivation']}\n```\n\n"
            f"Measured by the saved-tensor hooks per layer: "
            f"{', '.join(f'{m:,}' for m in measured)} B "
            f"({'equal to' if same else 'against'} the computed {calc['computed_per_layer']:,} B). "
            f"Whole model: computed {units.size(calc['computed_total'])} ({calc['computed_total']:,} B), "
            f"measured {units.size(calc['measured_total'])} ({calc['measured_total']:,} B)."
            + (f" Autocast weight copies: computed {calc['computed_weight_copies']:,} B, measured "
               f"{calc['measured_weight_copies']:,} B." if calc["computed_weight_copies"] else "")
            + "\n\n"
            f"```\n{calc['saved']['derivation']}\n```")


def _steps(record: RunRecord, result: dict) -> str:
    series = result["series"]
    keys = [(k, label) for k, label in MEASURES if series.get(k)]
    rows = []
    for index, number in enumerate(result["steps"]):
        cells = [str(number)] + [units.size(series[k][index]) for k, _ in keys]
        cells.append(md.code(training.peak_stage_name(record, number)))
        rows.append(cells)
    table = md.table(["step"] + [f"peak {label}" for _, label in keys] + ["stage of the live-tensor peak"],
                   rows, right=set(range(1, len(keys) + 1)))
    side = md.table(["measure", "one-step breakdown (components summed)", "step 1 peak",
                   f"peak over {len(result['steps'])} steps"],
                  [[r["measure"], units.size(r["summed"]), units.size(r["first_step"]),
                    units.size(r["all_steps"])] for r in result["one_against_many"]], right={1, 2, 3})
    lines = "\n".join(f"- {md.text(line)}" for line in result["explanations"])
    return f"### One step against many\n\n{side}\n\nStep by step:\n\n{table}\n\n{lines}"


def _stability(result: dict) -> str:
    lines = [f"- {training.MEASURES[key]}: **{verdict['verdict']}**. {md.text(verdict['evidence'])}"
             for key, verdict in result["stability"].items()]
    return "### Leak, spike or stable\n\n" + "\n".join(lines)


def _allocations(record: RunRecord, folder: Path, report_folder: Path | None) -> str:
    parts = [sites_section(record, report_folder, folder, head="### Largest allocations at the peak")]
    history = (record.files or {}).get("cuda_history")
    if history:
        target = Path(folder) / history
        link = md.relative_link(target, report_folder) if report_folder is not None else str(target)
        parts.append(f"CUDA allocation history for https://pytorch.org/memory_viz, allocations labelled "
                     f"with their stage (`step K/forward`, `backward`, `optimizer`): [{md.text(history)}]({link}).")
    return "\n\n".join(parts)
