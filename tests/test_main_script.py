"""The audited script's own functions as stage targets and --model-from (auditor.capture.staging.main_script),
the script run as `python SCRIPT` runs it, and a traced projection of a script that builds its
model and trains it with AdamW in the script itself. Real subprocesses, as a user runs them."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import auditor

SCRIPT = """
    import os, sys
    import torch

    class Pruner:
        def __init__(self, model):
            self.model = model

        def prune_layer(self, index):
            weight = self.model[index].weight
            scores = weight.abs() * torch.ones_like(weight)
            weight.data[scores < scores.median()] = 0

    def build_model():
        return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))

    def main():
        pruner = Pruner(build_model())
        for index in range(2):
            pruner.prune_layer(index)
        print("file", __file__, "argv0", sys.argv[0], "main", sys.modules["__main__"].__file__)

    if __name__ == "__main__":
        main()
"""


def run(tmp_path: Path, *args: str, script: str = SCRIPT) -> subprocess.CompletedProcess:
    (tmp_path / "prune.py").write_text(textwrap.dedent(script))
    return subprocess.run([sys.executable, "-m", "auditor", "run", "--run-dir", str(tmp_path / "run"), *args,
                           "prune.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("module", ["prune", "__main__"])
def test_the_scripts_own_functions_and_methods_are_stages(tmp_path, module):
    done = run(tmp_path, "--stage", f"{module}:main", "--stage", f"{module}:Pruner.prune_layer")
    assert done.returncode == 0, done.stderr
    assert "never called" not in done.stderr
    record = auditor.load(tmp_path / "run")
    assert [s.path for s in record.stages] == ["main", "main/Pruner.prune_layer", "main/Pruner.prune_layer#2"]
    # as python runs it: __file__ absolute, sys.argv[0] as typed
    assert f"file {tmp_path / 'prune.py'} argv0 prune.py main {tmp_path / 'prune.py'}" in done.stdout


def test_a_name_the_script_does_not_bind_is_refused_before_any_work(tmp_path):
    done = run(tmp_path, "--stage", "prune:prune_everything")
    assert done.returncode == 2
    assert done.stderr.strip() == ("auditor: error: stage target 'prune:prune_everything': prune.py binds "
                                   "no 'prune_everything' at its top level")
    assert not (tmp_path / "run").exists()


def test_the_scripts_own_excepthook_prints_its_error(tmp_path):
    script = """
        import sys
        sys.excepthook = lambda kind, error, tb: print(f"[hook] {kind.__name__}: {error}", file=sys.stderr)
        raise ValueError("bad shard")
    """
    done = run(tmp_path, script=script)
    assert done.returncode == 1
    assert done.stderr.splitlines()[0] == "[hook] ValueError: bad shard"  # then the audit's summary
    assert "Traceback" not in done.stderr
    assert auditor.load(tmp_path / "run").exit.status == "failed"


TRAINS = """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    def build_model():
        config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                             num_key_value_heads=4, vocab_size=256, attn_implementation="eager")
        return LlamaForCausalLM(config)

    def train_step(model, optimizer, batch):
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return float(loss)

    if __name__ == "__main__":
        torch.manual_seed(0)
        model = build_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batch = torch.randint(0, 256, (1, 16))
        for _ in range(2):
            train_step(model, optimizer, batch)
"""
TARGET = ["--target", "llama-2-7b", "--target-layers", "1", "--target-hidden", "128", "--target-heads", "4",
          "--target-intermediate", "256", "--target-vocab", "512"]


@pytest.mark.slow
def test_a_script_that_builds_and_trains_its_model_itself_is_projected(tmp_path):
    """--model-from names the script's own function; AdamW reads its step count back (a value
    a traced run knows: fake tensors keep the scalars made from Python numbers)."""
    done = run(tmp_path, "--stage", "prune:train_step", "--model-from", "prune:build_model", *TARGET, script=TRAINS)
    assert done.returncode == 0, done.stderr
    assert "failed" not in done.stdout + done.stderr, done.stdout + done.stderr
    projection = json.loads((tmp_path / "run" / "projections.json").read_text())[0]
    assert "incomplete" not in projection
    assert [s["path"] for s in projection["stages"]] == ["train_step", "train_step#2"]
    # the target's weights, gradients and AdamW's two moments: 4 copies of its parameters, fp32
    params = 2 * 512 * 128 + 4 * 128 * 128 + 3 * 128 * 256 + 3 * 128
    assert projection["live_tensor_peak"] >= 4 * 4 * params


def test_a_run_without_stages_says_why_it_is_not_projected(tmp_path):
    done = run(tmp_path, "--model-from", "prune:build_model", *TARGET, script=TRAINS)
    assert done.returncode == 0, done.stderr
    assert "projection to llama-2-7b" in done.stderr and "skipped: the real run has no stages" in done.stderr
    assert not (tmp_path / "run" / "projections.json").exists()
