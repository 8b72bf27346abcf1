"""The five-line Python API sees what the CLI sees (issue 30).

tests/api_equals_cli/wanda_prune.py is a Wanda-like pruner written as research code is (a tiny
Llama from a config, hidden 64, 2 layers; a `backup` of every parameter cloned in
`Pruner.__init__`; every calibration input cached per linear, 4 samples of 32 tokens). It runs
once under `auditor run --stage` of its three functions and once under api_prune.py: `Audit`,
`track("model")` and one `stage("prune")`. Both must name the model's parameters, the backup and
the cached inputs alike (a receiver's `Pruner[label]` folds to `Pruner`), with the same
categories, in the censuses and at the stage's live-tensor high.

Sizes by hand: the parameters are 427,264 B in 21 storages (embed and head 256 x 64 fp32 =
65,536 B each; per layer q, o 64 x 64 and k, v 32 x 64, gate, up, down 128 x 64; 5 norms of 64),
the backup the same; the inputs cached for one layer are 4 samples x (q, k, v: 64; o: 64; gate,
up: 64; down: 128) x 32 tokens x 4 B = 4 x 32 x 4 x (6 x 64 + 128) = 262,144 B in 28 storages.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from auditor.analysis.run.component_history import fold_component

HERE = Path(__file__).resolve().parent / "api_equals_cli"
PARAMETERS = 427_264
INPUTS = 4 * 32 * 4 * (6 * 64 + 128)


def _api(folder: Path, script: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, script, str(folder), *args], cwd=HERE, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((folder / "run.json").read_text())


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    root = tmp_path_factory.mktemp("api_cli")
    done = subprocess.run([sys.executable, "-m", "auditor", "run", "--run-dir", str(root / "cli"), "--census",
                           "--live-tensors", "--stage", "wanda_prune:prune",
                           "--stage", "wanda_prune:Pruner.calibrate_layer",
                           "--stage", "wanda_prune:Pruner.prune_layer", "wanda_prune.py"],
                          cwd=HERE, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((root / "cli" / "run.json").read_text()), _api(root / "api", "api_prune.py")


def _prune(record: dict) -> dict:
    return next(s for s in record["stages"] if s["path"] == "prune")


def _at_peak(stage: dict) -> dict[tuple, int]:
    """(folded owner, category) -> bytes of the rows alive at the stage's live-tensor high."""
    found: dict[tuple, int] = {}
    for row in stage["live_tensors"]["at_peak"]["rows"]:
        key = (fold_component(row["owner"]) if row["owner"] else None, row["category"])
        found[key] = found.get(key, 0) + row["bytes"]
    return found


def test_the_end_census_is_the_same_through_both(both):
    cli, api = both
    ends = [{fold_component(n): (c["category"], c["bytes"]) for n, c in _prune(r)["components"].items()}
            for r in both]
    assert ends[0] == ends[1]
    # the model is found without being named (CLI) or tracked (API): the same component
    assert ends[0]["model.parameters"] == ("weights", PARAMETERS)
    assert "unowned.parameters" not in ends[0]


def _owned(high: dict[tuple, int], owner: str) -> int:
    return sum(size for (name, _), size in high.items() if name == owner)


def test_at_the_high_both_name_the_cached_inputs_and_the_weights(both):
    """The category of the cache is the census's (another rule decides it): the same in both."""
    highs = [_at_peak(_prune(r)) for r in both]
    for high in highs:
        assert _owned(high, "Pruner.inputs") == INPUTS  # cached, then freed inside the stage
        assert high[("model.parameters", "weights")] == PARAMETERS
    named = [{k: v for k, v in high.items() if k[0] is not None} for high in highs]
    assert named[0] == named[1]


def test_without_track_the_model_is_found_under_its_variable(both, tmp_path):
    untracked = _api(tmp_path / "untracked", "api_prune.py", "untracked")
    ends = [{n: (c["category"], c["bytes"]) for n, c in _prune(r)["components"].items()}
            for r in (both[1], untracked)]
    assert ends[0] == ends[1]
    assert _owned(_at_peak(_prune(untracked)), "Pruner.inputs") == INPUTS


def test_inside_the_calls_the_backup_is_the_pruners(both):
    """The CLI's census at each call's end, and the API's inside its one stage, both see the
    backup while its Pruner lives: `Pruner.backup` with every parameter's bytes."""
    cli, api = both
    calls = [s for s in cli["stages"] if s["call"] and s["call"]["target"] == "Pruner.calibrate_layer"]
    assert calls and all(s["components"]["Pruner[LlamaForCausalLM].backup"]["bytes"] == PARAMETERS for s in calls)
    assert api["probes"]["census"]["census_at_highs"] >= 1


def test_a_training_loop_gets_gradients_and_optimizer_state_untracked(tmp_path):
    record = _api(tmp_path / "train", "train_loop.py")
    stage = next(s for s in record["stages"] if s["path"] == "train")
    components = stage["components"]
    params = components["model.parameters"]
    assert params["category"] == "weights" and params["bytes"] == PARAMETERS
    state = components["optimizer.state"]
    assert state["category"] == "optimizer state"
    assert state["bytes"] == 2 * PARAMETERS + 21 * 4  # exp_avg, exp_avg_sq, one fp32 step each
    assert components["model.grad"] == {"category": "gradients", "bytes": PARAMETERS, "tensors": 21}
    high = _at_peak(stage)  # the state is named at the high too (made and kept inside the stage)
    assert high[("optimizer.state", "optimizer state")] == 2 * PARAMETERS + 21 * 4


def test_one_census_draws_the_high_beside_the_end(both):
    """One stage gives one census: not an empty frame, but the stage's high beside its end."""
    from auditor.record.schema import RunRecord
    from auditor.renderers import components_plot
    from auditor.report_models.run import run_report
    figure = components_plot.draw(run_report(RunRecord.from_json(both[1])))
    axes = figure.axes[0]
    assert [t.get_text() for t in axes.get_xticklabels()] == ["at its live-tensor high", "at its end (census)"]
    assert any("Pruner.inputs" in t.get_text() for t in axes.get_legend().get_texts())
