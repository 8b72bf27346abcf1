"""Stability across steps: do per-step peaks grow steadily (a leak), jump once (a spike), or hold?

    result = classify([peak_step_1, peak_step_2, ...], warmup=1, label="live tensors")
    result["verdict"], result["evidence"]

The input is one peak reading in bytes per training step, in step order. The rules use the
constants below; the result repeats the numbers used under "thresholds".

- Warm-up: the first `warmup` steps are left out. Step 1 creates the optimizer state, so step 2
  is legitimately higher than step 1, and that rise says nothing about a leak. At least
  `MIN_STEPS` steps must remain, else the verdict is "too short" (not an error).
- Spike: the highest step stands above both the step before and the step after it by at least
  `SPIKE_SHARE` of the median and at least `SPIKE_MIN_BYTES`: it comes back down. The last
  step cannot be a spike, as nothing shows that it comes back down.
- Leak: over the considered steps, a spike step left out (so a spike neither hides nor makes a
  leak), the least-squares slope is at least `LEAK_SHARE` of the median and at least
  `LEAK_MIN_BYTES` per step, and the rise is steady: a straight line fits the steps more
  closely (smaller sum of squared residuals) than one step up between two flat levels does.
  So a single jump that stays (a cache filled once) is not a leak; growth in two or more
  jumps, or in every step, is.
- "leak" wins over "spike"; anything else is "stable", reported with its spread, slope and
  largest rise all the same.

Noise of +-1% of the median (RSS jitter) stays below both the leak slope and the spike
margin; a leak of 1% of the median per step over 8 steps is found through that noise. A leak
that starts only in the last few steps can read as one step up until more steps are measured.
"""
from __future__ import annotations

import math
import statistics

from auditor.facts.units import KiB, MiB, share, signed_size, size

MIN_STEPS = 3              # considered steps needed to tell a trend from a one-off
LEAK_SHARE = 0.005         # a leak grows by at least 0.5% of the median per step ...
LEAK_MIN_BYTES = 64 * KiB  # ... and by at least 64 KiB per step
SPIKE_SHARE = 0.10         # a spike stands 10% of the median above both neighbouring steps ...
SPIKE_MIN_BYTES = 1 * MiB  # ... and at least 1 MiB above them


def classify(series: list[int], *, warmup: int = 1, label: str = "live tensors") -> dict:
    """The verdict on per-step peaks (bytes, step order), its numbers and a sentence naming `label`."""
    if warmup < 0:
        raise ValueError(f"warmup must be a number of steps >= 0, got {warmup}")
    steps = list(range(warmup + 1, len(series) + 1))  # 1-based step numbers considered
    values = [int(v) for v in series[warmup:]]
    result = {"verdict": "too short", "steps": len(series), "warmup": warmup,
              "considered": [steps[0], steps[-1]] if steps else None,
              "slope_bytes_per_step": None, "growth_bytes": None, "largest_jump": None,
              "median_bytes": None, "spread_bytes": None, "spike": None,
              "thresholds": _thresholds(None)}
    if len(values) < MIN_STEPS:
        result["evidence"] = (f"Only {_steps(len(values))} left of {len(series)} after "
                              f"{_steps(warmup)} of warm-up; at least {MIN_STEPS} are needed to "
                              "tell a leak from a spike.")
        return result

    median = int(statistics.median(values))
    thresholds = _thresholds(median)
    spike = _spike(steps, values, thresholds["spike_bytes"])
    # The leak test runs without the spike step: a spike on top of a leak is still a leak.
    rest = [(s, v) for s, v in zip(steps, values, strict=False) if not spike or s != spike["step"]]
    trend = _trend(*map(list, zip(*rest, strict=False)))
    leak = trend["slope"] >= thresholds["leak_bytes_per_step"] and trend["steady"]
    result.update(verdict="leak" if leak else "spike" if spike else "stable",
                  slope_bytes_per_step=statistics.linear_regression(steps, values).slope,
                  growth_bytes=values[-1] - values[0], largest_jump=_largest_jump(steps, values),
                  median_bytes=median, spread_bytes=max(values) - min(values), spike=spike,
                  thresholds=thresholds)
    result["evidence"] = _evidence(result, trend, label) + _warmup_sentence(warmup)
    return result


def _thresholds(median: int | None) -> dict:
    return {"min_steps": MIN_STEPS,
            "leak_share_of_median": LEAK_SHARE, "leak_min_bytes": LEAK_MIN_BYTES,
            "leak_bytes_per_step": None if median is None else max(LEAK_SHARE * median, LEAK_MIN_BYTES),
            "spike_share_of_median": SPIKE_SHARE, "spike_min_bytes": SPIKE_MIN_BYTES,
            "spike_bytes": None if median is None else max(SPIKE_SHARE * median, SPIKE_MIN_BYTES)}


def _largest_jump(steps: list[int], values: list[int]) -> dict:
    k = max(range(1, len(values)), key=lambda i: values[i] - values[i - 1])
    return {"step": steps[k], "bytes": values[k] - values[k - 1]}


def _spike(steps: list[int], values: list[int], margin: float) -> dict | None:
    """The highest step, when it stands `margin` above the step before and the step after."""
    k = max(range(len(values)), key=values.__getitem__)
    if k == len(values) - 1:
        return None  # the last step: a spike or a lasting step up, nothing tells which
    if values[k] - max(values[max(k - 1, 0):k] + values[k + 1:k + 2]) < margin:
        return None
    others = values[:k] + values[k + 1:]
    return {"step": steps[k], "bytes": values[k] - int(statistics.median(others))}


def _trend(steps: list[int], values: list[int]) -> dict:
    """Slope, and whether a line fits better than the best single step up (a jump that stays).
    Linear in the steps: both misfits come from running sums of the values centred on their
    median (integers, so exact; centring keeps the squares small for the float divisions)."""
    line = statistics.linear_regression(steps, values)
    line_misfit = math.fsum((v - line.intercept - line.slope * s) ** 2 for s, v in zip(steps, values, strict=False))
    step_misfit, k = _best_step_up(values)
    left, right = values[:k], values[k:]
    return {"slope": line.slope, "steady": line_misfit < step_misfit, "steps": steps,
            "rises": sum(b > a for a, b in zip(values, values[1:], strict=False)), "growth": values[-1] - values[0],
            "step_up": {"step": steps[k], "bytes": statistics.fmean(right) - statistics.fmean(left)}}


def _best_step_up(values: list[int]) -> tuple[float, int]:
    """The smallest sum of squared residuals when steps before k sit at one level and the rest
    at another, and its k (the first such k on a tie)."""
    centre = int(statistics.median(values))
    centred = [v - centre for v in values]
    n, total, total_sq = len(centred), sum(centred), sum(v * v for v in centred)
    best: tuple[float, int] | None = None
    left, left_sq = 0, 0
    for k in range(1, n):
        left += centred[k - 1]
        left_sq += centred[k - 1] ** 2
        right, right_sq = total - left, total_sq - left_sq
        misfit = (left_sq - left * left / k) + (right_sq - right * right / (n - k))
        if best is None or misfit < best[0]:
            best = (misfit, k)
    assert best is not None  # n >= MIN_STEPS
    return best


def _evidence(r: dict, trend: dict, label: str) -> str:
    th, median = r["thresholds"], r["median_bytes"]
    span = f"steps {r['considered'][0]}-{r['considered'][1]}"
    rate = (f"a leak grows at least {LEAK_SHARE:.1%} of the median and {size(LEAK_MIN_BYTES)} "
            f"per step, here {size(th['leak_bytes_per_step'])}")
    if r["verdict"] == "leak":
        without = f", leaving out the spike at step {r['spike']['step']}" if r["spike"] else ""
        return (f"Steady growth of peak {label}: {signed_size(trend['slope'])} per step over {span}"
                f"{without} ({share(trend['slope'], median)} of the median {size(median)}; {rate}), "
                f"{signed_size(trend['growth'])} in all, rising in {trend['rises']} of "
                f"{len(trend['steps']) - 1} steps, and a straight line fits these steps more "
                "closely than a single step up does.")
    if r["verdict"] == "spike":
        spike = r["spike"]
        return (f"Spike in peak {label} at step {spike['step']}: {signed_size(spike['bytes'])} above "
                f"the median of the other steps ({share(spike['bytes'], median)} of the median "
                f"{size(median)}), back down in the next step; a spike stands at least "
                f"{SPIKE_SHARE:.0%} of the median and {size(SPIKE_MIN_BYTES)} above both "
                f"neighbouring steps, here {size(th['spike_bytes'])}.")
    jump = r["largest_jump"]
    largest = (f"a largest rise of {signed_size(jump['bytes'])} at step {jump['step']}"
               if jump["bytes"] > 0 else "no step higher than the one before")
    return (f"Stable peak {label} over {span}: a spread of {size(r['spread_bytes'])} "
            f"({share(r['spread_bytes'], median)} of the median {size(median)}), a trend of "
            f"{signed_size(trend['slope'])} per step ({rate}) and {largest}{_not_steady(trend, th)}.")


def _not_steady(trend: dict, thresholds: dict) -> str:
    """Why a trend fast enough for a leak is not one: a single step up explains it better."""
    if trend["slope"] < thresholds["leak_bytes_per_step"]:
        return ""
    up = trend["step_up"]
    return (f"; that trend is one step up that stays ({signed_size(up['bytes'])} from step "
            f"{up['step']} on), which fits these steps more closely than a steady rise")


def _warmup_sentence(warmup: int) -> str:
    if warmup == 0:
        return ""
    left_out = "Step 1 is" if warmup == 1 else f"Steps 1-{warmup} are"
    return (f" {left_out} left out as warm-up: an optimizer creates its state in step 1, so the "
            "next step is legitimately higher.")


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"
