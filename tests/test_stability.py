"""Stability across steps: leak, spike or stable, on synthetic series and on per-step peaks
measured by the live-tensor meter in a real AdamW training loop."""
import random

import pytest
import torch

from architectures import build_model
from auditor.analysis.training.stability import classify
from auditor.capture.probes.live_tensors import LiveTensorMeter
from auditor.facts import units

MiB = 2**20
BASE = 100 * MiB


def _noisy(values, amplitude, seed):
    """Each reading moved by up to +-amplitude of BASE, like RSS jitter."""
    rnd = random.Random(seed)
    return [int(v + rnd.uniform(-amplitude, amplitude) * BASE) for v in values]


# --- synthetic series ---------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(20))
def test_flat_series_with_one_percent_noise_is_stable(seed):
    result = classify(_noisy([BASE] * 8, 0.01, seed))
    assert result["verdict"] == "stable", result["evidence"]
    assert result["spread_bytes"] <= 0.02 * BASE
    assert "Stable peak live tensors over steps 2-8" in result["evidence"]


def test_linear_growth_of_one_percent_per_step_is_a_leak():
    series = [BASE + i * BASE // 100 for i in range(8)]
    result = classify(series)
    assert result["verdict"] == "leak"
    assert result["considered"] == [2, 8] and result["steps"] == 8 and result["warmup"] == 1
    assert result["slope_bytes_per_step"] == pytest.approx(BASE / 100)
    assert result["growth_bytes"] == 6 * BASE // 100
    assert result["median_bytes"] == series[4]
    assert result["thresholds"]["leak_bytes_per_step"] == pytest.approx(0.005 * series[4])
    assert units.signed_size(BASE / 100) in result["evidence"]  # "+1.0 MiB" per step
    assert "Step 1 is left out as warm-up" in result["evidence"]


@pytest.mark.parametrize("seed", range(20))
def test_noisy_leak_is_still_a_leak(seed):
    series = _noisy([BASE + i * BASE // 100 for i in range(8)], 0.005, seed)
    assert classify(series)["verdict"] == "leak"


def test_slow_growth_below_the_threshold_is_stable():
    series = [BASE + i * BASE // 1000 for i in range(8)]  # 0.1% of the median per step
    result = classify(series)
    assert result["verdict"] == "stable"
    assert result["slope_bytes_per_step"] == pytest.approx(BASE / 1000)


@pytest.mark.parametrize("seed", range(10))
def test_one_spike_is_a_spike_at_its_step_not_a_leak(seed):
    series = _noisy([BASE] * 8, 0.01, seed)
    series[4] += 20 * MiB  # step 5
    result = classify(series)
    assert result["verdict"] == "spike", result["evidence"]
    assert result["spike"]["step"] == 5
    assert 18 * MiB <= result["spike"]["bytes"] <= 22 * MiB
    assert result["largest_jump"]["step"] == 5
    assert "Spike in peak live tensors at step 5" in result["evidence"]


def test_a_step_up_that_stays_is_not_a_leak():
    series = [BASE] * 4 + [BASE + 20 * MiB] * 4  # a cache filled once, in step 5
    result = classify(series)
    assert result["verdict"] == "stable"
    assert result["slope_bytes_per_step"] > result["thresholds"]["leak_bytes_per_step"]
    assert "one step up that stays (+20.0 MiB from step 5 on)" in result["evidence"]


def test_a_jump_in_the_last_step_is_not_called_a_spike():
    series = [BASE] * 7 + [BASE + 20 * MiB]  # nothing shows it comes back down
    result = classify(series)
    assert result["verdict"] == "stable" and result["spike"] is None
    assert result["largest_jump"] == {"step": 8, "bytes": 20 * MiB}
    assert "a largest rise of +20.0 MiB at step 8" in result["evidence"]


def test_a_spike_on_top_of_a_leak_is_the_leak():
    series = [BASE + i * 2 * MiB for i in range(8)]
    series[4] += 30 * MiB
    result = classify(series)
    assert result["verdict"] == "leak"
    assert result["spike"]["step"] == 5
    assert "leaving out the spike at step 5" in result["evidence"]


def test_growth_only_in_the_warmup_step_is_stable():
    series = [BASE] + [BASE + 30 * MiB] * 7  # optimizer state created in step 1
    result = classify(series)
    assert result["verdict"] == "stable"
    assert result["growth_bytes"] == 0 and result["spread_bytes"] == 0
    assert result["largest_jump"]["bytes"] == 0
    assert "Step 1 is left out as warm-up" in result["evidence"]


def _best_step_up_by_brute_force(values: list[int]) -> tuple[float, int]:
    """Every split tried, each level's mean taken afresh: the rule as stated, quadratic."""
    def misfit(part):
        mean = sum(part) / len(part)
        return sum((v - mean) ** 2 for v in part)
    return min((misfit(values[:k]) + misfit(values[k:]), k) for k in range(1, len(values)))


@pytest.mark.parametrize("seed", range(30))
def test_the_running_sums_find_the_step_up_the_rule_states(seed):
    """The linear-time step-up search (a 2,000-step series took 81 s before) finds the split
    that trying every one finds, on noisy series with and without a jump or a trend."""
    from auditor.analysis.training import stability
    rng = random.Random(seed)
    n, base = rng.randint(3, 60), rng.choice([10**6, 10**9, 7 * 10**10])
    jump, slope = rng.choice([0, base // 10]), rng.choice([0, base // 200])
    at = rng.randint(1, n - 1)
    values = [base + slope * i + (jump if i >= at else 0) + rng.randint(-base // 100, base // 100)
              for i in range(n)]
    fast, k = stability._best_step_up(values)
    slow, k_slow = _best_step_up_by_brute_force(values)
    assert k == k_slow
    assert fast == pytest.approx(slow, rel=1e-9, abs=1.0)


def test_too_short_is_a_verdict_not_an_error():
    result = classify([BASE, BASE, 2 * BASE])
    assert result["verdict"] == "too short"
    assert result["considered"] == [2, 3]
    assert "at least 3" in result["evidence"]
    assert classify([])["verdict"] == "too short"
    assert classify([BASE, BASE, 2 * BASE], warmup=0)["verdict"] != "too short"
    with pytest.raises(ValueError):
        classify([BASE] * 8, warmup=-1)


# --- per-step peaks of a real training loop -----------------------------------------------

STEPS, BATCH, LENGTH, VOCAB = 8, 4, 32, 512


@pytest.fixture
def seeded(one_thread):
    torch.manual_seed(0)


def _train(keep=None, long_step=None) -> list[int]:
    """Peak live-tensor bytes of each AdamW step on a tiny GPT-Neo.

    keep="graph": every step's loss is kept with its graph (backward retains it), so all saved
    activations stay alive; keep="logits": only every step's logits stay alive. long_step: that
    step runs a batch twice as long, a one-off transient.
    """
    meter = LiveTensorMeter()  # entered first: it counts the loop's own tensors, model included,
    meter.__enter__()          # and nothing another test left alive
    model = build_model("tinystories-33m", seed=0, layers=2, hidden=64, heads=4, vocab=VOCAB)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    kept, peaks = [], []
    try:
        for step in range(1, STEPS + 1):
            meter.reset_peak()
            ids = torch.randint(0, VOCAB, (BATCH, 2 * LENGTH if step == long_step else LENGTH))
            out = model(ids, labels=ids)
            out.loss.backward(retain_graph=keep == "graph")
            optimizer.step()
            optimizer.zero_grad()
            if keep:
                kept.append(out.loss if keep == "graph" else out.logits)
            peaks.append(meter.reset_peak())
    finally:
        meter.__exit__(None, None, None)
    return peaks


def test_real_clean_loop_is_stable(seeded):
    series = _train()
    result = classify(series)
    assert result["verdict"] == "stable", (series, result["evidence"])
    assert series[1] > series[0]  # step 2 is higher: AdamW's state was made in step 1
    assert classify(series, warmup=0)["verdict"] != "leak"


def test_real_kept_graphs_are_a_leak(seeded):
    series = _train(keep="graph")
    result = classify(series)
    assert result["verdict"] == "leak", (series, result["evidence"])
    logits = BATCH * LENGTH * VOCAB * 4
    assert result["slope_bytes_per_step"] > 2 * logits  # the saved activations, not just logits


def test_real_kept_logits_are_a_leak_of_exactly_their_size(seeded):
    series = _train(keep="logits")
    result = classify(series)
    assert result["verdict"] == "leak", (series, result["evidence"])
    logits = BATCH * LENGTH * VOCAB * 4  # 256 KiB per step, under 2% of the median
    assert result["slope_bytes_per_step"] == pytest.approx(logits)
    assert "+256.0 KiB per step" in result["evidence"]


def test_real_long_batch_is_a_spike_at_its_step(seeded):
    series = _train(long_step=5)
    result = classify(series)
    assert result["verdict"] == "spike", (series, result["evidence"])
    assert result["spike"]["step"] == 5
    assert result["spike"]["bytes"] >= result["thresholds"]["spike_bytes"]
