"""The projection-validation report (markdown) and its tables, from a validation result alone
(`auditor.jobs.projection_validation.validate`): the targets met or missed, the peaks,
every stage and every component of the peak stage, real against scaled and traced, and what
the scaled projection's fit found. `tables(result)` gives the same tables as rows, for the
terminal.
"""
from __future__ import annotations

import shlex

from auditor import units
from auditor.renderers import markdown_text as md

METHODS = ("scaled", "traced")


def _methods(result: dict) -> tuple[str, ...]:
    """The projections the result has (a program of the user's is projected by tracing alone)."""
    return tuple(m for m in METHODS if m in result["peak"])


def _met(target: dict) -> str:
    if target["met"] is None:  # the projection printed no number to hold to the target
        return "n/a (see above)"
    return "yes" if target["met"] else "NO"


def _error(projected, real) -> str:
    if projected is None or not real:
        return "-"
    return f"{projected / real - 1:+.2%}"


def tables(result: dict) -> dict[str, tuple[list[str], list[list[str]]]]:
    """name -> (headers, rows) for the targets, peaks, stages and components."""
    targets = (["target", "method", "limit", "error", "met"],
               [[t["what"], t["method"], f"±{t['limit']:.0%}",
                 f"{t['error']:+.2%}" if t["error"] is not None else "-",
                 _met(t)] for t in result["targets"]])
    peak = result["peak"]
    methods = _methods(result)
    pairs = sum(([m, "error"] for m in methods), [])
    peaks = (["peak", "real", *pairs],
             [[what, units.size(peak["real"][key])]
              + sum(([units.size(peak[m][key]), _error(peak[m][key], peak["real"][key])] for m in methods), [])
              for what, key in (("live tensors", "live_tensors"), ("RSS", "rss"))])
    stages: tuple[list[str], list[list[str]]] = (
        ["stage", "real tensors", *pairs, "real RSS", *pairs], [])
    for s in result["stages"]:
        row = [s["path"]]
        for key in ("tensor_peak", "rss_peak"):
            real = s["real"][key]
            row.append(units.size(real))
            for m in methods:
                value = (s[m] or {}).get(key)
                row += [units.size(value), _error(value, real)]
        stages[1].append(row)
    components = (["component", "category", "real", *pairs],
                  [[c["name"], c["category"], units.size(c["real"])]
                   + sum(([units.size(c[m]), _error(c[m], c["real"])] for m in methods), [])
                   for c in result["components"]])
    return {"targets": targets, "peaks": peaks, "stages": stages, "components": components}


def render(result: dict, command: list[str] | None = None) -> str:
    small, target = result["small"], result["target"]
    made = tables(result)
    missed = [t for t in result["targets"] if t["met"] is False]
    out = [f"# Projection validation: {small['label']} -> {target['label']}", ""]
    out += [f"Audited for real at **{small['label']}** ({small['parameters']:,} parameters), "
            f"projected to **{target['label']}** ({target['parameters']:,} parameters, a "
            f"**{result['scale_up']:.1f}x** scale-up in parameters), which then ran for real, "
            f"held out. {_what_ran(small)}", ""]
    low, high = result.get("scale_up_range", (4, 20))
    if not low <= result["scale_up"] <= high:
        out += [f"Note: the targets are stated for a {low:g}x to {high:g}x scale-up; this one is "
                f"{result['scale_up']:.1f}x.", ""]
    unchecked = [t for t in result["targets"] if t["met"] is None]
    reasons: dict[str, list[str]] = {t.get("not_printed", "no number"): [] for t in unchecked}
    for t in unchecked:
        reasons[t.get("not_printed", "no number")].append(f"{t['what']} ({t['method']})")
    not_checked = "Not checked: " + "; ".join(f"{', '.join(names)}: {why}" for why, names in reasons.items()) + "."
    if missed:
        out += ["**Missed:** " + "; ".join(f"{t['what']} ({t['method']}) {t['error']:+.2%} against ±{t['limit']:.0%}"
                                           if t["error"] is not None else f"{t['what']} ({t['method']}): no reading"
                                           for t in missed) + ".", ""]
    else:
        out += ["**All targets met.**" if not unchecked else "**Every target with a number to check met.**", ""]
    if unchecked:  # the tables below still show such a projection's figures, for reading, not judging
        out += [not_checked, ""]
    if command:
        out += ["```", shlex.join(command), "```", ""]
    out += ["## Targets", "", _table(*made["targets"]), ""] + _resting_on_estimates(result)
    out += ["## Peaks", "", "Live tensors: the highest live-tensor meter reading of any stage. RSS: the "
            "run's highest RSS.", "", _table(*made["peaks"]), ""]
    out += ["## Stages", "", "Peak inside each stage, real against projected.", "", _table(*made["stages"]), ""]
    out += [f"## Components at the end of `{result['components_stage']}` (the real run's peak stage)", "",
            _table(*made["components"]), ""]
    out += _data_dependent(result)
    if "scaled" in result["projections"] and result.get("fit"):
        out += ["## What the scaled projection fitted", ""] + _fit(result) + [""]
    out += ["## Runs", "", f"- small (real): `{small['run']}`", f"- held-out target (real): `{target['run']}`",
            f"- every run of this validation: `{result['folder']}`",
            f"- memory available when checked: {units.size(result['available'])} "
            f"(margin {units.size(result['margin'])})"]
    return "\n".join(out).rstrip() + "\n"


def _resting_on_estimates(result: dict) -> list[str]:
    """The stages the every-stage target leaves out, and the worst of them, said under the table."""
    lines = []
    for t in result["targets"]:
        worst = t.get("resting_on_estimates")
        if worst:
            lines += [f"{t['what'].capitalize()} ({t['method']}) is judged on the {t['stages']:,} "
                      f"stage{'' if t['stages'] == 1 else 's'} whose sizes are exact. {worst['stages']:,} more rest partly on estimated "
                      "value-dependent sizes, not held to it: the run's total of such a structure is "
                      "estimated, but its split across the target's tensors depends on values. The worst "
                      f"is {worst['error']:+.2%}, {md.code(worst['path'])} "
                      f"({worst['estimated_share']:.0%} of its projected bytes estimated).", ""]
    return lines


def _data_dependent(result: dict) -> list[str]:
    """The traced projection's data-dependent sites: each ratio and where it came from, and how
    much of the projected peak rests on them (auditor.analysis.estimated_bytes)."""
    from auditor.analysis.estimated_bytes import estimate_note
    traced = result["projections"].get("traced") or {}
    found = (traced.get("data_dependent") or {}).get("sites") or []
    if not found:
        return []
    rows = [[f"`{s['site']}`", s["op"], s.get("source") or "-",
             f"{s['ratio']:.5f}" if s.get("ratio") is not None else "-", f"{s['calls']:,}",
             f"{s['output_numel']:,}", f"{s.get('conflicts') or 0:,}"] for s in found]
    return ["## Data-dependent sizes in the traced projection", "",
            md.text(estimate_note(traced) or "") + ".", "",
            "Each site's ratio: elements out per element in, observed at the same site in the small "
            "real run (or declared by the program); conflicts: calls where an estimate met a size the "
            "program computed otherwise and took the program's (auditor.tracing).", "",
            _table(["site", "operator", "source", "ratio", "traced calls", "elements out", "conflicts"],
                   rows), ""]


def _what_ran(small: dict) -> str:
    if "program" in small:  # a program of the user's, its model swapped at --model-from
        program = small["program"]
        ran = shlex.join([program["script"].rsplit("/", 1)[-1], *program["args"]]) if program.get("script") \
            else f"{program['function']}()"
        return (f"Program `{ran}`, unmodified; its model built by `{small['model_from']}` (replaced "
                "by the target's in the held-out runs); stages: "
                + (", ".join(f"`{t}`" for t in small["stages"]) or "none") + ". No scaled projection: "
                "its drivers are fitted for GradProbe's state, so a program is projected by tracing.")
    settings = small["settings"]
    return (f"GradProbe variant `{settings['variant']}`, strategy `{settings['strategy']}`, sequence "
            f"{settings['sequence_length']}, batch {settings['batch_size']}, {settings['batches']} "
            f"batches, sparsity {settings['sparsity']}.")


def _fit(result: dict) -> list[str]:
    fit = result["fit"]
    lines = [f"Method: {fit['method']}.", ""]
    if fit["runs"]:
        lines += ["Calibration runs: " + "; ".join(
            f"{r['label']} ({', '.join(f'{k} {v}' for k, v in (r['overrides'] or {}).items())}, "
            f"{r['tokens']} tokens)" for r in fit["runs"]) + ".", ""]
    used = sorted({d for s in result["projections"]["scaled"]["stages"]
                   for d in s["transient"]["shares"]} | {"parameters", "buffers"})
    lines += [_table(["driver", "audited", "target", "ratio"],
                     [[d, f"{fit['drivers'][d]['audited']:,.0f}", f"{fit['drivers'][d]['target']:,.0f}",
                       f"{fit['drivers'][d]['ratio']:,.3f}"] for d in used if d in fit["drivers"]]), ""]
    lines += ["Transient inside each stage (live-tensor peak minus end), split onto drivers: the "
              "bytes each driver accounts for at the audited shape, grown by its ratio.", ""]
    rows = []
    for s in result["projections"]["scaled"]["stages"]:
        t = s["transient"]
        shares = ", ".join(f"{d} {units.size(b)}" for d, b in t["shares"].items()) or "none"
        rows.append([s["path"], units.size(t["bytes"]), t["how"] + (f" (in `{s['peak_in']}`)" if s.get("peak_in") else ""),
                     shares, units.size(t.get("residual")), units.size(t["projected"])])
    lines.append(_table(["stage", "audited", "how", "shares", "largest miss", "projected"], rows))
    refitted = [(s["path"], n, c) for s in result["projections"]["scaled"]["stages"]
                for n, c in s["components"].items() if c.get("how") == "fitted"]
    if refitted:
        lines += ["", "Components whose a-priori driver missed a calibration run, fitted instead: "
                  + "; ".join(f"`{n}` in `{p}` -> " + ", ".join(c["shares"]) for p, n, c in refitted) + "."]
    return lines


def _table(headers: list[str], rows: list[list[str]]) -> str:
    """Cells of numbers and paths: only their pipes need escaping."""
    return md.table(headers, [[str(c).replace("|", "\\|") for c in row] for row in rows])


