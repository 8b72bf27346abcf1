"""From a comparison record alone: per side min/median/max, the ratios against the baseline,
whether each variant's result agrees with the baseline's, and the verdict.

A side's *overhead* is its peak RSS over its loaded RSS (what the algorithm itself adds on top
of its inputs), run by run. A variant *claims a saving* only beyond the noise (`RULE`): its
highest peak RSS is below the baseline's lowest by more than the margin, the larger of the
spread measured within either side and a floor. Otherwise it "saves nothing beyond the noise",
"uses more", or, with one run a side (no noise measured) and a difference within the floor,
"cannot tell". It *fails* when it claims a saving and its result differs from the baseline's
beyond its tolerance (or gives no result to compare while one is required).

Agreement: "identical" (no element differs, or equal digests), "within tolerance",
"differs" (beyond the tolerance, or unequal digests with nothing to count), or "unknown"
(a side gave no result to compare).
"""
from __future__ import annotations

import statistics
from typing import Any

from auditor.comparison.side import EXACT, Tolerance
from auditor.facts.units import MiB

# The floor stands for the noise a few runs may not show. Measured spreads of peak RSS: GradProbe
# on TinyStories-33M, 46 MiB over 3 baseline runs (2,156-2,202 MiB, reports/compare-tinystories-33m.md);
# two identical tiny-GradProbe sides (2 layers, hidden 64, seq 16), 28 MiB over 4 runs each
# (366-394 MiB, run_comparison of gradprobe_side("baseline", ...) against itself); a numpy script,
# 0.5 MiB of 28 MiB over 8. Where a spread like the tiny one shows, the margin takes it.
FLOOR_BYTES, FLOOR_SHARE = 16 * MiB, 0.02
RULE = (f"A variant saves memory only when its highest peak RSS is below the baseline's lowest by "
        f"more than a margin: the larger of the noise measured (the widest spread, highest minus "
        f"lowest peak, within the baseline's runs or the variant's) and a floor of "
        f"{FLOOR_BYTES // MiB} MiB or {FLOOR_SHARE:.0%} of the baseline's median peak, whichever is "
        f"larger. With one run a side no noise is measured: a difference within the floor cannot be "
        f"told from noise.")


def spread(values: list[float | None]) -> dict | None:
    """min, median, max and count of the values a run gave (None: it gave none)."""
    given = [value for value in values if value is not None]
    if not given:
        return None
    return {"min": min(given), "median": statistics.median(given), "max": max(given), "n": len(given)}


def side_statistics(runs: list[dict]) -> dict:
    overheads = [run["peak_rss"] - run["loaded_rss"] for run in runs if run.get("loaded_rss") is not None]
    return {"runs": len(runs),
            "peak_rss": spread([run["peak_rss"] for run in runs]),
            "loaded_rss": spread([run.get("loaded_rss") for run in runs]),
            "overhead": spread(overheads),
            "wall_s": spread([run["wall_s"] for run in runs]),
            "cpu_s": spread([run.get("cpu_s") for run in runs])}


def tolerance_of(side: dict, runs: list[dict]) -> tuple[Tolerance, str]:
    """The side's tolerance and where it came from: the user's, else the run's own, else exact."""
    given = Tolerance.from_json(side.get("tolerance"))
    if given is not None:
        return given, "given"
    declared = Tolerance.from_json(next((run["tolerance"] for run in runs if run.get("tolerance") is not None), None))
    if declared is not None:
        return declared, "declared by the run"
    return EXACT, "default"


def agreement(runs: list[dict], reference: dict | None, tolerance: Tolerance) -> dict:
    """How `runs` agree with the reference run's result (the worst run counts)."""
    base: dict[str, Any] = {"tolerance": str(tolerance), "allowance": None, "same_digest": None,
            "differing_elements": None, "total_elements": None}
    ref_result = reference and reference.get("result")
    if not ref_result or any(not run.get("result") for run in runs):
        who = "the baseline" if not ref_result else "this side"
        return {**base, "status": "unknown", "reason": f"{who} gave no result to compare"}
    results = [run["result"] for run in runs]
    if any(result["kind"] != ref_result["kind"] for result in results):
        return {**base, "status": "unknown", "reason": "one side gives a result file, the other only a digest"}
    total = ref_result.get("elements")
    allowance = tolerance.allowance(total)
    same = all(result["same_as_reference"] for result in results)
    counts = [result.get("differing_elements") for result in results]
    differing = None if None in counts else max(counts)
    base.update(allowance=allowance, same_digest=same, differing_elements=differing, total_elements=total)
    if same or differing == 0:
        return {**base, "status": "identical", "reason": "same result"}
    if differing is None:
        return {**base, "status": "differs", "reason": "digests differ (no result file to count elements)"}
    if allowance is not None and differing <= allowance:
        return {**base, "status": "within tolerance",
                "reason": f"{differing:,} elements differ, within the tolerance of {allowance:,}"}
    return {**base, "status": "differs",
            "reason": f"{differing:,} of {total:,} elements differ; tolerance {tolerance}"
                      + ("" if allowance is None or tolerance.fraction is None else f" ({allowance:,})")}


def summarise(record: dict) -> dict:
    sides = record["sides"]
    runs_of = {side["name"]: [run for run in record["runs"] if run["side"] == side["name"]] for side in sides}
    stats = {name: side_statistics(runs) for name, runs in runs_of.items()}
    baseline = next(side for side in sides if side["role"] == "baseline")
    base_runs = runs_of[baseline["name"]]
    reference = base_runs[0] if base_runs else None
    repeatable = agreement(base_runs[1:], reference, EXACT) if len(base_runs) > 1 else None
    variants = []
    for side in sides:
        if side["role"] != "variant":
            continue
        tolerance, source = tolerance_of(side, runs_of[side["name"]])
        agreed = agreement(runs_of[side["name"]], reference, tolerance)
        variants.append(_judge(side["name"], stats[baseline["name"]], stats[side["name"]], agreed,
                               tolerance_source=source, require_result=record.get("require_result", False)))
    return {"baseline": baseline["name"], "sides": stats, "variants": variants, "rule": RULE,
            "baseline_repeatable": repeatable, "failed": any(v["verdict"] == "fail" for v in variants)}


def _judge(name: str, base: dict, stats: dict, agreed: dict, tolerance_source: str, require_result: bool) -> dict:
    base_peak, peak = _median(base["peak_rss"]), _median(stats["peak_rss"])
    base_over, over = _median(base["overhead"]), _median(stats["overhead"])
    noise = beyond_noise(base["peak_rss"], stats["peak_rss"])
    claims = noise is not None and noise["status"] == "saves"
    judged = {"name": name, "tolerance_source": tolerance_source, "agreement": agreed,
              "peak_ratio": _ratio(peak, base_peak), "overhead_ratio": _ratio(over, base_over),
              # time, side by side in the same alternating round (so under the same load)
              "wall_ratio": _ratio(_median(stats["wall_s"]), _median(base["wall_s"])),
              "cpu_ratio": _ratio(_median(stats["cpu_s"]), _median(base["cpu_s"])),
              "peak_saving": None if peak is None or base_peak is None else base_peak - peak,
              "overhead_saving": None if over is None or base_over is None else base_over - over,
              "claims_saving": claims, "noise": noise}
    status = agreed["status"]
    result = {"identical": "identical", "within tolerance": agreed["reason"],
              "unknown": f"not compared ({agreed['reason']})", "differs": f"differs ({agreed['reason']})"}[status]
    if claims and noise is not None and status == "differs":  # a claim is a saving beyond the noise
        verdict, why = "fail", (f"claims a saving of {judged['peak_saving'] / MiB:,.1f} MiB of peak RSS "
                                f"({_margin_words(noise)}) but its result differs: {agreed['reason']}")
    elif status == "unknown" and require_result:
        verdict, why = "fail", f"no result to compare ({agreed['reason']}) and a result is required"
    else:
        verdict, why = "ok", f"{_saving_words(judged)}; result {result}"
    return {**judged, "verdict": verdict, "why": why}


def beyond_noise(base: dict | None, variant: dict | None) -> dict | None:
    """Whether the variant's peaks differ from the baseline's beyond the noise (see RULE):
    status "saves" | "uses more" | "within noise" | "cannot tell" (one run a side, within the
    floor), with the noise measured (None with one run a side), the floor and the margin."""
    if base is None or variant is None:
        return None
    measured = (max(base["max"] - base["min"], variant["max"] - variant["min"])
                if base["n"] > 1 and variant["n"] > 1 else None)
    floor = max(FLOOR_BYTES, FLOOR_SHARE * base["median"])
    margin = max(floor, measured or 0)
    below, above = base["min"] - variant["max"], variant["min"] - base["max"]
    status = ("saves" if below > margin else "uses more" if above > margin else
              "within noise" if measured is not None else "cannot tell")
    return {"status": status, "measured": measured, "floor": floor, "margin": margin,
            "below_baseline": below}


def _margin_words(noise: dict) -> str:
    measured = ("one run a side, no noise measured" if noise["measured"] is None
                else f"runs spread up to {noise['measured'] / MiB:,.1f} MiB")
    return f"margin {noise['margin'] / MiB:,.1f} MiB: {measured}"


def _saving_words(judged: dict) -> str:
    noise, saving = judged["noise"], judged["peak_saving"]
    if noise is None:
        return "no peak RSS to compare"
    if noise["status"] == "saves":
        return (f"saves {saving / MiB:,.1f} MiB of peak RSS (its highest run "
                f"{noise['below_baseline'] / MiB:,.1f} MiB below the baseline's lowest; {_margin_words(noise)})")
    median = f"median peak {-saving / MiB:+,.1f} MiB against the baseline"
    if noise["status"] == "uses more":
        return f"no saving: uses more ({median}, beyond the {_margin_words(noise)})"
    if noise["status"] == "within noise":
        return f"no saving beyond the noise ({median}; {_margin_words(noise)})"
    return (f"cannot tell whether it saves memory ({median}, within the {noise['floor'] / MiB:,.1f} MiB "
            f"floor; one run a side measures no noise: run each side 3 times or more)")


def _median(spread_: dict | None):
    return None if spread_ is None else spread_["median"]


def _ratio(a, b):
    return None if a is None or not b else a / b
