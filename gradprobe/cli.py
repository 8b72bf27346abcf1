"""`gradprobe`: prune a named architecture (random weights) or a local checkpoint folder.

    gradprobe --arch tinystories-33m --sparsity 0.1 --strategy magnitude [--variant lean]
              [--masks-out masks.safetensors] [--summary-json summary.json]

Prints what was pruned, the wall time and the process's memory as the OS saw it. Mistakes in
what the user typed end with one line on stderr and exit status 2.

For comparing variants from other processes (`auditor compare`):
  --masks-out FILE     the final masks as safetensors: one uint8 tensor (0/1, 1 = pruned) per
                       parameter name, every parameter included
  --summary-json FILE  {variant, architecture, parameters, prunable, candidates, pruned, sparsity,
                       mask_digest, rss_before_build, rss_after_build, rss_after_prune, peak_rss,
                       prune_seconds, build_seconds}: counts, bytes and seconds
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from architectures.options import (
    HelpFormatter,
    add_device_argument,
    add_seed_argument,
    add_sequence_arguments,
    add_size_arguments,
    add_threads_argument,
    check_model_options,
    epilog,
    finite_float,
    installed_version,
    size_overrides,
)

from . import settings

MiB, GiB = 1 << 20, 1 << 30


def size(n: float) -> str:
    """Bytes as the auditor's reports write them: MiB below 1 GiB, GiB from 1 GiB on."""
    return f"{n / GiB:,.2f} GiB" if abs(n) >= GiB else f"{n / MiB:,.1f} MiB"
EXIT_STATUSES: list[tuple[int | str, str]] = [
    (0, "done"), (1, "the run failed (python's traceback above; a full disk: one line, the partial output removed)"),
    (2, "bad input: one line on stderr saying what is wrong, before any work")]
# A tokenizer folder holds at least one of these (what AutoTokenizer.from_pretrained reads).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model")


def storage_dtypes() -> dict:
    """torch dtypes by --storage-dtype name. Made on first use: this module imports without torch,
    so a mistake on the command line is answered before torch loads."""
    import torch
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def __getattr__(name: str):  # gradprobe.cli.STORAGE_DTYPES, as before
    if name == "STORAGE_DTYPES":
        return storage_dtypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class OneLineErrors(argparse.ArgumentParser):
    """Mistakes on the command line: one line on stderr, exit status 2."""

    def error(self, message: str):  # one line saying what is wrong, no usage block, no traceback
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


class CommandParser(OneLineErrors):
    """A subcommand's parser: one-line errors, and help laid out as the top level's."""

    def __init__(self, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(**kwargs)


def add_pruning_arguments(parser) -> None:
    """The calibration shape and decision settings every GradProbe command takes (checked by
    `check_pruning_arguments`)."""
    add_sequence_arguments(parser)
    parser.add_argument("--batches", type=int, default=2, metavar="N", help="calibration batches per gradient pass")
    parser.add_argument("--sparsity", type=finite_float, default=0.1, metavar="S", help="candidate fraction s")
    parser.add_argument("--reduction", type=finite_float, default=0.1, metavar="R", help="reduction factor r")
    parser.add_argument("--threshold", type=finite_float, default=2.0, metavar="TAU",
                        help="gradient threshold tau")


def add_variant_argument(parser) -> None:
    """--variant NAME: which GradProbe runs (checked by settings.check_variant_name)."""
    parser.add_argument("--variant", default="baseline", metavar="NAME",
                        help=f"GradProbe variant: {', '.join(settings.VARIANTS)}")


def add_strategy_argument(parser) -> None:
    """--strategy: how candidates are scored."""
    parser.add_argument("--strategy", choices=settings.STRATEGIES, default="magnitude",
                        help="how candidates are scored: |w| (magnitude) or |w| times input norms (wanda)")


def check_pruning_arguments(args, architecture_option: str = "arch") -> None:
    """ValueError (one line) for a pruning setting or model option GradProbe cannot run with;
    no torch, so it is answered at once."""
    settings.check_numbers(args.sparsity, args.reduction, args.batches, args.threshold)
    check_model_options(args, architecture_option)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(prog="gradprobe", description="Prune a causal LM with GradProbe or one of its variants.",
                           formatter_class=HelpFormatter,
                           epilog=epilog(["gradprobe --arch tinystories-33m --variant lean",
                                          "gradprobe --arch ./my-checkpoint --strategy wanda "
                                          "--masks-out masks.safetensors"],
                                         EXIT_STATUSES))
    parser.add_argument("--version", action="version", version=f"gradprobe {installed_version()}")
    parser.add_argument("--arch", default="tinystories-33m",
                        help="architecture name (random weights) or local checkpoint folder")
    add_size_arguments(parser)
    add_pruning_arguments(parser)
    add_strategy_argument(parser)
    parser.add_argument("--per-layer", action="store_true", help="one threshold per tensor")
    parser.add_argument("--storage-dtype", choices=settings.STORAGE_DTYPES,
                        help="dtype of the saved state and gradient records (default: the variant's, "
                             "fp32 except low-precision's bf16)")
    add_variant_argument(parser)
    parser.add_argument("--masks-out", metavar="FILE",
                        help="write the final masks as safetensors: one uint8 0/1 tensor per parameter")
    parser.add_argument("--summary-json", metavar="FILE", help="write the summary as JSON (bytes, seconds)")
    add_seed_argument(parser)
    add_threads_argument(parser)
    parser.add_argument("--text", metavar="FILE", help="calibration text file (needs --tokenizer)")
    parser.add_argument("--tokenizer", metavar="DIR", help="local tokenizer folder for --text")
    add_device_argument(parser)
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
    check_arguments(args)
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedModel  # noqa: F401  (counted in "before build")

    from architectures import build_model

    from .process_memory import current_rss
    from .variants import make_pruner

    if args.threads:
        torch.set_num_threads(args.threads)
    storage_dtype = storage_dtypes()[args.storage_dtype] if args.storage_dtype else None

    rss = {"before build": current_rss()}
    start = time.perf_counter()
    model = build_model(args.arch, seed=args.seed, device=args.device, **_overrides(args))
    rss["after build"], built_s = current_rss(), time.perf_counter() - start
    assert isinstance(model, PreTrainedModel)  # a causal LM: its config gives the vocabulary
    batches = _calibration(args, model.config.vocab_size)
    pruner = make_pruner(args.variant, model, args.strategy, per_layer=args.per_layer)  # alive while RSS is read
    settings = dict(sparsity=args.sparsity, num_batches=args.batches, reduction_factor=args.reduction,
                    gradient_threshold=args.threshold)
    if storage_dtype is not None:  # otherwise the variant's own default
        settings["storage_dtype"] = storage_dtype
    result = pruner.prune(batches, **settings)
    rss["after prune"] = current_rss()
    summary = _summary(args, model, result, built_s, rss)
    _write_outputs(args, result, summary)
    return _render(args, model, _storage_name(pruner, storage_dtype), summary)


def _summary(args, model, result, built_s: float, rss: dict[str, int]) -> dict:
    """The run in numbers: counts, bytes and seconds (what --summary-json writes)."""
    from .masks import mask_digest
    from .process_memory import peak_rss
    return {
        "variant": args.variant, "architecture": args.arch,
        "parameters": sum(p.numel() for p in model.parameters()), "prunable": result.prunable,
        "candidates": result.candidates, "pruned": result.pruned, "sparsity": result.sparsity,
        "mask_digest": mask_digest(result.masks),
        "rss_before_build": rss["before build"], "rss_after_build": rss["after build"],
        # The kernel updates its high-water mark lazily: it can lag a fresh RSS reading by a page or two.
        "rss_after_prune": rss["after prune"], "peak_rss": max(peak_rss(), *rss.values()),
        "prune_seconds": result.seconds, "build_seconds": built_s,
    }


def _render(args, model, storage: str, summary: dict) -> str:
    rows = [
        ("variant", summary["variant"]),
        ("parameters", f"{summary['parameters']:,}"),
        ("prunable parameters", f"{summary['prunable']:,}"),
        ("candidates", f"{summary['candidates']:,} "
                       f"({100 * summary['candidates'] / summary['prunable']:.3f}% of prunable)"),
        ("pruned", f"{summary['pruned']:,} "
                   f"({100 * summary['pruned'] / max(1, summary['candidates']):.2f}% of candidates)"),
        ("final sparsity", f"{100 * summary['sparsity']:.3f}% of prunable parameters"),
        ("wall time", f"{summary['prune_seconds']:.2f} s pruning, "
                      f"{summary['build_seconds']:.2f} s building the model"),
        *[(f"RSS {when}", size(summary['rss_' + when.replace(' ', '_')]))
          for when in ("before build", "after build", "after prune")],
        ("peak RSS", size(summary['peak_rss'])),
    ]
    if args.device.startswith("cuda"):
        import torch
        rows.append(("CUDA peak allocated", size(torch.cuda.max_memory_allocated())))
    rows.append(("mask digest", summary["mask_digest"]))
    return "\n".join([_headline(args, model, storage)] + [f"{label:<21}{value}" for label, value in rows])


def _write_outputs(args, result, summary: dict) -> None:
    if args.summary_json:
        with open(args.summary_json, "w") as out:
            json.dump(summary, out, indent=2)
            out.write("\n")
    if args.masks_out:
        write_masks(result.masks, args.masks_out)


def write_masks(masks, path: str) -> None:
    """The masks as safetensors, one uint8 0/1 tensor per parameter, written one mask at a time:
    masks kept as bits are unpacked one tensor at a time, never all at once."""
    import torch

    from .streaming.safetensors_files import SafetensorsWriter
    packed = getattr(masks, "packed", None)  # PackedMasks: shapes known without unpacking
    layout = {name: (torch.uint8, tuple((packed or masks)[name].shape)) for name in masks}
    with SafetensorsWriter(path, layout) as writer:
        for name in masks:
            # A bool tensor viewed as uint8 is the same bytes, 0 or 1: no copy on CPU.
            writer.write(name, masks[name].to("cpu").view(torch.uint8))


def check_arguments(args: argparse.Namespace) -> None:
    """Every mistake in what was typed, without torch: a typo should not cost a whole prune."""
    check_pruning_arguments(args)
    settings.check_variant_name(args.variant)
    if (args.text is None) != (args.tokenizer is None):
        raise ValueError("--text and --tokenizer go together: give both, or neither for synthetic tokens")
    for path, what, is_kind in ((args.text, "text file", os.path.isfile),
                                (args.tokenizer, "tokenizer folder", os.path.isdir)):
        if path is not None and not is_kind(path):
            raise ValueError(f"{what} {path!r} " + ("does not exist" if not os.path.exists(path) else
                                                     f"is not a {what.split()[-1]}"))
    if args.tokenizer is not None and not any(os.path.isfile(os.path.join(args.tokenizer, name))
                                              for name in TOKENIZER_FILES):
        raise ValueError(f"tokenizer folder {args.tokenizer!r} holds none of {', '.join(TOKENIZER_FILES)} "
                         "(save_pretrained writes them)")
    check_output_files(args, ("masks_out", "summary_json"))


def check_output_files(args: argparse.Namespace, options: tuple[str, ...]) -> None:
    """Each output file given can be written: its folder exists and is writable, the path is not a
    folder, and no two options name the same file. Creates nothing."""
    seen: dict[str, str] = {}
    for option in options:
        path = getattr(args, option)
        if not path:
            continue
        flag = f"--{option.replace('_', '-')}"
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ValueError(f"{flag}: folder {folder!r} does not exist")
        if os.path.isdir(path):
            raise ValueError(f"{flag}: {path!r} is a folder; give a file name")
        if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
            raise ValueError(f"{flag}: cannot write {path!r} (permission denied)")
        same = seen.setdefault(os.path.realpath(path), flag)
        if same != flag:
            raise ValueError(f"{same} and {flag} both name {path!r}; give each its own file")


def _storage_name(pruner, asked) -> str:
    """The storage dtype the run used: the one asked for, else the variant's own default."""
    import torch
    dtype = asked or getattr(pruner, "storage_dtype", torch.float32)
    return next((name for name, known in storage_dtypes().items() if known == dtype), str(dtype))


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The size overrides given: ints, by size names only, which build_model's other keywords are not
    (typed Any because mypy cannot tell a `**dict[str, int]` from those keywords)."""
    return size_overrides(args)


def _calibration(args: argparse.Namespace, vocab_size: int) -> list:
    from architectures.calibration import synthetic_batches, text_file_batches
    if args.text is None:
        return synthetic_batches(vocab_size, args.seq_len, args.batch_size, args.batches, args.seed)
    batches = text_file_batches(args.text, args.tokenizer, args.seq_len, args.batch_size, args.batches)
    largest = max(int(b.max()) for b in batches)
    if largest >= vocab_size:
        raise ValueError(f"the tokenizer gives token id {largest}, outside the model's vocabulary of "
                         f"{vocab_size}: use a matching tokenizer or --vocab {largest + 1}")
    return batches


def _headline(args: argparse.Namespace, model, storage: str) -> str:
    import torch
    scope = "per-layer" if args.per_layer else "global"
    return (f"gradprobe: {args.arch} ({model.config.model_type}), {args.strategy} {scope}, "
            f"s={args.sparsity} r={args.reduction} tau={args.threshold}, "
            f"{args.batches} batches of {args.batch_size}x{args.seq_len} tokens, "
            f"{storage} storage, {args.device}, {torch.get_num_threads()} threads")


if __name__ == "__main__":
    sys.exit(main())
