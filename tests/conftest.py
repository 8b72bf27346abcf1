"""Small shared fixtures: scaled-down members of the named architectures and their calibration."""
from __future__ import annotations

import pytest
import torch

from architectures import build_model
from architectures.calibration import synthetic_batches

TINY_GPT_NEO = dict(layers=2, hidden=64, vocab=256, heads=4)  # tied head, like TinyStories-33M
TINY_MISTRAL = dict(layers=2, hidden=64, vocab=256, heads=4, kv_heads=2, intermediate=128)  # untied


@pytest.fixture
def one_thread():
    """Tiny tensors gain nothing from a second thread, and idle OpenMP threads spin on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_gpt_neo():
    return build_model("tinystories-33m", seed=0, **TINY_GPT_NEO)


@pytest.fixture
def tiny_mistral():
    return build_model("mistral-7b", seed=0, **TINY_MISTRAL)


@pytest.fixture
def tokens():
    """Two batches of 2 x 16 token ids, inside the tiny vocabulary."""
    return synthetic_batches(256, sequence_length=16, batch_size=2, num_batches=2, seed=0)


# The source of a tiny Llama builder, as research scripts write one (`get_llm()`): the start of
# test programs written to files; each appends its own algorithm below it.
TINY_LLAMA_SCRIPT = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def get_llm():
    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                         num_attention_heads=2, num_key_value_heads=2, vocab_size=256)
    return LlamaForCausalLM(config).eval()
"""


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("auditor: error: ") and "Traceback" not in captured.err
    return lines[0]


def audit_script(folder, args: list[str], cwd) -> tuple[dict, str]:
    """`auditor run --run-dir FOLDER ARGS` then `auditor report`, each as a user would run them (a
    fresh process); returns the run record and the report's markdown."""
    import json
    import subprocess
    import sys
    for command in (["run", "--run-dir", str(folder), *args],
                    ["report", str(folder), "-o", str(folder / "report.md")]):
        done = subprocess.run([sys.executable, "-m", "auditor", *command], cwd=cwd,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((folder / "run.json").read_text()), (folder / "report.md").read_text()
