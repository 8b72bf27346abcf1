"""`auditor validate-projection --held-out-args ARGS`: the held-out real run is the program as
written, its own arguments building its model at the target's size, nothing replaced; the
validation says which held-out run it was, in the report and on the terminal."""
from __future__ import annotations

import json
import sys
import textwrap
import uuid

import pytest
from conftest import one_error_line

import auditor
from auditor.cli import main

NET = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build(layers, hidden, intermediate):
    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=intermediate,
                         num_attention_heads=2, num_key_value_heads=2, vocab_size=256,
                         max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


def forward(model, tokens):
    with torch.no_grad():
        return model(tokens).logits.sum()
"""
DRIVER = """
import argparse
import torch
from {module} import build, forward

parser = argparse.ArgumentParser()
parser.add_argument("--layers", type=int, default=1)
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--intermediate", type=int, default=128)
parser.add_argument("--batch", type=int, default=1)
args = parser.parse_args()
model = build(args.layers, args.hidden, args.intermediate)
forward(model, torch.randint(0, 256, (args.batch, 16)))
"""
SMALL = ["--layers", "1", "--hidden", "64", "--intermediate", "128", "--batch", "2"]
BIG = ["--layers", "2", "--hidden", "128", "--intermediate", "256", "--batch", "2"]
TARGET = ["--target", "llama-2-7b", "--target-layers", "2", "--target-hidden", "128",
          "--target-intermediate", "256", "--target-heads", "2", "--target-vocab", "256"]


def write_driver(folder) -> str:
    """drive.py and its model module in `folder`; returns the module's name."""
    module = f"net_{uuid.uuid4().hex[:8]}"
    (folder / f"{module}.py").write_text(textwrap.dedent(NET))
    (folder / "drive.py").write_text(textwrap.dedent(DRIVER.format(module=module)))
    return module


@pytest.fixture
def driver(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = write_driver(tmp_path)
    yield module
    sys.modules.pop(module, None)


def _parameters(layers: int, hidden: int, intermediate: int) -> int:
    vocab, embeddings = 256, 2  # untied: the input embedding and the head
    per_layer = 4 * hidden * hidden + 3 * hidden * intermediate + 2 * hidden
    return embeddings * vocab * hidden + layers * per_layer + hidden


def test_held_out_args_run_the_program_as_written_at_the_target(driver, tmp_path, capsys):
    status = main(["validate-projection", *TARGET, "--run-dir", "v", "--model-from", f"{driver}:build",
                   "--stage", f"{driver}:forward", "--held-out-args", " ".join(BIG), "drive.py", *SMALL])
    assert status in (0, 1), capsys.readouterr().err  # 1: a target missed, judged below
    result = json.loads((tmp_path / "v" / "validation.json").read_text())
    assert result["small"]["program"]["args"] == SMALL  # the script's --layers, not the command's
    held = auditor.load(tmp_path / "v" / "target")
    (call,) = held.annotations["model_from"]["calls"]
    assert call["parameters"] == _parameters(2, 128, 256) == result["target"]["parameters"]
    assert "replaces" not in call  # observed, nothing replaced
    assert result["held_out"]["how"] == "own arguments" and result["held_out"]["args"] == BIG
    assert held.command.endswith(" ".join(BIG))
    # the traced projection, held against the program as written: its live tensors hold
    targets = {(t["what"], t["method"]): t for t in result["targets"]}
    assert abs(targets["peak live tensors", "traced"]["error"]) <= 0.03
    sentence = result["held_out"]["sentence"]
    assert "as written" in sentence and "nothing replaced" in sentence
    report = (tmp_path / "v" / "validation.md").read_text()
    assert sentence in report.split("## Targets")[0]  # near the top
    assert sentence in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("held_out, script, message", [
    ("", True, "--held-out-args is empty"),
    ("  ", True, "--held-out-args is empty"),
    ("--layers '4", True, "no closing quotation"),
    ("--layers 4", False, "--held-out-args are the held-out run's arguments for SCRIPT"),
])
def test_bad_held_out_args_are_refused_before_any_run(driver, tmp_path, capsys, held_out, script, message):
    program = ["--model-from", f"{driver}:build", "drive.py"] if script else []
    assert main(["validate-projection", *TARGET, "--run-dir", "v", "--held-out-args", held_out, *program]) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "v").exists()
