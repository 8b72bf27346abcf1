"""The projection-validation report's model, made once from a validation result: each projected
figure beside the real one with its error, the targets missed or not checked, what ran."""
from auditor.analysis.projection.validation import check_targets
from auditor.renderers.validation_markdown import render
from auditor.report_models.validation import GradProbeRun, validation_report

MIB = 2**20
SITE = {"site": "prune.py:12 decide", "op": "aten::nonzero", "source": "observed", "ratio": 0.1,
        "calls": 4, "output_numel": 4096, "conflicts": None}


def _result():
    result = {
        "stages": [{"path": "prune", "real": {"tensor_peak": 100 * MIB, "rss_peak": 400 * MIB},
                    "traced": {"tensor_peak": 101 * MIB, "rss_peak": 390 * MIB, "estimated": 0}},
                   {"path": "prune/save", "real": {"tensor_peak": 0, "rss_peak": 300 * MIB}, "traced": None}],
        "peak": {"real": {"live_tensors": 100 * MIB, "rss": 400 * MIB, "stage": "prune"},
                 "traced": {"live_tensors": 101 * MIB, "rss": 360 * MIB, "stage": "prune"}},
        "components": [{"name": "model.weights", "category": "parameters", "real": 60 * MIB, "traced": 60 * MIB}],
        "components_stage": "prune",
        "projections": {"traced": {"data_dependent": {"sites": [SITE]}, "peak": {"estimated": 2 * MIB}}},
        "small": {"label": "tiny", "parameters": 1000, "run": "v/small/run.json",
                  "settings": {"variant": "lean", "strategy": "magnitude", "sequence_length": 16,
                               "batch_size": 1, "batches": 2, "sparsity": 0.5}},
        "target": {"label": "bigger", "parameters": 8000, "run": "v/target/run.json"},
        "folder": "v", "available": 8 << 30, "margin": 1 << 30, "scale_up": 8.0, "scale_up_range": [4, 20]}
    result["targets"] = check_targets(result)
    return result


def test_the_model_holds_every_figure_beside_the_real_one():
    report = validation_report(_result())
    assert report.methods == ("traced",) and report.in_range and isinstance(report.ran, GradProbeRun)
    live, rss = report.peaks
    assert abs(live.figure.projected["traced"].error - 0.01) < 1e-9
    assert abs(rss.figure.projected["traced"].error + 0.1) < 1e-9
    assert [t.what for t in report.missed] == ["peak RSS"]  # -10% against 5%
    save = report.stages[1]
    assert save.tensors.projected["traced"] == save.rss.projected["traced"]  # no traced figure: no error
    assert save.tensors.projected["traced"].bytes is None and save.tensors.projected["traced"].error is None
    found = report.data_dependent
    assert found is not None and found.sites[0].conflicts == 0 and "2.0 MiB rest on" in (found.note or "")
    assert report.fit is None and not report.not_checked


def test_the_renderer_formats_the_model():
    text = render(validation_report(_result()), ["auditor", "validate-projection"])
    assert "**Missed:** peak RSS (traced) -10.00% against ±5%." in text
    assert "| prune/save | 0 B | - | - | 300.0 MiB | - | - |" in text
    assert "GradProbe variant `lean`, strategy `magnitude`" in text
