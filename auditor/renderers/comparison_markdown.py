"""The comparison report (markdown): the verdict, per side min/median/max, the ratios and
agreement against the baseline, the chart, the exact commands, every run in the order it ran,
and the machine with its load. It formats auditor.report_models.comparison's model, made
from the comparison record and its summary alone.
"""
from __future__ import annotations

from urllib.parse import quote  # a name with spaces stays one link

from auditor.facts.units import GiB, MiB
from auditor.renderers import markdown_text as md
from auditor.report_models.comparison import (
    ComparisonReport,
    Environment,
    Reported,
    Scalar,
    Spread,
    Variant,
)

DIGEST_CHARS = 12


def render(report: ComparisonReport, chart: str | None = None) -> str:
    """`chart`: the chart PNG's path relative to the markdown file, or None for no chart."""
    out: list[str] = [f"# Comparison: {report.name}", ""]
    out += _verdict(report) + [""]
    out += _setting(report) + [""]
    out += ["## Memory and time per side", "",
            "min / median / max over the runs of each side; MiB and seconds. *Peak over loaded* is "
            "each run's peak RSS minus its RSS once its inputs were loaded: the algorithm's own "
            "overhead.", ""]
    out += _per_side(report) + [""]
    if chart:
        out += [f"![median peak RSS split into loaded and overhead, with min-max whiskers; wall time]({_link(chart)})",
                ""]
    out += ["## Against the baseline", ""] + _against(report) + [""]
    out += _commands(report) + [""]
    out += ["## Runs, in the order they ran", ""] + _runs(report) + [""]
    reported = _reported(report.reported)
    if reported:
        out += ["## Reported by the runs (first run of each side)", ""] + reported + [""]
    out += ["## Environment", ""] + _environment(report.environment)
    return "\n".join(out).rstrip() + "\n"


def _verdict(report: ComparisonReport) -> list[str]:
    if report.failed:
        head = ("**Verdict: FAIL.** A variant claims a saving but its result differs from the "
                "baseline's beyond its tolerance (or gives none while one is required).")
    else:
        head = ("**Verdict: pass.** No variant claims a saving with a result that differs beyond "
                "its tolerance.")
    lines = [head, ""]
    for variant in report.variants:
        lines.append(f"- **{variant.name}** ({'FAIL' if variant.failed else 'ok'}): {variant.why}.")
    if report.rule:
        lines += ["", f"How a saving is counted: {report.rule}"]
    repeats = report.baseline_repeats
    if repeats is not None and repeats.disagree:
        lines.append(f"- note: the baseline's own repeats disagree ({repeats.reason}): its "
                     f"result is not deterministic, so differences may not be the variants'.")
    return lines


def _setting(report: ComparisonReport) -> list[str]:
    env, setting = report.environment, report.setting
    cpus = env.cpus
    libraries = ", ".join(f"{name} {version}" for name, version in env.libraries.items() if version)
    lines = [f"Measured {setting.created_at} on {env.cpu or 'an unknown CPU'} ({cpus} usable CPUs"
             + (f", {env.memory_total / GiB:,.0f} GiB" if env.memory_total else "") + f"), "
             f"Python {env.python}, {libraries}. {setting.repeats} run{'s' * (setting.repeats != 1)} per side, "
             f"alternating "
             f"({' -> '.join(setting.order)}, then again), each a fresh process; "
             f"its peak RSS is the kernel's high-water mark for that process alone (`ru_maxrss` from "
             f"`wait4`).", "",
             f"Load average (1 / 5 / 15 min) at the start {_load(env.load_start)}"
             + (f", at the end {_load(env.load_end)}" if env.load_end else "")
             + f", on {cpus} CPUs (the runs themselves add about one to it)."]
    if setting.busy:
        lines[-1] += (" Other work was running: wall and CPU times are noisy (compare them "
                      "between sides of the same round, not with other reports); peak RSS is each "
                      "process's own and does not depend on the load.")
    return lines


def _per_side(report: ComparisonReport) -> list[str]:
    rows = [["side", "runs", "peak RSS", "loaded", "peak over loaded", "wall time", "CPU time"]]
    for s in report.sides:
        rows.append([s.name + (" (baseline)" if s.marked_baseline else ""), str(s.runs),
                     _spread(s.peak_rss, MiB), _spread(s.loaded_rss, MiB), _spread(s.overhead, MiB),
                     _spread(s.wall_s, 1, 2), _spread(s.cpu_s, 1, 2)])
    return _aligned(rows, right=range(1, 7))


def _against(report: ComparisonReport) -> list[str]:
    rows = [["variant", "peak ratio", "overhead ratio", "wall ratio", "CPU ratio", "peak saving",
             "overhead saving", "noise margin",
             "saving beyond noise", "same digest", "differing elements", "tolerance", "agreement", "verdict"]]
    for v in report.variants:
        differing = "-" if v.differing_elements is None else (
            f"{v.differing_elements:,}" + (f" of {v.total_elements:,}" if v.total_elements else ""))
        tolerance = v.tolerance + ("" if v.tolerance_source == "default" else f" ({v.tolerance_source})")
        rows.append([v.name, _ratio(v.peak_ratio), _ratio(v.overhead_ratio),
                     _ratio(v.wall_ratio), _ratio(v.cpu_ratio),
                     _mib(v.peak_saving), _mib(v.overhead_saving), _mib(v.noise_margin),
                     _beyond_noise(v),
                     {True: "yes", False: "no", None: "-"}[v.same_digest], differing, tolerance, v.agreement,
                     "**FAIL**" if v.failed else "ok"])
    lines = _aligned(rows, right=range(1, 8))
    lines += ["", "Ratios are variant / baseline of the medians (below 1: the variant uses less; time ratios "
              "come from the same alternating round, so from the same load). A saving "
              "is the baseline's median minus the variant's, in MiB; it counts only beyond the noise "
              "margin (see the rule under the verdict)."]
    repeats = report.baseline_repeats
    if repeats is not None:
        lines += ["", f"The baseline's own repeats against its first run: {repeats.status} "
                      f"({repeats.reason})."]
    return lines


def _beyond_noise(variant: Variant) -> str:
    if variant.noise is None:
        return "yes" if variant.claims_saving else "no"
    return {"saves": "yes", "uses more": "no: uses more", "within noise": "no: within noise",
            "cannot tell": "cannot tell"}[variant.noise]


def _commands(report: ComparisonReport) -> list[str]:
    commands = report.commands
    lines = ["## Commands", "", "```"]
    if commands.command is not None:
        lines.append(commands.command)
        lines.append("")
    width = max(len(name) for name, _ in commands.sides)
    for name, command in commands.sides:
        lines.append(f"{name:<{width}}  {command}")
    lines += ["```", "", "`{run_dir}` is each run's own empty folder. Every run's result is compared "
              f"with the reference, {commands.reference}."]
    return lines


def _runs(report: ComparisonReport) -> list[str]:
    rows = [["#", "side", "run", "started (UTC)", "load 1 min", "peak RSS", "loaded", "over loaded",
             "wall s", "CPU s", "result digest", "differing elements"]]
    for run in report.runs:
        rows.append([str(run.order), run.side, str(run.repeat), run.started_at[11:19],
                     f"{run.load_1min:.2f}", _mib(run.peak_rss), _mib(run.loaded_rss),
                     _mib(run.overhead), f"{run.wall_s:.2f}", _optional(run.cpu_s, ".2f"),
                     "-" if run.digest is None else f"`{run.digest[:DIGEST_CHARS]}`",
                     "-" if run.differing_elements is None else f"{run.differing_elements:,}"])
    return _aligned(rows, right=[0, 2, 4, 5, 6, 7, 8, 9, 11])


def _reported(reported: Reported) -> list[str]:
    """Scalar fields each side reported about itself (its first run), one row per field."""
    if not reported.fields:
        return []
    rows = [["field", *reported.sides]]
    for field in reported.fields:
        rows.append([field.name + (" (MiB)" if field.in_bytes else ""),
                     *[_value(value, field.in_bytes) for value in field.values]])
    return _aligned(rows, right=range(1, len(reported.sides) + 1))


def _environment(env: Environment) -> list[str]:
    lines = [f"- Python {env.python} ({env.executable}), {env.platform}",
             f"- CPU: {env.cpu}, {env.cpu_count} CPUs ({env.cpus_usable} usable)"]
    if env.memory_total:
        lines.append(f"- memory: {env.memory_total / GiB:,.1f} GiB")
    lines.append("- libraries: " + ", ".join(f"{k} {v or 'not installed'}" for k, v in env.libraries.items()))
    if env.thread_variables:
        lines.append("- thread settings: " + ", ".join(f"{k}={v}" for k, v in env.thread_variables.items()))
    lines.append(f"- load average at the start {_load(env.load_start)}"
                 + (f", at the end {_load(env.load_end)}" if env.load_end else ""))
    return lines


# -- formatting ------------------------------------------------------------------------------

def _spread(spread: Spread | None, unit: float, digits: int = 1) -> str:
    if spread is None:
        return "-"
    return " / ".join(f"{value / unit:,.{digits}f}" for value in (spread.min, spread.median, spread.max))


def _mib(value) -> str:
    return "-" if value is None else f"{value / MiB:,.1f}"


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _optional(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _load(values) -> str:
    return " / ".join(f"{value:.2f}" for value in values)


def _value(value: Scalar, in_mib: bool = False) -> str:
    if value is None:
        return "-"
    if in_mib and isinstance(value, (int, float)) and not isinstance(value, bool):
        return _mib(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.1f}"
    return str(value)


def _aligned(rows: list[list[str]], right=()) -> list[str]:
    """The header row and the rows as a padded table, as lines."""
    return md.table(rows[0], rows[1:], right, aligned=True).split("\n")


def _link(name: str) -> str:
    """A link to a file by its name's own bytes (a name that is not UTF-8 too)."""
    return quote(name, errors="surrogateescape")
