"""A projection holds against the script itself: a third-party-shaped script is audited small
and traced at a target with `--model-from`, then the same script runs for real with the
target's sizes as its own arguments, and the traced peak live tensors must match it.

The script builds its model its own way each time: sdpa or eager attention (eager's fp32
score matrix adds about a tenth to this peak: a stand-in of another attention misses by that), moved
and cast with `.to()` with a device map the script reads back (as Wanda does), with a class
call at top level, or loaded with `from_pretrained` from a checkpoint folder."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import architectures
import auditor
from auditor.cli import main
from auditor.facts import units

SCRIPT = '''
import argparse
import sys

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

parser = argparse.ArgumentParser()
for name, default in [("hidden", 64), ("layers", 1), ("heads", 2), ("intermediate", 128),
                      ("vocab", 512), ("seq", 256)]:
    parser.add_argument(f"--{name}", type=int, default=default)
parser.add_argument("--attn", default="sdpa")
parser.add_argument("--build", default="function")
parser.add_argument("--checkpoint")
args = parser.parse_args()


def config():
    return LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers,
                       num_attention_heads=args.heads, num_key_value_heads=args.heads,
                       intermediate_size=args.intermediate, vocab_size=args.vocab,
                       max_position_embeddings=1024, attn_implementation=args.attn)


def get_llm():  # returns (model, tokenizer), as much research code does
    torch.manual_seed(0)
    tokenizer = {"pad_token_id": 0}
    if args.build == "pretrained":
        model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32)
        model.seqlen = args.seq
        return model, tokenizer
    model = LlamaForCausalLM(config()).eval()
    if args.build == "moved":  # moved, cast, and placed as from_pretrained's device_map would
        model = model.to("cpu").to(torch.bfloat16)
        model.hf_device_map = {"": "cpu"}
    return model, tokenizer


def calibrate(model, ids):
    device = model.hf_device_map[""] if args.build == "moved" else "cpu"  # as Wanda reads it
    with torch.no_grad():
        return model(ids.to(device)).logits.float().sum()


model = LlamaForCausalLM(config()).eval() if args.build == "top-level" else get_llm()[0]
calibrate(model, torch.randint(0, 64, (1, args.seq), generator=torch.Generator().manual_seed(0)))
'''

TARGET_SIZES = {"hidden": 256, "layers": 2, "heads": 4, "intermediate": 512, "vocab": 1024}
TARGET = ["--target", "llama-2-7b", *[a for k, v in TARGET_SIZES.items() for a in (f"--target-{k}", str(v))]]
AT_TARGET = [a for k, v in TARGET_SIZES.items() for a in (f"--{k}", str(v))]


@pytest.fixture
def script(tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prune_like.py").write_text(SCRIPT)
    return tmp_path


STAGE = ["--stage", "__main__:calibrate"]


def _projected(folder: Path, model_from: str, args: list[str], run_dir: str = "small") -> dict:
    assert main(["run", "--run-dir", run_dir, *TARGET, "--model-from", model_from, *STAGE,
                 "prune_like.py", *args]) == 0
    (projection,) = json.loads((folder / run_dir / "projections.json").read_text())
    return projection


def _real_peak(folder: Path, args: list[str]) -> int:
    """The script run for real at the target size, in a fresh process as a user runs it."""
    done = subprocess.run([sys.executable, "-m", "auditor", "run", "--run-dir", "real", "--live-tensors",
                           *STAGE, "prune_like.py", *args], cwd=folder, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    real = json.loads((folder / "real" / "run.json").read_text())
    return max(s["live_tensors"]["peak"] for s in real["stages"])


def _projected_and_real(folder: Path, model_from: str, args: list[str], real_args: list[str]):
    return _projected(folder, model_from, args), _real_peak(folder, real_args)


@pytest.mark.parametrize("build, attention", [("moved", "eager"), ("top-level", "sdpa")])
def test_the_traced_peak_is_the_scripts_own_at_the_target_size(script, build, attention, capsys):
    model_from = "transformers:LlamaForCausalLM" if build == "top-level" else "__main__:get_llm"
    options = ["--build", build, "--attn", attention]
    projection, real = _projected_and_real(script, model_from, options, [*options, *AT_TARGET])
    band = projection["peak"]["rss_band"]  # the terminal line gives the peak RSS with its band
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("traced projection to")]
    assert f"(band {units.mib_or_gib(band['low'])} to {units.mib_or_gib(band['high'])})" in line
    assert "incomplete" not in projection
    assert projection["target_built"]["by"] == "program"
    assert f"attention ({attention})" in projection["target_built"]["says"]
    assert abs(projection["peak"]["live_tensors"] / real - 1) <= 0.005


def test_from_pretrained_builds_the_checkpoints_class_at_the_target_size(script):
    # a model read from a checkpoint folder: at the target, the checkpoint's class from its config
    def save(folder: str, hidden: int, layers: int, heads: int, intermediate: int, vocab: int) -> None:
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                     num_key_value_heads=heads, intermediate_size=intermediate,
                                     vocab_size=vocab, max_position_embeddings=1024)).save_pretrained(folder)
    save("small-checkpoint", 64, 1, 2, 128, 512)
    save("target-checkpoint", **TARGET_SIZES)
    small = ["--build", "pretrained", "--checkpoint", "small-checkpoint"]
    real = _real_peak(script, ["--build", "pretrained", "--checkpoint", "target-checkpoint"])
    # named by its function, or as the object the script binds at top level (`model = ...`):
    # its class, found in the real run, is then watched, from_pretrained included
    for model_from, run_dir in [("__main__:get_llm", "by-function"), ("__main__:model", "by-object")]:
        projection = _projected(script, model_from, small, run_dir)
        assert projection["target_built"]["by"] == "program", model_from
        assert abs(projection["peak"]["live_tensors"] / real - 1) <= 0.005, model_from


CUSTOM = '''
import torch


class Net(torch.nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU())


def build():
    return Net()


def step(model):
    return model.layers(torch.ones(4, 32)).sum()


step(build() if __import__("sys").argv[1] == "function" else Net())
'''


def test_a_model_that_is_not_a_transformers_model_gets_a_stand_in_that_says_so(script, capsys):
    (script / "custom.py").write_text(CUSTOM)
    assert main(["run", "--run-dir", "out", *TARGET, "--model-from", "__main__:build",
                 "--stage", "__main__:step", "custom.py", "function"]) == 0
    (projection,) = json.loads((script / "out" / "projections.json").read_text())
    built = projection["target_built"]
    assert built["by"] == "stand-in"
    assert "Net) is not a transformers model" in built["says"] and "not of the program's own model" in built["says"]


def test_a_class_that_is_not_a_transformers_model_is_not_projected(script, capsys):
    (script / "custom.py").write_text(CUSTOM)
    status = main(["run", "--run-dir", "out", *TARGET, "--model-from", "__main__:Net",
                   "--stage", "__main__:step", "custom.py", "class"])
    assert status == 0  # the program's own status: the projection's failure is said, not returned
    err = capsys.readouterr().err
    assert "is not a transformers model" in err
    assert not any("live tensors" in line and "traced projection" in line for line in err.splitlines())
    (projection,) = json.loads((script / "out" / "projections.json").read_text())
    assert projection["stages"] == [] and "is not a transformers model" in projection["incomplete"]
    assert main(["report", "out", "-o", "report.md"]) == 0  # the headline says it failed, no figure
    title = (script / "report.md").read_text().splitlines()[0]
    assert "(traced) failed before any stage: TypeError: --model-from __main__:Net: the program's model (Net)" in title


FACTORY = '''
import torch
from transformers import LlamaConfig, LlamaForCausalLM


class Factory:
    def __init__(self, hidden):
        self.hidden = hidden

    def build(self):
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(hidden_size=self.hidden, num_hidden_layers=1, num_attention_heads=2,
                                            num_key_value_heads=2, intermediate_size=128, vocab_size=512)).eval()


factory = Factory(64)
'''


def test_a_callable_attribute_of_an_object_builds_the_model(script):
    # `--model-from models:factory.build`: a method of a module-level object, as registries do
    (script / "models.py").write_text(FACTORY)
    (script / "run.py").write_text("import torch\nfrom models import factory\n\n\ndef calibrate(model):\n"
                                   "    with torch.no_grad():\n        model(torch.randint(0, 64, (1, 64)))\n\n\n"
                                   "calibrate(factory.build())\n")
    assert main(["run", "--run-dir", "out", *TARGET, "--model-from", "models:factory.build",
                 "--stage", "__main__:calibrate", "run.py"]) == 0
    (projection,) = json.loads((script / "out" / "projections.json").read_text())
    assert projection["target_built"]["by"] == "program" and "incomplete" not in projection
    traced = auditor.load(script / "out" / projection["run_folder"])
    (call,) = traced.annotations["model_from"]["calls"]
    assert call["parameters"] == architectures.count_parameters("llama-2-7b", **TARGET_SIZES)
