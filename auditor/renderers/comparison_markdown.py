"""The comparison report (markdown), from the comparison record and its summary alone:
the verdict, per side min/median/max, the ratios and agreement against the baseline, the
chart, the exact commands, every run in the order it ran, and the machine with its load.
"""
from __future__ import annotations

import os
import shlex
from urllib.parse import quote  # a name with spaces stays one link

from auditor.analysis.source_paths import shown_command
from auditor.renderers import markdown_text as md

MiB, GiB = 1 << 20, 1 << 30
DIGEST_CHARS = 12


def render(record: dict, summary: dict, chart: str | None = None) -> str:
    """`chart`: the chart PNG's path relative to the markdown file, or None for no chart."""
    out: list[str] = [f"# Comparison: {record['name']}", ""]
    out += _verdict(summary) + [""]
    out += _setting(record) + [""]
    out += ["## Memory and time per side", "",
            "min / median / max over the runs of each side; MiB and seconds. *Peak over loaded* is "
            "each run's peak RSS minus its RSS once its inputs were loaded: the algorithm's own "
            "overhead.", ""]
    out += _per_side(record, summary) + [""]
    if chart:
        out += [f"![median peak RSS split into loaded and overhead, with min-max whiskers; wall time]({quote(chart)})",
                ""]
    out += ["## Against the baseline", ""] + _against(summary) + [""]
    out += _commands(record) + [""]
    out += ["## Runs, in the order they ran", ""] + _runs(record) + [""]
    reported = _reported(record)
    if reported:
        out += ["## Reported by the runs (first run of each side)", ""] + reported + [""]
    out += ["## Environment", ""] + _environment(record)
    return "\n".join(out).rstrip() + "\n"


def _verdict(summary: dict) -> list[str]:
    if summary["failed"]:
        head = ("**Verdict: FAIL.** A variant claims a saving but its result differs from the "
                "baseline's beyond its tolerance (or gives none while one is required).")
    else:
        head = ("**Verdict: pass.** No variant claims a saving with a result that differs beyond "
                "its tolerance.")
    lines = [head, ""]
    for variant in summary["variants"]:
        mark = "FAIL" if variant["verdict"] == "fail" else "ok"
        lines.append(f"- **{variant['name']}** ({mark}): {variant['why']}.")
    if summary.get("rule"):
        lines += ["", f"How a saving is counted: {summary['rule']}"]
    repeatable = summary["baseline_repeatable"]
    if repeatable is not None and repeatable["status"] not in ("identical", "unknown"):
        lines.append(f"- note: the baseline's own repeats disagree ({repeatable['reason']}): its "
                     f"result is not deterministic, so differences may not be the variants'.")
    return lines


def _setting(record: dict) -> list[str]:
    env = record["environment"]
    start, end = env["load_average_start"], env.get("load_average_end")
    cpus = env.get("cpus_usable") or env.get("cpu_count")
    busy = start[0] / max(1, cpus or 1)  # at the start: later readings include the runs themselves
    libraries = ", ".join(f"{name} {version}" for name, version in env["libraries"].items() if version)
    lines = [f"Measured {record['created_at']} on {env.get('cpu') or 'an unknown CPU'} ({cpus} usable CPUs"
             + (f", {env['memory_total'] / GiB:,.0f} GiB" if env.get("memory_total") else "") + f"), "
             f"Python {env['python']}, {libraries}. {record['repeats']} runs per side, alternating "
             f"({' -> '.join(side['name'] for side in record['sides'])}, then again), each a fresh process; "
             f"its peak RSS is the kernel's high-water mark for that process alone (`ru_maxrss` from "
             f"`wait4`).", "",
             f"Load average (1 / 5 / 15 min) at the start {_load(start)}"
             + (f", at the end {_load(end)}" if end else "") + f", on {cpus} CPUs (the runs themselves "
             f"add about one to it)."]
    if busy >= 0.5:
        lines[-1] += (" Other work was running: wall and CPU times are noisy (compare them "
                      "between sides of the same round, not with other reports); peak RSS is each "
                      "process's own and does not depend on the load.")
    return lines


def _per_side(record: dict, summary: dict) -> list[str]:
    rows = [["side", "runs", "peak RSS", "loaded", "peak over loaded", "wall time", "CPU time"]]
    for side in record["sides"]:
        s = summary["sides"][side["name"]]
        baseline = side["role"] == "baseline" and side["name"] != "baseline"
        rows.append([side["name"] + (" (baseline)" if baseline else ""), str(s["runs"]),
                     _spread(s["peak_rss"], MiB), _spread(s["loaded_rss"], MiB), _spread(s["overhead"], MiB),
                     _spread(s["wall_s"], 1, 2), _spread(s["cpu_s"], 1, 2)])
    return _aligned(rows, right=range(1, 7))


def _against(summary: dict) -> list[str]:
    rows = [["variant", "peak ratio", "overhead ratio", "wall ratio", "CPU ratio", "peak saving",
             "overhead saving", "noise margin",
             "saving beyond noise", "same digest", "differing elements", "tolerance", "agreement", "verdict"]]
    for v in summary["variants"]:
        a = v["agreement"]
        differing = "-" if a["differing_elements"] is None else (
            f"{a['differing_elements']:,}" + (f" of {a['total_elements']:,}" if a["total_elements"] else ""))
        tolerance = a["tolerance"] + ("" if v["tolerance_source"] == "default" else f" ({v['tolerance_source']})")
        rows.append([v["name"], _ratio(v["peak_ratio"]), _ratio(v.get("overhead_ratio")),
                     _ratio(v.get("wall_ratio")), _ratio(v.get("cpu_ratio")),
                     _mib(v["peak_saving"]), _mib(v["overhead_saving"]), _mib((v.get("noise") or {}).get("margin")),
                     _beyond_noise(v),
                     {True: "yes", False: "no", None: "-"}[a["same_digest"]], differing, tolerance, a["status"],
                     "**FAIL**" if v["verdict"] == "fail" else "ok"])
    lines = _aligned(rows, right=range(1, 8))
    lines += ["", "Ratios are variant / baseline of the medians (below 1: the variant uses less; time ratios "
              "come from the same alternating round, so from the same load). A saving "
              "is the baseline's median minus the variant's, in MiB; it counts only beyond the noise "
              "margin (see the rule under the verdict)."]
    repeatable = summary["baseline_repeatable"]
    if repeatable is not None:
        lines += ["", f"The baseline's own repeats against its first run: {repeatable['status']} "
                      f"({repeatable['reason']})."]
    return lines


def _beyond_noise(variant: dict) -> str:
    noise = variant.get("noise")
    if noise is None:
        return "yes" if variant["claims_saving"] else "no"
    return {"saves": "yes", "uses more": "no: uses more", "within noise": "no: within noise",
            "cannot tell": "cannot tell"}[noise["status"]]


def _commands(record: dict) -> list[str]:
    lines = ["## Commands", "", "```"]
    if record.get("command"):
        lines.append(shown_command(record["command"], None))
        lines.append("")
    width = max(len(side["name"]) for side in record["sides"])
    for side in record["sides"]:
        lines.append(f"{side['name']:<{width}}  {shown_command(shlex.join(side['command']), None)}")
    lines += ["```", "", "`{run_dir}` is each run's own empty folder. Every run's result is compared "
              f"with the reference, {record['reference']}."]
    return lines


def _runs(record: dict) -> list[str]:
    rows = [["#", "side", "run", "started (UTC)", "load 1 min", "peak RSS", "loaded", "over loaded",
             "wall s", "CPU s", "result digest", "differing elements"]]
    for run in record["runs"]:
        result = run.get("result")
        overhead = None if run.get("loaded_rss") is None else run["peak_rss"] - run["loaded_rss"]
        rows.append([str(run["order"]), run["side"], str(run["repeat"]), run["started_at"][11:19],
                     f"{run['load_average'][0]:.2f}", _mib(run["peak_rss"]), _mib(run.get("loaded_rss")),
                     _mib(overhead), f"{run['wall_s']:.2f}", _optional(run.get("cpu_s"), ".2f"),
                     "-" if not result else f"`{result['digest'][:DIGEST_CHARS]}`",
                     "-" if not result or result["differing_elements"] is None
                     else f"{result['differing_elements']:,}"])
    return _aligned(rows, right=[0, 2, 4, 5, 6, 7, 8, 9, 11])


def _reported(record: dict) -> list[str]:
    """Scalar fields each side reported about itself (its first run), one row per field."""
    names = [side["name"] for side in record["sides"]]
    firsts = {run["side"]: _flatten(run.get("reported") or {}) for run in reversed(record["runs"])}
    fields: list[str] = []
    for name in names:
        fields += [key for key in firsts.get(name, {}) if key not in fields]
    if not fields:
        return []
    rows = [["field", *names]]
    for key in fields:
        in_mib = "rss" in key.rsplit(".", 1)[-1] or key.endswith("_bytes")
        rows.append([key + (" (MiB)" if in_mib else ""),
                     *[_value(firsts.get(name, {}).get(key), in_mib) for name in names]])
    return _aligned(rows, right=range(1, len(names) + 1))


def _environment(record: dict) -> list[str]:
    env = record["environment"]
    lines = [f"- Python {env['python']} ({os.path.basename(env['executable'])}), {env['platform']}",
             f"- CPU: {env.get('cpu')}, {env.get('cpu_count')} CPUs ({env.get('cpus_usable')} usable)"]
    if env.get("memory_total"):
        lines.append(f"- memory: {env['memory_total'] / GiB:,.1f} GiB")
    lines.append("- libraries: " + ", ".join(f"{k} {v or 'not installed'}" for k, v in env["libraries"].items()))
    if env.get("thread_variables"):
        lines.append("- thread settings: " + ", ".join(f"{k}={v}" for k, v in env["thread_variables"].items()))
    lines.append(f"- load average at the start {_load(env['load_average_start'])}"
                 + (f", at the end {_load(env['load_average_end'])}" if env.get("load_average_end") else ""))
    return lines


# -- formatting ------------------------------------------------------------------------------

def _spread(spread: dict | None, unit: float, digits: int = 1) -> str:
    if spread is None:
        return "-"
    return " / ".join(f"{spread[key] / unit:,.{digits}f}" for key in ("min", "median", "max"))


def _mib(value) -> str:
    return "-" if value is None else f"{value / MiB:,.1f}"


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _optional(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _load(values) -> str:
    return " / ".join(f"{value:.2f}" for value in values)


def _flatten(data: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float, str, bool)) or value is None:
            flat[f"{prefix}{key}"] = value
    return flat


def _value(value, in_mib: bool = False) -> str:
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
