"""`gradprobe`: prune a named architecture (random weights) or a local checkpoint folder.

    gradprobe --arch tinystories-33m --sparsity 0.1 --strategy magnitude

Prints what was pruned, the wall time and the process's memory as the OS saw it. Mistakes in
what the user typed end with one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from .masks import mask_digest
from .process_memory import current_rss, peak_rss
from .pruner import GradProbe, check_settings
from .strategies import STRATEGIES

STORAGE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
MiB = 1 << 20


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line saying what is wrong, no usage block, no traceback
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gradprobe", description="Prune a causal LM with GradProbe (baseline).")
    parser.add_argument("--arch", default="tinystories-33m",
                        help="architecture name (random weights) or local checkpoint folder")
    for name in ("layers", "hidden", "vocab", "heads"):
        parser.add_argument(f"--{name}", type=int, help=f"override the architecture's {name}")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--batches", type=int, default=2, help="calibration batches per gradient pass")
    parser.add_argument("--sparsity", type=float, default=0.1, help="candidate fraction s")
    parser.add_argument("--reduction", type=float, default=0.1, help="reduction factor r")
    parser.add_argument("--threshold", type=float, default=2.0, help="gradient threshold tau")
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default="magnitude")
    parser.add_argument("--per-layer", action="store_true", help="one threshold per tensor")
    parser.add_argument("--storage-dtype", choices=sorted(STORAGE_DTYPES), default="fp32",
                        help="dtype of the saved state and gradient records")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own)")
    parser.add_argument("--text", help="calibration text file (needs --tokenizer)")
    parser.add_argument("--tokenizer", help="local tokenizer folder for --text")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        print(run(args))
    except ValueError as error:
        parser.error(str(error))
    return 0


def run(args: argparse.Namespace) -> str:
    storage_dtype = STORAGE_DTYPES[args.storage_dtype]
    check_settings(args.sparsity, args.reduction, args.batches, args.threshold, storage_dtype)
    _check_machine(args)
    from transformers import AutoModelForCausalLM  # noqa: F401  (counted in "before build")

    from architectures import build_model

    rss = {"before build": current_rss()}
    start = time.perf_counter()
    model = build_model(args.arch, seed=args.seed, device=args.device, **_overrides(args))
    rss["after build"], built_s = current_rss(), time.perf_counter() - start
    batches = _calibration(args, model.config.vocab_size)
    pruner = GradProbe(model, args.strategy, per_layer=args.per_layer)  # alive while RSS is read
    result = pruner.prune(batches, sparsity=args.sparsity, num_batches=args.batches,
                          reduction_factor=args.reduction, gradient_threshold=args.threshold,
                          storage_dtype=storage_dtype)
    rss["after prune"] = current_rss()
    return _summary(args, model, result, built_s, rss)


def _summary(args, model, result, built_s: float, rss: dict[str, int]) -> str:
    rows = [
        ("parameters", f"{sum(p.numel() for p in model.parameters()):,}"),
        ("prunable parameters", f"{result.prunable:,}"),
        ("candidates", f"{result.candidates:,} ({100 * result.candidates / result.prunable:.3f}% of prunable)"),
        ("pruned", f"{result.pruned:,} ({100 * result.pruned / max(1, result.candidates):.2f}% of candidates)"),
        ("final sparsity", f"{100 * result.sparsity:.3f}% of prunable parameters"),
        ("wall time", f"{result.seconds:.2f} s pruning, {built_s:.2f} s building the model"),
        *[(f"RSS {when}", f"{value / MiB:,.1f} MiB") for when, value in rss.items()],
        ("peak RSS", f"{peak_rss() / MiB:,.1f} MiB"),
    ]
    if args.device == "cuda":
        rows.append(("CUDA peak allocated", f"{torch.cuda.max_memory_allocated() / MiB:,.1f} MiB"))
    rows.append(("mask digest", mask_digest(result.masks)))
    return "\n".join([_headline(args, model)] + [f"{label:<21}{value}" for label, value in rows])


def _check_machine(args: argparse.Namespace) -> None:
    for option in ("seq_len", "batch_size", "threads", "layers", "hidden", "vocab", "heads"):
        value = getattr(args, option)
        if value is not None and value < (2 if option == "seq_len" else 1):
            raise ValueError(f"--{option.replace('_', '-')} must be at least "
                             f"{2 if option == 'seq_len' else 1}, got {value}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available here; use --device cpu")
    if (args.text is None) != (args.tokenizer is None):
        raise ValueError("--text and --tokenizer go together: give both, or neither for synthetic tokens")
    if args.threads:
        torch.set_num_threads(args.threads)


def _overrides(args: argparse.Namespace) -> dict[str, int]:
    names = ("layers", "hidden", "vocab", "heads")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _calibration(args: argparse.Namespace, vocab_size: int) -> list[torch.Tensor]:
    from architectures.calibration import synthetic_batches, text_file_batches
    if args.text is None:
        return synthetic_batches(vocab_size, args.seq_len, args.batch_size, args.batches, args.seed)
    batches = text_file_batches(args.text, args.tokenizer, args.seq_len, args.batch_size, args.batches)
    largest = max(int(b.max()) for b in batches)
    if largest >= vocab_size:
        raise ValueError(f"the tokenizer gives token id {largest}, outside the model's vocabulary of "
                         f"{vocab_size}: use a matching tokenizer or --vocab {largest + 1}")
    return batches


def _headline(args: argparse.Namespace, model: torch.nn.Module) -> str:
    scope = "per-layer" if args.per_layer else "global"
    return (f"gradprobe: {args.arch} ({model.config.model_type}), {args.strategy} {scope}, "
            f"s={args.sparsity} r={args.reduction} tau={args.threshold}, "
            f"{args.batches} batches of {args.batch_size}x{args.seq_len} tokens, "
            f"{args.storage_dtype} storage, {args.device}, {torch.get_num_threads()} threads")


if __name__ == "__main__":
    sys.exit(main())
