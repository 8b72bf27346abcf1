"""Prune a random tiny Llama with one of the example pruners (see pruning/).

    python examples/prune_tiny_llama.py --method hessian
    auditor run --census --live-tensors \
        --stage pruning.hessian:prune_with_hessians --stage pruning.hessian:HessianStat.add_batch \
        examples/prune_tiny_llama.py --method hessian
"""
from __future__ import annotations

import argparse
import gc

import torch
from pruning.activation_norm import prune_by_activation_norm
from pruning.evaluation import perplexity
from pruning.hessian import prune_with_hessians
from pruning.leaky import collect_features
from pruning.tiny_llama import build_llama, calibration_samples

METHODS = {"hessian": prune_with_hessians, "activation-norm": prune_by_activation_norm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=sorted(METHODS), default="hessian")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--intermediate", type=int, default=344)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument("--leak", action="store_true",
                        help="first run a calibration step that leaves its features in a reference cycle")
    parser.add_argument("--eval", action="store_true",
                        help="then the perplexity of the pruned model on the samples, in one batch")
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    model = build_llama(args.layers, args.hidden, args.intermediate, vocab=args.vocab)
    samples = calibration_samples(args.samples, args.length, vocab=args.vocab)
    if args.leak:
        gc.disable()  # as a job that tuned the collector off would: the leak stays until the end
        print(f"feature norm {collect_features(model, samples):.3f}")
    masks = METHODS[args.method](model, samples, args.sparsity)
    kept = sum(int((~m).sum()) for m in masks.values()) / sum(m.numel() for m in masks.values())
    print(f"{args.method}: {len(masks)} linears pruned, {kept:.1%} of their weights kept")
    if args.eval:
        print(f"perplexity after pruning: {perplexity(model, samples):.1f}")


if __name__ == "__main__":
    main()
