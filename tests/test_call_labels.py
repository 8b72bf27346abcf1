"""Labels of staged calls: which module each call worked on, named as the model names it.

A per-linear helper in the style of layerwise pruners (`Stat(layer)` accumulating
`H = X^T X` in `add_batch`, called from forward hooks) on a tiny Llama; known answers: each
call's label is its linear's qualified name, and the helper's census root carries it.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import uuid
import weakref

import pytest
import torch
import transformers
from torch import nn

import auditor
from auditor.analysis.run.stage_groups import fold_key, stage_rows
from auditor.capture.audit import AuditorWarning
from auditor.capture.staging.call_labels import ModuleNames
from auditor.record.schema import RunRecord

HIDDEN, INTERMEDIATE = 32, 64
LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]  # in the order a forward calls them


class Stat:
    """Per-linear state of a layerwise pruner: the input's Gram matrix."""

    def __init__(self, layer: nn.Linear):
        self.layer = layer
        self.H = torch.zeros(layer.in_features, layer.in_features)

    def add_batch(self, inp: torch.Tensor) -> None:
        x = inp.reshape(-1, inp.shape[-1])
        self.H += x.T @ x


def prune_layer(layer: nn.Module, scale: float) -> None:
    """A per-layer step taking the layer as an argument (as `prune(args, model, ...)` takes the model)."""
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.mul_(scale)


def tiny_llama() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=4, vocab_size=128)
    return transformers.LlamaForCausalLM(config)


def collect_stats(model) -> tuple[dict, list]:
    """A Stat per linear of every layer, fed by a forward hook on that linear."""
    stats, hooks = {}, []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and ".layers." in name:
            stats[name] = stat = Stat(module)
            hooks.append(module.register_forward_hook(
                lambda _module, inputs, _output, stat=stat: stat.add_batch(inputs[0])))
    return stats, hooks


def forward(model) -> None:
    with torch.no_grad():
        model(torch.arange(8).reshape(1, 8))


def expected_labels() -> list[str]:
    return [f"model.layers.{layer}.{linear}" for layer in range(2) for linear in LINEARS]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny matrices: a second thread only spins."""


def test_each_call_is_labelled_with_its_linear_and_the_receiver_root_carries_it(tmp_path):
    model = tiny_llama()
    stats, hooks = collect_stats(model)
    with auditor.Audit(tmp_path / "run", census=True, stage_targets=[Stat.add_batch]) as audit:
        forward(model)
    record = audit.record
    labels = expected_labels()
    assert [s["call"] for s in record["stages"]] == [
        {"target": "Stat.add_batch", "index": i, "label": label} for i, label in enumerate(labels, 1)]
    assert [s["name"] for s in record["stages"]][:2] == ["Stat.add_batch", "Stat.add_batch#2"]
    components = record["stages"][-1]["components"]
    for label in labels:  # each Gram matrix, to the byte: in_features^2 float32
        in_features = INTERMEDIATE if label.endswith("down_proj") else HIDDEN
        assert components[f"Stat[{label}].H"]["bytes"] == in_features * in_features * 4
    assert record["audit_overhead_s"]["labels_s"] > 0
    assert auditor.load(tmp_path / "run").stages[-1].call.label == labels[-1]
    del hooks, stats


def test_a_module_argument_is_named_from_its_root_and_nests(tmp_path):
    model = tiny_llama()
    stats, hooks = collect_stats(model)

    with auditor.Audit(tmp_path / "run", stage_targets=[Stat.add_batch, prune_layer]) as audit, auditor.stage("plain"):
        for layer in model.model.layers:
            prune_layer(layer, 0.5)
        forward(model)
    calls = {s["path"]: s["call"] for s in audit.record["stages"]}
    assert calls["plain"] is None
    # the first module seen is a layer passed alone: named from the model holding it, which
    # the one scan found
    assert calls["plain/prune_layer"]["label"] == "model.layers.0"
    assert calls["plain/prune_layer#2"] == {"target": "prune_layer", "index": 2,
                                            "label": "model.layers.1"}
    assert calls["plain/Stat.add_batch#14"]["label"] == "model.layers.1.mlp.down_proj"
    del hooks, stats


class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))

    def step(self):
        return self.weight * 2


def test_a_staged_method_of_a_module_is_named_by_its_place_in_the_tree(tmp_path):
    net = nn.Sequential(Scale(), nn.Sequential(nn.ReLU(), Scale()))
    with auditor.Audit(tmp_path / "run", stage_targets=[Scale.step]) as audit:
        net[0].step()
        net[1][1].step()
    assert [s["call"]["label"] for s in audit.record["stages"]] == ["0", "1.1"]  # no root prefix


def test_a_user_hook_overrides_and_none_keeps_the_default(tmp_path):
    model = tiny_llama()
    stats, hooks = collect_stats(model)
    seen = []

    def label(target, args, kwargs):
        seen.append((target, type(args[0]).__name__, kwargs))
        layer = args[0].layer
        return "the last one" if layer is model.model.layers[1].mlp.down_proj else None
    with auditor.Audit(tmp_path / "run", census=True, stage_targets=[Stat.add_batch],
                       stage_label=label) as audit:
        forward(model)
    labels = [s["call"]["label"] for s in audit.record["stages"]]
    assert labels == expected_labels()[:-1] + ["the last one"]
    assert seen[0] == ("Stat.add_batch", "Stat", {})
    assert audit.record["stages"][-1]["components"]["Stat[the last one].H"]["bytes"] == \
        INTERMEDIATE * INTERMEDIATE * 4
    del hooks, stats


@pytest.mark.parametrize("hook, says", [
    (lambda target, args, kwargs: 1 / 0, "raised ZeroDivisionError"),
    (lambda target, args, kwargs: ["not", "a", "str"], "returned a list, not a str or None"),
])
def test_a_broken_hook_is_switched_off_with_a_warning_and_the_run_completes(tmp_path, hook, says):
    model = tiny_llama()
    stats, hooks = collect_stats(model)
    with (pytest.warns(AuditorWarning, match=says),
          auditor.Audit(tmp_path / "run", stage_targets=[Stat.add_batch], stage_label=hook) as audit):
        forward(model)
    record = audit.record
    assert record["exit"]["status"] == "ok"
    assert [s["call"]["label"] for s in record["stages"]] == expected_labels()  # the defaults
    assert sum(says in w and "switched off" in w for w in record["warnings"]) == 1
    assert float(stats["model.layers.0.mlp.down_proj"].H.sum()) > 0  # the program's work was done
    del hooks


def test_stage_label_must_be_callable(tmp_path):
    with pytest.raises(ValueError, match="stage_label should be a function"):
        auditor.Audit(tmp_path / "run", stage_label="mod:fn")
    assert not (tmp_path / "run").exists()


def test_no_module_is_kept_alive_by_the_labels(tmp_path):
    def build_and_run():
        model = tiny_llama()
        stats, hooks = collect_stats(model)
        forward(model)
        return weakref.ref(model), weakref.ref(model.model.layers[1].mlp.down_proj)
    with auditor.Audit(tmp_path / "run", census=True, stage_targets=[Stat.add_batch]) as audit:
        refs = build_and_run()
        gc.collect()
        alive_during = [ref() is not None for ref in refs]
    gc.collect()
    assert alive_during == [False, False]
    assert [ref() for ref in refs] == [None, None]
    assert audit.record["stages"][-1]["call"]["label"] == "model.layers.1.mlp.down_proj"


def test_scans_are_rate_limited_and_find_the_true_root():
    names = ModuleNames()
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2)))
    inner = model[1][0]
    names.seed(model[1])  # provisionally a root of its own
    assert names.name(inner) == "0" and names.needs_scan(inner)
    names.scan()
    assert names.name(inner) == "1.0" and names.name(model) == "Sequential"
    assert not names.needs_scan(inner)
    late = nn.Linear(2, 2)  # created after the scan: unknown, and no second scan right away
    assert names.name(late) is None and not names.needs_scan(late)
    assert names.scans == 1


def test_auditor_run_label_end_to_end(tmp_path):
    helper = f"stats_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{helper}.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Stat:
            def __init__(self, layer):
                self.layer = layer
                self.H = torch.zeros(layer.in_features, layer.in_features)

            def add_batch(self, inp):
                x = inp.reshape(-1, inp.shape[-1])
                self.H += x.T @ x

        def prune(model):
            stats = [Stat(m) for m in model.modules() if isinstance(m, nn.Linear)]
            for _ in range(3):
                for stat in stats:
                    stat.add_batch(torch.ones(4, stat.layer.in_features))
            return stats

        def short_name(target, args, kwargs):
            label = None
            if target == "Stat.add_batch":
                label = "linear with " + str(args[0].layer.in_features) + " inputs"
            return label
    """))
    (tmp_path / "script.py").write_text(textwrap.dedent(f"""
        import torch
        from torch import nn
        import {helper}
        torch.set_num_threads(1)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        {helper}.prune(model)
    """))
    done = subprocess.run([sys.executable, "-m", "auditor", "run", "--out", "o", "--census",
                           "--label", f"{helper}:short_name", "--stage", f"{helper}:prune",
                           "--stage", f"{helper}:Stat.add_batch", "script.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "o" / "run.json").read_text())
    calls = [s["call"] for s in record["stages"]]
    assert calls[0] == {"target": "prune", "index": 1, "label": "Sequential"}  # hook: None
    assert [c["label"] for c in calls[1:]] == ["linear with 8 inputs", "linear with 16 inputs"] * 3
    components = record["stages"][-1]["components"]
    assert components["Stat[linear with 16 inputs].H"]["bytes"] == 16 * 16 * 4
    assert "auditor run --out o --census --label" in record["command"]
    # the summary: 7 stages in 2 rows, the 6 calls folded with where their highest peak was
    rows = [line for line in done.stderr.splitlines() if "Stat.add_batch" in line and "│" in line]
    assert len(rows) == 1 and "│     6 │" in rows[0] and "linear with" in rows[0], done.stderr
    assert "7 stages in 2 rows" in done.stderr


def test_folded_rows_keep_every_stage_in_tree_order():
    def entry(path, parent, call=None, peak=1):
        return {"name": path.rsplit("/", 1)[-1], "path": path, "parent": parent, "call": call,
                "status": "ok", "rss": {"start": 0, "end": 0, "peak": peak}, "start_s": 0, "end_s": 1}

    def call(target, index):
        return {"target": target, "index": index, "label": f"layer {index}"}
    stages = [entry("layer", None, call("layer", 1)), entry("layer/stat", "layer"),
              entry("eval", None),
              entry("layer#2", None, call("layer", 2)), entry("layer#2/stat", "layer#2"),
              entry("layer#2/Stat.add", "layer#2", call("Stat.add", 1))]
    record = RunRecord.from_json({"schema": "auditor.run/1", "name": "x", "command": "x", "started_at": "t",
                                  "device": "cpu", "environment": {}, "process": {}, "stages": stages,
                                  "peak": {"rss": None}})
    rows = stage_rows(record)  # the folding both the report and `auditor run` show
    assert [(fold_key(row.stages[0]), row.depth, row.count) for row in rows] == [
        ("layer", 0, 2), ("stat", 1, 2), ("Stat.add", 1, 1), ("eval", 0, 1)]
    assert sorted(id(s) for row in rows for s in row.stages) == sorted(map(id, record.stages))
