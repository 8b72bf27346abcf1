"""The GradProbe job passes its real run's data-dependent sizes to its traced runs: the
sparse-state variant's candidate-indexed records (sized by counts read back from its bitmask)
are projected at their real size instead of as nothing, and the record says which bytes rest
on estimates."""
from __future__ import annotations

import pytest

from auditor.analysis.projection.traced import project_traced
from auditor.jobs import gradprobe as job

pytestmark = pytest.mark.slow  # a real audit and two traced runs in fresh processes (~15 s)

SMALL = job.Settings(variant="sparse-state", overrides={"layers": 1, "hidden": 64, "vocab": 2048})
RECORDS = ("pruner.saved_state", "pruner.gradients_original", "pruner.gradients_reduced")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sparse")
    real = job.audit(SMALL, folder / "real")
    traced = job.traced_audit(SMALL, folder / "traced", observed_sizes=real.annotations["data_dependent_sizes"])
    return real, traced


def test_real_run_records_its_sizes(runs):
    real, _ = runs
    assert any(s["op"] == "aten::count_nonzero" and s["site"].startswith("gradprobe/")
               for s in real.annotations["data_dependent_sizes"])


def test_candidate_records_projected_at_their_real_size(runs):
    real, traced = runs
    projection = project_traced(real, traced)
    last = projection["stages"][-1]
    real_last = next(s for s in reversed(real.stages) if s.path == last["path"])
    for name in RECORDS:
        projected = last["components"][name]
        assert abs(projected["projected"] / real_last.components[name].bytes - 1) < 0.01
        assert projected["estimated"] == projected["projected"]  # nothing of it without estimates
    # the peak says what of it rests on estimates; which stage peaks in RSS is the real run's noise
    # (build model and the prune's phases lie within a few MiB), so the prune's own figure is checked
    by_path = {s["path"]: s for s in projection["stages"]}
    assert projection["peak"]["estimated"] == by_path[projection["peak"]["stage"]]["estimated"]
    assert by_path["prune"]["estimated"] > 0
    assert {s["source"] for s in projection["data_dependent"]["sites"] if s["output_numel"]} == {"observed"}


def test_lower_bound_run_has_them_empty(runs):
    _, traced = runs
    by_path = {s["path"]: s for s in traced.annotations["estimated_bytes"]["stages"]}
    assert set(RECORDS) <= set(by_path["prune"]["components"])
