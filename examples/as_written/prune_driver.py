"""A pruning driver shaped like research pruning code (Wanda's layout), written here: `get_llm`
returns (model, tokenizer), the model is moved with `.to(device)` and given `seqlen`, the
first layer's inputs are caught on seeded synthetic calibration data, then layer by layer each
linear's input-activation norms are gathered with forward hooks and its weights are masked by
|weight| x norm.

    python examples/as_written/prune_driver.py --hidden 64 --layers 1 --attn sdpa
    python examples/as_written/prune_driver.py --checkpoint DIR      # from save_pretrained
"""
from __future__ import annotations

import argparse
import contextlib
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    parser.add_argument("--checkpoint", help="a folder written by save_pretrained (sizes then come from it)")
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--nsamples", type=int, default=2)
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def get_llm(args: argparse.Namespace) -> tuple[Any, dict]:
    model: Any
    tokenizer = {"pad_token_id": 0, "eos_token_id": 1}  # stands for a tokenizer: data is synthetic
    if args.checkpoint:
        model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32,
                                                     attn_implementation=args.attn)
    else:
        torch.manual_seed(args.seed)
        config = LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers,
                             num_attention_heads=args.heads, num_key_value_heads=args.heads,
                             intermediate_size=args.intermediate, vocab_size=args.vocab,
                             max_position_embeddings=4096, attn_implementation=args.attn)  # type: ignore[call-arg]
        model = LlamaForCausalLM(config)
    model.eval()
    model.seqlen = args.seqlen
    return model, tokenizer


def calibration_batches(args: argparse.Namespace, vocab: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(args.seed)
    return [torch.randint(0, vocab, (1, args.seqlen), generator=generator) for _ in range(args.nsamples)]


class _Caught(Exception):
    pass


def first_layer_inputs(model: Any, batches: list[torch.Tensor], device: str):
    """Runs the model up to its first decoder layer for each batch, keeping that layer's input
    and keyword arguments (attention mask, positions) and stopping there."""
    inputs: list[torch.Tensor] = []
    kwargs: dict = {}

    def catch(module, args, kw):
        inputs.append(args[0] if args else kw["hidden_states"])
        kwargs.update({k: v for k, v in kw.items() if k != "hidden_states"})
        raise _Caught

    handle = model.model.layers[0].register_forward_pre_hook(catch, with_kwargs=True)
    try:
        for ids in batches:
            with contextlib.suppress(_Caught):
                model(ids.to(device), use_cache=False)
    finally:
        handle.remove()
    return inputs, kwargs


class InputNorms:
    """Sum of squared input activations per input feature of one linear, over every token seen."""

    def __init__(self, layer: nn.Linear):
        self.squared = torch.zeros(layer.in_features, device=layer.weight.device)
        self.tokens = 0

    def add_batch(self, module, inputs, output) -> None:
        x = inputs[0].reshape(-1, inputs[0].shape[-1]).float()
        self.squared += (x * x).sum(dim=0)
        self.tokens += x.shape[0]


def prune_layer(layer: nn.Module, inputs: list[torch.Tensor], kwargs: dict, sparsity: float) -> list[torch.Tensor]:
    linears = {name: m for name, m in layer.named_modules() if isinstance(m, nn.Linear)}
    norms = {name: InputNorms(m) for name, m in linears.items()}
    handles = [m.register_forward_hook(norms[name].add_batch) for name, m in linears.items()]
    with torch.no_grad():
        for x in inputs:
            layer(x, **kwargs)
    for handle in handles:
        handle.remove()
    with torch.no_grad():
        for name, linear in linears.items():
            score = linear.weight.abs() * torch.sqrt(norms[name].squared / norms[name].tokens).reshape(1, -1)
            keep = int(score.shape[1] * (1 - sparsity))
            cut = torch.sort(score, dim=-1, stable=True)[1][:, : score.shape[1] - keep]
            mask = torch.zeros_like(score, dtype=torch.bool).scatter_(1, cut, True)
            linear.weight.data[mask] = 0
        outputs = []
        for x in inputs:  # the pruned layer's outputs feed the next layer
            out = layer(x, **kwargs)
            outputs.append(out[0] if isinstance(out, tuple) else out)
    return outputs


def prune_wanda(args: argparse.Namespace, model: Any, tokenizer: dict, device: str) -> None:
    batches = calibration_batches(args, model.config.vocab_size)
    with torch.no_grad():
        inputs, kwargs = first_layer_inputs(model, batches, device)
    for layer in model.model.layers:
        inputs = prune_layer(layer, inputs, kwargs, args.sparsity)


def main() -> None:
    args = parse_args()
    device = "cpu"
    model, tokenizer = get_llm(args)
    model.to(device)
    prune_wanda(args, model, tokenizer, device)
    zeros = sum(int((m.weight == 0).sum()) for m in model.model.layers.modules() if isinstance(m, nn.Linear))
    total = sum(int(m.weight.numel()) for m in model.model.layers.modules() if isinstance(m, nn.Linear))
    print(f"sparsity {zeros / total:.3f}")


if __name__ == "__main__":
    main()
