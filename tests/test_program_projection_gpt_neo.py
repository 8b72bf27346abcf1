"""A program of the user's on another family: a SparseGPT-style pruner (Hessians averaged in
forward hooks, Cholesky inverse, row-wise top-k, blockwise OBS updates) on its own GPT-Neo,
projected by tracing to a held-out GPT-Neo 17x larger and checked against the real run there."""
from __future__ import annotations

import textwrap
import uuid

import pytest

from auditor.capture.tracing.model_from import TargetModel
from auditor.jobs.program_validation import validate_program
from auditor.jobs.script_projection import Program

ALGORITHM = """
import torch
from transformers import GPTNeoConfig, GPTNeoForCausalLM


def get_model(layers=2, hidden=64, vocab=1000):
    torch.manual_seed(0)
    config = GPTNeoConfig(vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=4,
                          attention_types=[[["global", "local"], layers // 2]],
                          max_position_embeddings=256, intermediate_size=4 * hidden)
    return GPTNeoForCausalLM(config).eval()


class Collector:
    def __init__(self, layer):
        self.layer, self.H, self.n = layer, None, 0
        self.handle = layer.register_forward_hook(self.hook)

    def hook(self, module, inputs, output):
        x = inputs[0].reshape(-1, inputs[0].shape[-1]).float()
        if self.H is None:
            self.H = torch.zeros(x.shape[1], x.shape[1])
        self.H.mul_(self.n / (self.n + x.shape[0]))
        self.n += x.shape[0]
        self.H.add_(x.t() @ x, alpha=2 / self.n)


@torch.no_grad()
def prune(model, samples, sparsity=0.5, block=32):
    head = model.get_output_embeddings()
    collectors = [Collector(m) for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    for x in samples:
        model(x)
    masks = []
    for c in collectors:
        c.handle.remove()
        W = c.layer.weight.data.float().clone()
        H = c.H + 0.01 * torch.diag(c.H).mean() * torch.eye(c.H.shape[0])
        inverse = torch.cholesky_inverse(torch.linalg.cholesky(H))
        d = torch.diag(inverse)
        drop = torch.topk(W.pow(2) / d.pow(2), int(W.shape[1] * sparsity), dim=1, largest=False).indices
        mask = torch.ones_like(W, dtype=torch.bool).scatter_(1, drop, False)
        for start in range(0, W.shape[1], block):
            cols = slice(start, start + block)
            error = (W[:, cols] * ~mask[:, cols]) / d[cols]
            W[:, cols] *= mask[:, cols]
            W[:, start + block:] -= error @ inverse[cols, start + block:]
        c.layer.weight.data.copy_(W)
        masks.append(mask)
        c.H = None
    return masks
"""

SCRIPT = """
import torch
from {module} import get_model, prune

torch.set_num_threads(2)
model = get_model()
samples = [torch.randint(0, model.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(i))
           for i in range(4)]
print("pruned", sum(int((~m).sum()) for m in prune(model, samples)))
"""


@pytest.mark.slow
def test_a_sparsegpt_style_pruner_on_gpt_neo_is_projected_within_the_targets(tmp_path):
    module = f"obs_{uuid.uuid4().hex[:8]}"  # a fresh name: no module of an earlier test is reused
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(ALGORITHM))
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(module=module))
    target = TargetModel("tinystories-33m", {"layers": 2, "hidden": 256, "vocab": 4000, "heads": 4})
    result = validate_program(Program(script=str(script), cwd=str(tmp_path), path=[str(tmp_path)]),
                              f"{module}:get_model", target, [f"{module}:prune", f"{module}:Collector.hook"],
                              tmp_path / "validation")
    assert result["scale_up"] > 8
    for checked in result["targets"]:  # peak and every stage within 2%, RSS within 5%
        assert checked["met"], checked
    estimated = [t.get("resting_on_estimates") for t in result["targets"]]
    assert not any(estimated)  # top-k and scatter have static shapes: nothing rests on estimates
