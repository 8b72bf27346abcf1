"""Projecting a program of the user's: `auditor run --target ARCH --model-from MODULE:FUNCTION`
runs the unmodified script again on fake tensors with the target's model where it builds its
own; `auditor validate-projection --model-from ... SCRIPT` checks that against a real run."""
from __future__ import annotations

import json
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from conftest import TINY_LLAMA_SCRIPT, one_error_line

import architectures
import auditor
from auditor.analysis.projection.side_by_side import folded_path
from auditor.capture.tracing.model_from import TargetModel
from auditor.cli import main
from auditor.jobs.program_validation import validate_program
from auditor.jobs.script_projection import Program

TARGET = ["--target", "llama-2-7b", "--target-layers", "2", "--target-hidden", "128",
          "--target-intermediate", "256", "--target-heads", "2", "--target-vocab", "256"]
TARGET_MODEL = TargetModel("llama-2-7b", {"layers": 2, "hidden": 128, "intermediate": 256,
                                          "heads": 2, "vocab": 256})

# An OBS-style pruner in the shape research code has: a model built by a function of its own,
# a helper per linear keeping an in_features^2 statistic, calibration inputs kept for the loop.
ALGORITHM = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def get_llm(layers=1, hidden=32):
    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=64,
                         num_attention_heads=2, num_key_value_heads=2, vocab_size=256)
    model = LlamaForCausalLM(config).eval()
    model.seqlen = 16  # as Wanda's get_llm sets it; the script reads it
    return model


class Stat:
    def __init__(self, linear):
        self.linear = linear
        self.H = torch.zeros(linear.in_features, linear.in_features)

    def add_batch(self, x):
        x = x.reshape(-1, x.shape[-1])
        self.H += x.t() @ x


def prune(model, samples):
    stats = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and "lm_head" not in name:
            stats[name] = Stat(module)
            hooks.append(module.register_forward_hook(
                lambda m, inp, out, s=stats[name]: s.add_batch(inp[0].detach())))
    with torch.no_grad():
        for sample in samples:
            model(sample)
    for hook in hooks:
        hook.remove()
    masks = {}
    for name, stat in stats.items():
        w = stat.linear.weight.data
        score = w.pow(2) * torch.diagonal(stat.H)
        masks[name] = score <= score.median()
    return masks
"""
SCRIPT = """
import os
import sys
import torch
from {module} import get_llm, prune

model = get_llm()
samples = [torch.randint(0, 256, (1, model.seqlen)) for _ in range(3)]
masks = prune(model, samples)
print("traced" if os.environ.get("AUDITOR_TRACED") else "real", len(masks))
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


@pytest.fixture
def program(tmp_path, monkeypatch):
    """A script and its algorithm module in their own folder; returns (script, module name)."""
    monkeypatch.chdir(tmp_path)
    module = f"algo_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(ALGORITHM))
    script = tmp_path / "prune.py"
    script.write_text(textwrap.dedent(SCRIPT.format(module=module)))
    yield script, module
    sys.modules.pop(module, None)


def test_run_projects_an_unmodified_script_to_the_target_model(program, capsys):
    script, module = program
    status = main(["run", "--run-dir", "out", "--model-from", f"{module}:get_llm",
                   "--stage", f"{module}:prune", "--stage", f"{module}:Stat.add_batch", *TARGET,
                   script.name])
    assert status == 0
    err = capsys.readouterr().err
    assert "traced projection to llama-2-7b (layers 2, hidden 128" in err
    record = auditor.load("out")
    assert record.annotations["model_from"]["calls"][0]["class"] == "LlamaForCausalLM"
    record_folder = Path("out")
    (projection,) = json.loads((record_folder / "projections.json").read_text())
    assert projection["method"] == "traced" and "incomplete" not in projection
    # the target's weights, exactly: its own parameter count in the observed dtype (fp32)
    parameters = architectures.count_parameters(TARGET_MODEL.architecture, **TARGET_MODEL.overrides)
    prune_stage = next(s for s in projection["stages"] if s["path"] == "prune")
    weights = sum(c["projected"] for c in prune_stage["components"].values() if c["category"] == "weights")
    assert weights == 4 * parameters
    # one Stat per linear: 7 per layer at the target's in_features (128 or 256 for down_proj)
    last = projection["stages"][-1]
    assert last["path"] == "prune/Stat.add_batch#42"  # 3 samples x 14 linears
    stats = [c["projected"] for n, c in last["components"].items() if n.startswith("Stat[")]
    assert sorted(stats) == sorted([4 * 128 * 128] * 12 + [4 * 256 * 256] * 2)
    # the traced run is the same program: its stages pair with the real run's by path
    traced = auditor.load(record_folder / projection["run_folder"])
    assert {folded_path(s.path) for s in traced.stages} == \
        {folded_path(s.path) for s in record.stages} == {"prune", "prune/Stat.add_batch"}
    report = record_folder / "report.md"
    assert main(["report", "out", "-o", str(report)]) == 0
    text = report.read_text()
    assert "### Projection to llama-2-7b (layers 2, hidden 128, vocab 256, heads 2, intermediate 256)\n" in text
    assert "live tensors, traced" in text
    assert "| &emsp;Stat.add_batch | 21 | 42 |" in text  # calls audited / at the target (2 layers)
    (call,) = traced.annotations["model_from"]["calls"]
    assert call["target_built"]["by"] == "program"  # get_llm ran as written, at the target's sizes
    assert call["attributes"]["seqlen"] == 16 and "copied_attributes" not in call
    assert projection["target_built"]["by"] == "program"


@pytest.mark.heavy
def test_the_traced_projection_matches_a_real_run_at_the_target(program, tmp_path):
    script, module = program
    result = validate_program(Program(script=str(script), cwd=str(tmp_path), path=[str(tmp_path)]),
                              f"{module}:get_llm", TARGET_MODEL,
                              [f"{module}:prune", f"{module}:Stat.add_batch"], tmp_path / "validation")
    targets = {(t["what"], t["method"]): t for t in result["targets"]}
    assert set(targets) == {("peak live tensors", "traced"), ("live tensors, every stage", "traced"),
                            ("peak RSS", "traced"), ("peak RSS inside its band", "traced"),
                            ("RSS inside its band, every stage", "traced")}
    assert abs(targets["peak live tensors", "traced"]["error"]) <= 0.02
    assert abs(targets["live tensors, every stage", "traced"]["error"]) <= 0.02
    assert result["scale_up"] > 8  # the target is held out: nothing of it was measured before
    real = auditor.load(tmp_path / "validation" / "target")
    assert real.annotations["model_from"]["calls"][0]["replaces"]["class"] == "LlamaForCausalLM"


def test_a_failed_script_is_not_projected_and_keeps_its_status(program, capsys):
    script, module = program
    status = main(["run", "--run-dir", "out", "--model-from", f"{module}:get_llm", *TARGET,
                   script.name, "3"])
    assert status == 3
    assert "projection to llama-2-7b" in capsys.readouterr().err
    assert not (script.parent / "out" / "projections.json").exists()


def test_a_model_function_that_returns_no_module_is_a_warning_not_a_new_status(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    module = f"notamodel_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text("def build():\n    return {'weights': 1}\n")
    (tmp_path / "job.py").write_text(f"import auditor\nfrom {module} import build\n"
                                     "with auditor.stage('work'):\n    build()\n")
    try:
        status = main(["run", "--run-dir", "out", "--model-from", f"{module}:build", *TARGET, "job.py"])
    finally:
        sys.modules.pop(module, None)
    assert status == 0
    err = capsys.readouterr().err
    assert "auditor: warning: projection to llama-2-7b" in err and "not a torch.nn.Module" in err
    (projection,) = json.loads((tmp_path / "out" / "projections.json").read_text())  # said where its figure would be
    assert projection["stages"] == [] and "not a torch.nn.Module" in projection["incomplete"]


@pytest.mark.parametrize("args, message", [
    (["--target", "llama-2-7b", "job.py"], "--target needs --model-from"),
    (["--target-layers", "4", "job.py"], "--target-* options need --target"),
    (["--target", "no-such-model", "--model-from", "m:f", "job.py"], "--target: "),
    (["--target", "llama-2-7b", "--target-heads", "7", "--model-from", "json:dumps", "job.py"],
     "--target: hidden size 4096 is not divisible by 7 heads"),
    (["--target", "llama-2-7b", "--model-from", "no_such_module_x:f", "job.py"],
     "--model-from: no module named 'no_such_module_x'"),
])
def test_bad_projection_options_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text("print('ran')\n")
    assert main(["run", "--run-dir", "out", *args]) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_the_python_api_projects_a_function(program, tmp_path):
    from auditor.jobs.script_projection import audit_and_project
    script, module = program
    (tmp_path / f"{module}_main.py").write_text(textwrap.dedent(f"""
        import torch
        from {module} import get_llm, prune

        def main():
            prune(get_llm(), [torch.randint(0, 256, (1, 16))])
    """))
    sys.path.insert(0, str(tmp_path))
    try:
        record = audit_and_project(f"{module}_main:main", model_from=f"{module}:get_llm",
                                   target=TARGET_MODEL, stages=[f"{module}:prune"], run_dir=tmp_path / "api")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(f"{module}_main", None)
    (projection,) = record.annotations["projections"]
    assert projection["target"] == TARGET_MODEL.describe()
    assert projection["live_tensor_peak"] > 4 * architectures.count_parameters(
        TARGET_MODEL.architecture, **TARGET_MODEL.overrides)
    assert auditor.load(tmp_path / "api").annotations["projections"] == [projection]


def test_a_from_config_classmethod_is_replaced_and_attributes_the_program_set_carry_over(tmp_path, monkeypatch, capsys):
    """Third-party scripts build with AutoModelForCausalLM.from_pretrained / from_config inline and
    set plain attributes on the model (Wanda's `model.seqlen`); neither needs an edit."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text(textwrap.dedent("""
        import torch
        import auditor
        from transformers import AutoModelForCausalLM, LlamaConfig

        config = LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                             num_attention_heads=2, num_key_value_heads=2, vocab_size=256)
        model = AutoModelForCausalLM.from_config(config)
        model.seqlen = 8
        with auditor.stage("forward"), torch.no_grad():
            model(torch.randint(0, 256, (1, model.seqlen)))
    """))
    from transformers import AutoModelForCausalLM
    before = AutoModelForCausalLM.__dict__.get("from_config")
    status = main(["run", "--run-dir", "out", "--model-from", "transformers:AutoModelForCausalLM.from_config",
                   *TARGET, "job.py"])
    assert AutoModelForCausalLM.__dict__.get("from_config") is before  # put back as it was
    assert status == 0, capsys.readouterr().err
    (projection,) = json.loads((tmp_path / "out" / "projections.json").read_text())
    assert "incomplete" not in projection
    traced = auditor.load(tmp_path / "out" / projection["run_folder"])
    (call,) = traced.annotations["model_from"]["calls"]
    assert call["parameters"] == architectures.count_parameters(TARGET_MODEL.architecture, **TARGET_MODEL.overrides)
    assert call["target_built"]["by"] == "program"  # from_config ran as written, resized
    assert "copied_attributes" not in call  # nothing copied: the program's own call made it


def test_a_method_of_objects_is_refused_as_model_from(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text("print('ran')\n")
    assert main(["run", "--model-from", "torch.nn:Module.to", *TARGET, "job.py"]) == 2
    assert "is a method of its objects" in one_error_line(capsys)


@pytest.mark.parametrize("args, message", [
    (["--model-from", "m:f"], "needs both --model-from MODULE:NAME and SCRIPT"),
    (["job.py"], "needs both --model-from MODULE:NAME and SCRIPT"),
    (["--stage", "m:f"], "--stage applies to a program of your own"),
    (["--model-from", "m:f", "missing.py"], "script 'missing.py' does not exist"),
    (["--model-from", "no_such_module_y:f", "job.py"], "--model-from: no module named 'no_such_module_y'"),
    (["--model-from", "json:dumps", "--stage", "json:nothing_here", "job.py"], "has no attribute 'nothing_here'"),
])
def test_validate_projection_of_a_program_checks_its_input_first(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text("print('ran')\n")
    assert main(["validate-projection", "--run-dir", "v", "--target", "llama-2-7b", *args]) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "v").exists()


SPARSE_STATE = TINY_LLAMA_SCRIPT + """

def keep_candidates(model, fraction=0.3):
    # the values a pruner may restore, kept only at its candidates: sizes that follow the data
    kept = {}
    for name, p in model.named_parameters():
        if p.dim() == 2:
            threshold = p.detach().abs().flatten().kthvalue(max(int(fraction * p.numel()), 1)).values
            chosen = p.detach().abs() <= threshold
            kept[name] = (p.detach()[chosen].clone(), chosen.nonzero())
    return kept
"""


def test_value_dependent_sizes_of_a_program_are_estimated_from_its_real_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = f"sparse_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(SPARSE_STATE))
    (tmp_path / "keep.py").write_text(f"from {module} import get_llm, keep_candidates\n"
                                      "kept = keep_candidates(get_llm())\n")
    try:
        result = validate_program(Program(script=str(tmp_path / "keep.py"), cwd=str(tmp_path),
                                          path=[str(tmp_path)]),
                                  f"{module}:get_llm", TARGET_MODEL, [f"{module}:keep_candidates"],
                                  tmp_path / "validation")
    finally:
        sys.modules.pop(module, None)
    targets = {(t["what"], t["method"]): t for t in result["targets"]}
    assert abs(targets["peak live tensors", "traced"]["error"]) <= 0.02, result["peak"]
    traced = result["projections"]["traced"]
    sources = {site["source"] for site in traced["data_dependent"]["sites"]}
    assert sources == {"observed"} and not traced["data_dependent"]["unknown"]
    assert traced["peak"]["estimated"] > 0  # the candidates' values and positions rest on it
