"""The every-stage target of a projection validation: judged on the stages whose sizes are exact;
the stages resting on estimated value-dependent sizes are reported beside it, never dropped."""
from auditor.analysis.projection.validation import check_targets
from auditor.renderers.validation_markdown import _resting_on_estimates
from auditor.report_models.validation import targets

MIB = 2**20


def _stage(path, real, traced, estimated=0):
    return {"path": path, "real": {"tensor_peak": real * MIB, "rss_peak": 400 * MIB},
            "traced": {"tensor_peak": traced * MIB, "rss_peak": 400 * MIB, "estimated": estimated * MIB}}


def _result(stages):
    return {"stages": stages, "projections": {"traced": {}},
            "peak": {"real": {"live_tensors": 100 * MIB, "rss": 400 * MIB},
                     "traced": {"live_tensors": 100 * MIB, "rss": 401 * MIB}}}


def _every_stage(result):
    return next(t for t in check_targets(result) if t["what"] == "live tensors, every stage")


def test_a_stage_resting_on_estimates_is_reported_beside_the_target_not_judged_by_it():
    result = _result([_stage("prune", 100, 101), _stage("prune/decide#2", 16, 19.6, estimated=5)])
    target = _every_stage(result)
    assert target["met"] and abs(target["error"] - 0.01) < 1e-9 and target["stages"] == 1
    worst = target["resting_on_estimates"]
    assert worst["stages"] == 1 and worst["path"] == "prune/decide#2"
    assert abs(worst["error"] - (19.6 / 16 - 1)) < 1e-9 and abs(worst["estimated_share"] - 5 / 19.6) < 1e-9
    text = "\n".join(_resting_on_estimates(targets(check_targets(result))))
    assert "judged on the 1 stage whose sizes are exact" in text and "+22.50%" in text and "`prune/decide#2`" in text


def test_an_exact_stage_off_by_more_than_two_percent_misses():
    result = _result([_stage("prune", 100, 100), _stage("prune/save", 40, 41.2),
                      _stage("prune/decide", 16, 16.1, estimated=1)])
    target = _every_stage(result)
    assert target["met"] is False and abs(target["error"] - 0.03) < 1e-9
    assert target["resting_on_estimates"]["stages"] == 1


def test_without_estimates_every_stage_is_judged():
    target = _every_stage(_result([_stage("prune", 100, 100.5), _stage("prune/a", 10, 10.1)]))
    assert target["met"] and target["stages"] == 2 and target["resting_on_estimates"] is None
