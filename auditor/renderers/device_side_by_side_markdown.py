"""The CPU-against-CUDA report of one GradProbe configuration, in markdown
(auditor.report_models.device_side_by_side is what it says; this is how it reads).

    text = render(report, command="python benchmarks/cuda_side_by_side.py ...")
"""
from __future__ import annotations

from pathlib import PurePath

from auditor.facts.units import mib
from auditor.renderers import markdown_text as md
from auditor.report_models.device_side_by_side import DeviceMasks, DeviceRun, DeviceSideBySide


def render(report: DeviceSideBySide, command: str | None = None) -> str:
    config = report.configuration
    lines = [f"# GradProbe side by side on {_devices(report)}: {config.get('architecture')}", ""]
    lines += [_answer(report), ""]
    if command:
        lines += [f"Made by `{command}` from the run records alone (each run by `auditor gradprobe "
                  f"--device DEVICE --variant VARIANT` with the configuration below).", ""]
    lines += [f"Configuration shared by every run: {_configuration(config)}.", ""]
    if report.problems:
        lines += ["**Read with care:**", "", *[f"- {md.text(problem)}" for problem in report.problems], ""]
    lines += ["## Memory and time", "", _runs_table(report.runs), ""]
    lines += ["Peak RSS is the process's highest resident memory (host RAM; a CUDA run's includes the CUDA "
              "context and libraries). CUDA peak allocated is the most the caching allocator handed to "
              "tensors in any stage; reserved is the most it held from the driver at a stage end (freed "
              "blocks it keeps for reuse count there, not in allocated). Times are wall clock: the `prune` "
              "stage, then the whole audited run (model building included).", ""]
    lines += ["## Masks", "", *[_masks_line(masks) for masks in report.devices], _across_line(report), ""]
    projected = _projection_table(report.runs)
    if projected:
        lines += ["## Projections made from each run", "",
                  "The projected peak live tensors each run's record holds (the traced projection runs "
                  "the program on fake tensors at the target's sizes).", "", projected, ""]
    lines += ["## What ran each side", "", *[f"- {md.code(device)}: {md.text(what)}"
                                              for device, what in report.environment.items()], ""]
    lines += ["Run records:", "", *[f"- {run.device}, {run.variant}: {md.code(run.source)}" for run in report.runs]]
    return "\n".join(lines) + "\n"


def _devices(report: DeviceSideBySide) -> str:
    return " and ".join(dict.fromkeys(run.device for run in report.runs))


def _answer(report: DeviceSideBySide) -> str:
    """The lead: the peaks of the baseline on each device, and whether masks agree."""
    parts = []
    for device in dict.fromkeys(run.device for run in report.runs):
        runs = [run for run in report.runs if run.device == device]
        peaks = ", ".join(f"{run.variant} {_peak_phrase(run)}" for run in runs)
        parts.append(f"on {device}: {peaks}")
    masks = "; ".join(f"masks {_identical_word(m.identical)} within {m.device}" for m in report.devices)
    return "**" + "; ".join(parts) + ".** " + masks[0].upper() + masks[1:] + "."


def _peak_phrase(run: DeviceRun) -> str:
    if run.cuda_peak_allocated is not None:
        return f"{mib(run.cuda_peak_allocated)} CUDA peak allocated ({mib(run.peak_rss)} peak RSS)"
    return f"{mib(run.peak_rss)} peak RSS"


def _identical_word(identical: bool | None) -> str:
    return {True: "identical", False: "DIFFER", None: "not compared"}[identical]


def _configuration(config: dict) -> str:
    overrides = config.get("overrides") or {}
    sized = ", ".join(f"{k} {v}" for k, v in overrides.items())
    return (f"{config.get('architecture')}" + (f" ({sized})" if sized else "")
            + f", {config.get('strategy')} scoring, sequence {config.get('sequence_length')} x batch "
              f"{config.get('batch_size')}, {config.get('batches')} calibration batches, sparsity "
              f"{config.get('sparsity')}, reduction {config.get('reduction')}, threshold "
              f"{config.get('threshold')}, seed {config.get('seed')}")


def _runs_table(runs: list[DeviceRun]) -> str:
    headers = ["run", "device", "variant", "peak RSS", "peak RSS in", "CUDA peak allocated", "CUDA reserved (most)",
               "CUDA allocated at end", "prune", "whole run", "pruned", "mask digest"]
    rows = [[md.code(PurePath(run.source).name), md.text(run.device), md.text(run.variant), mib(run.peak_rss),
             md.code(run.peak_place or "-"),
             _cuda(run, run.cuda_peak_allocated), _cuda(run, run.cuda_reserved), _cuda(run, run.cuda_allocated_end),
             _seconds(run.prune_s), _seconds(run.duration_s), "-" if run.pruned is None else f"{run.pruned:,}",
             md.code(run.mask_digest[:12]) if run.mask_digest else "not recorded"] for run in runs]
    return md.table(headers, rows, right=[3, 5, 6, 7, 8, 9, 10])


def _cuda(run: DeviceRun, value: int | None) -> str:
    if value is None:
        return "no CUDA" if run.side == "cpu" else "not read"
    return mib(value)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f} s"


def _masks_line(masks: DeviceMasks) -> str:
    variants = ", ".join(masks.variants)
    if masks.identical is None:
        return (f"- {masks.device}: not compared: {', '.join(masks.missing)} recorded no mask digest "
                f"(runs: {variants}).")
    if masks.identical:
        return f"- {masks.device}: identical: {variants} pruned the same weights (one digest)."
    return f"- {masks.device}: **DIFFER**: {variants} gave {masks.digests} different masks."


def _across_line(report: DeviceSideBySide) -> str:
    if report.across_devices is None:
        return "- across devices: not compared (one device, or a run without a digest)."
    if report.across_devices:
        return "- across devices: identical, every run on every device pruned the same weights."
    return ("- across devices: different masks. Expected to be possible: CUDA kernels add gradients in "
            "another order than the CPU's, so a weight near the threshold can fall either side; only the "
            "agreement within a device is a property of the variants.")


def _projected(run: DeviceRun, method: str) -> str:
    caveat = run.projection_caveats.get(method)  # its first words in the cell, in full below the table
    return mib(run.projected_peak.get(method)) + (f" ({md.text(caveat.split(':')[0])})" if caveat else "")


def _projection_table(runs: list[DeviceRun]) -> str:
    methods = list(dict.fromkeys(key for run in runs for key in run.projected_peak))
    if not methods:
        return ""
    rows = [[md.text(run.device), md.text(run.variant), *[_projected(run, m) for m in methods]] for run in runs]
    table = md.table(["device", "variant", *[f"{md.text(m)}: peak live tensors" for m in methods]], rows,
                     right=range(2, 2 + len(methods)))
    caveats = dict.fromkeys(c for run in runs for c in run.projection_caveats.values())
    return "\n\n".join([table, *[f"({md.text(caveat.split(':')[0])}) {md.text(caveat)}" for caveat in caveats]])
