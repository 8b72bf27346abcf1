"""Copies of the weights are found by provenance, not by size (issue 30).

tests/copy_provenance/research_pruner.py keeps what research code keeps, each made on a line
marked `# line: <what>`: (b) a backup of every parameter (`p.detach().clone()`), (c) a backup of
layer 0 only, (d) a state dict cloned, (e) every parameter moved to fp16, (a) every calibration
input of every linear cached (as many bytes as the weights and more, by coincidence), (f) a
per-column norm statistic accumulated. It runs under `auditor run --stage` of each function and
under the five-line API (`Audit`, `track("model")`, one `stage("prune")`).

Sizes by hand (a tiny Llama, hidden 64, 2 layers, vocab 256, untied): the parameters are
427,264 B in 21 storages (embed and head 256 x 64 fp32 = 65,536 B each; per layer q, o 64 x 64,
k, v 32 x 64, gate, up, down 128 x 64: 36,864 elements, and 2 norms of 64; the final norm 64).
Layer 0's 9 parameters: 36,992 elements = 147,968 B, 35% of the weights. The fp16 copy is
213,632 B and copies all 427,264 B. The cache: 2 layers x 4 samples x 32 tokens x (6 linears
of 64 inputs + down's 128) x 4 B = 524,288 B, 1.23x the weights.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from conftest import audit_script

import auditor
from auditor import load
from auditor.analysis.findings.component_rules import copies_by_size
from auditor.analysis.findings.rules import findings
from auditor.analysis.run.attribution import weights_bytes
from auditor.analysis.run.stages import census_order
from auditor.capture.census.provenance import live_provenance
from auditor.capture.probes.live_tensors import LiveTensorMeter

HERE = Path(__file__).resolve().parent / "copy_provenance"
SCRIPT = HERE / "research_pruner.py"
PARAMETERS, LAYER_0, CACHE = 427_264, 147_968, 2 * 4 * 32 * (6 * 64 + 128) * 4
STAGED = ["prune", "keep_backup", "keep_first_layer", "keep_state_dict", "keep_half", "cache_inputs",
          "column_norms"]


def line(what: str) -> int:
    """The script's line marked `# line: <what>`."""
    lines = SCRIPT.read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if text.rstrip().endswith(f"# line: {what}"))


def named(components: dict, what: str) -> tuple[str, object]:
    """The component named by the line that made `what` (`allocated at research_pruner.py:N ...`)."""
    [found] = [(n, c) for n, c in components.items() if f"research_pruner.py:{line(what)} " in n]
    return found


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    folder = tmp_path_factory.mktemp("provenance") / "cli"
    stages = [a for s in STAGED for a in ("--stage", f"research_pruner:{s}")]
    audit_script(folder, ["--census", "--live-tensors", *stages, "research_pruner.py"], HERE)
    return load(folder)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    folder = tmp_path_factory.mktemp("provenance") / "api"
    sys.path.insert(0, str(HERE))
    try:
        import research_pruner as research
    finally:
        sys.path.remove(str(HERE))
    model = research.build_model()
    samples = research.calibration_samples()
    with auditor.Audit(folder, census=True, live_tensors=True):
        auditor.track("model", model)
        with auditor.stage("prune"):
            kept = research.prune(model, samples)
    assert set(kept) == {"backup", "partial", "state dict", "fp16", "cache", "norms"}
    del kept, model
    return load(folder)


def _end(record) -> dict:
    return next(s for s in record.stages if s.path == "prune").components


def _full_copies(record) -> dict:
    return {f.evidence["component"]: f for f in findings(record) if f.rule == "full-copy"}


@pytest.mark.parametrize("side", ["cli", "api"])
def test_copies_are_saved_copies_with_exact_bytes_and_the_rest_is_not(side, request):
    record = request.getfixturevalue(side)
    components = _end(record)
    assert weights_bytes(next(s for s in record.stages if s.path == "prune")) == PARAMETERS
    assert components["model.parameters"].category == "weights"
    assert components["model.buffers"].category == "buffers"  # rotary tables: never masks
    expected = {"backup": (PARAMETERS, PARAMETERS, 21), "partial": (LAYER_0, LAYER_0, 9),
                "state dict": (PARAMETERS, PARAMETERS, 21), "fp16": (PARAMETERS // 2, PARAMETERS, 21)}
    for what, (held, copied, tensors) in expected.items():
        name, item = named(components, what)
        assert (item.category, item.bytes, item.copy_bytes, item.weights_copied, item.parameters_copied) == \
            ("saved copies", held, held, copied, tensors), (what, name)
    # (a) the calibration cache: larger than the weights, made from activations: not a copy
    name, cache = named(components, "cache")
    assert (cache.category, cache.bytes, cache.copy_bytes) == ("activations and temporaries", CACHE, None)
    # (f) the statistic and every other storage: nothing copied from the weights
    copies = {n for n, c in components.items() if c.copy_bytes}
    assert copies == {named(components, what)[0] for what in expected}


@pytest.mark.parametrize("side", ["cli", "api"])
def test_the_full_copy_finding_rests_on_provenance_and_states_how_much(side, request):
    record = request.getfixturevalue(side)
    components = _end(record)
    found = _full_copies(record)
    assert set(found) == {named(components, what)[0] for what in ("backup", "partial", "state dict", "fp16")}
    backup = found[named(components, "backup")[0]]
    assert backup.severity == "high" and backup.evidence["basis"] == "provenance"
    assert (backup.evidence["bytes"], backup.evidence["weights_copied"]) == (PARAMETERS, PARAMETERS)
    assert "holds a copy of 100% of the weights (417.2 KiB copied from 21 of the 21 parameter tensors)" \
        in backup.statement
    partial = found[named(components, "partial")[0]]
    assert partial.severity == "medium" and partial.evidence["share_of_weights"] == round(LAYER_0 / PARAMETERS, 4)
    assert "holds a copy of 35% of the weights (144.5 KiB copied from 9 of the 21 parameter tensors)" \
        in partial.statement
    half = found[named(components, "fp16")[0]]
    assert half.severity == "high" and half.evidence["bytes"] == PARAMETERS // 2
    assert "50% of the bytes they copy: another precision" in half.statement
    state = found[named(components, "state dict")[0]]
    assert state.severity == "high" and state.evidence["weights_copied"] == PARAMETERS
    # the model's own buffers are neither a copy nor retained memory
    retained = next(f for f in findings(record) if f.rule == "retained-at-end")
    assert "model.buffers" not in retained.evidence["components"]
    if side == "api":  # one stage is enough
        assert backup.evidence["stages"] == 1 and backup.evidence["from_stage"] == "prune"


def test_the_size_rule_alone_would_have_called_the_cache_a_copy(cli):
    """The premise: the cache is as large as the weights at consecutive stage ends, so only
    provenance keeps it out; a record without the meter's provenance falls back to size, and says so."""
    cache = named(_end(cli), "cache")[0]
    assert cache not in _full_copies(cli)
    by_size = {f.evidence["component"] for f in copies_by_size(census_order(cli), lambda name: True)}
    assert cache in by_size
    older = copy.deepcopy(cli)
    older.probes["live_tensors"].copies = None  # a record from before provenance
    found = _full_copies(older)
    assert cache in found and found[cache].evidence["basis"] == "size"
    assert "by size only" in found[cache].statement


def test_at_the_live_tensor_high_copies_are_saved_copies(api):
    stage = next(s for s in api.stages if s.path == "prune")
    rows = stage.live_tensors.at_peak.rows
    copies = sum(r.bytes for r in rows if r.category == "saved copies")
    assert copies == 2 * PARAMETERS + PARAMETERS // 2 + LAYER_0  # backup, state dict, fp16, layer 0
    assert not any(r.category == "masks" for r in rows)


def test_the_meter_follows_copies_of_copies_and_not_computed_values():
    linear = torch.nn.Linear(32, 16)
    weight_bytes = 32 * 16 * 4
    meter = LiveTensorMeter()
    meter.seed_existing()
    with meter:
        half = linear.weight.detach().half()               # a copy, in half the bytes
        back = half.float()                                # a copy of a copy: still the weights
        rows = linear.weight[torch.tensor([0, 1, 2, 3])]   # 4 of 16 rows: a quarter
        into = torch.empty(16, 32).copy_(linear.weight)    # copied into a fresh storage
        scaled = linear.weight * 2                         # computed: not a copy
        norms = linear.weight.norm(dim=0)                  # a statistic: not a copy
        seen = live_provenance()
    assert seen.followed
    held = {key: covered for key, (covered, _) in seen.copies.items()}

    def covered(t):
        return held.get((t.untyped_storage().device, t.untyped_storage().data_ptr()))
    assert (covered(half), covered(back), covered(rows), covered(into)) == (
        weight_bytes, weight_bytes, weight_bytes // 4, weight_bytes)
    assert covered(scaled) is None and covered(norms) is None and covered(linear.weight) is None
    assert not live_provenance().followed  # the meter stopped: nothing follows copies now
