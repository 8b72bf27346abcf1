"""`python -m gradprobe.streaming`: write a weights folder, or prune one with one layer in memory.

    python -m gradprobe.streaming write-weights --arch tinystories-33m --output-dir weights/
    python -m gradprobe.streaming write-weights --arch mistral-7b --generate --dtype bf16 --output-dir /tmp/w
    python -m gradprobe.streaming prune --weights weights/ --output-dir pruned/ --sparsity 0.1

`write-weights` builds the model with `architectures.build_model` (the same weights as
`gradprobe --arch NAME --seed N`) unless `--generate`, which writes seeded random weights one
tensor at a time, for models too big to build. Mistakes in what the user typed end with one line
on stderr and exit status 2. A folder written is `--output-dir` (`--out`, its old spelling,
still works), a weights folder read is `--weights`.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import shutil
import sys
import time
from typing import Any

from architectures.options import (
    HelpFormatter,
    add_seed_argument,
    add_size_arguments,
    add_threads_argument,
    check_model_options,
    epilog,
    size_overrides,
)

from ..cli import (
    EXIT_STATUSES,
    CommandParser,
    MiB,
    OneLineErrors,
    add_pruning_arguments,
    add_strategy_argument,
    check_output_files,
    check_pruning_arguments,
    size,
    storage_dtypes,
)
from ..settings import STORAGE_DTYPES

PROG = "python -m gradprobe.streaming"
WRITE_EXAMPLES = [f"{PROG} write-weights --arch tinystories-33m --output-dir weights/",
                  f"{PROG} write-weights --arch mistral-7b --generate --dtype bf16 --output-dir /tmp/w"]
PRUNE_EXAMPLES = [f"{PROG} prune --weights weights/ --output-dir pruned/ --sparsity 0.1 --progress"]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(prog=PROG, formatter_class=HelpFormatter,
                           description="GradProbe with the model on disk, one decoder layer in memory.",
                           epilog=epilog(WRITE_EXAMPLES + PRUNE_EXAMPLES, EXIT_STATUSES))
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=CommandParser)
    write = commands.add_parser("write-weights", help="write a model as a streaming weights folder",
                                description="Write a model as a streaming weights folder (config.json + "
                                            "safetensors).", epilog=epilog(WRITE_EXAMPLES, EXIT_STATUSES))
    write.add_argument("--arch", required=True, help="architecture name or local checkpoint folder")
    add_size_arguments(write)
    _add_output_dir(write, "new folder for the weights")
    write.add_argument("--dtype", choices=STORAGE_DTYPES, default="fp32", help="stored dtype")
    add_seed_argument(write)
    write.add_argument("--generate", action="store_true",
                       help="random weights tensor by tensor (never the whole model in memory)")
    prune = commands.add_parser("prune", help="prune a weights folder",
                                description="Prune a weights folder with one decoder layer in memory; "
                                            "write the pruned weights and the masks.",
                                epilog=epilog(PRUNE_EXAMPLES, EXIT_STATUSES))
    add_prune_arguments(prune)
    return parser


def _add_output_dir(parser: argparse.ArgumentParser, help: str) -> None:
    """--output-dir DIR (args.output_dir), required; --out, its old spelling, still works."""
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--output-dir", metavar="DIR", help=help)
    given.add_argument("--out", dest="output_dir", metavar="DIR", help=argparse.SUPPRESS)


def add_prune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weights", required=True, metavar="DIR",
                        help="weights folder to prune (config.json + safetensors)")
    _add_output_dir(parser, "new folder for the pruned weights")
    parser.add_argument("--masks-out", metavar="FILE", help="masks file (default: DIR/masks.safetensors)")
    parser.add_argument("--summary-json", metavar="FILE", help="also write the summary as JSON here")
    parser.add_argument("--scratch", metavar="DIR", help="folder for G0 between passes (default: inside DIR)")
    add_pruning_arguments(parser)
    add_strategy_argument(parser)
    add_seed_argument(parser, help="seed of the synthetic calibration tokens")
    add_threads_argument(parser)
    parser.add_argument("--progress", action="store_true", help="one line on stderr per stage")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_arguments(args)
    except ValueError as error:
        parser.error(str(error))
    made = _outputs_to_make(args)
    try:
        text = write_weights(args) if args.command == "write-weights" else prune(args)
    except ValueError as error:
        parser.error(str(error))
    except OSError as error:
        if error.errno not in DISK_FULL:
            raise
        print(f"{PROG}: error: {disk_full(args, made, error)}", file=sys.stderr)
        return 1
    print(text)
    return 0


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _outputs_to_make(args: argparse.Namespace) -> list[str]:
    """The paths this run creates (the output folder, checked new or empty, and the output files
    that do not exist yet): what a full disk makes it remove. An output folder that exists (empty)
    is listed with a trailing separator: its contents go, it stays."""
    made = [args.output_dir if not os.path.exists(args.output_dir) else os.path.join(args.output_dir, "")]
    for option in ("masks_out", "summary_json"):
        path = getattr(args, option, None)
        if path and not os.path.exists(path):
            made.append(path)
    return made


def disk_full(args: argparse.Namespace, made: list[str], error: OSError) -> str:
    """One line: the disk filled, what had been written, and that it was removed (a pruned
    folder missing layers would load as a model with some unpruned, or fail later)."""
    files, written = 0, 0
    for path in made:
        if os.path.isdir(path):
            kept_folder = path.endswith(os.sep)
            for folder, _, names in os.walk(path):
                for name in names:
                    files += 1
                    with contextlib.suppress(OSError):
                        written += os.path.getsize(os.path.join(folder, name))
            with contextlib.suppress(OSError):  # the folder was new or empty: nothing of the user's in it
                for entry in os.listdir(path):
                    entry_path = os.path.join(path, entry)
                    if os.path.isdir(entry_path) and not os.path.islink(entry_path):
                        shutil.rmtree(entry_path, ignore_errors=True)
                    else:
                        os.remove(entry_path)
                if not kept_folder:
                    os.rmdir(path)
        elif os.path.lexists(path):
            files += 1
            with contextlib.suppress(OSError):
                written += os.path.getsize(path)
                os.remove(path)
    what = "the weights" if args.command == "write-weights" else "the pruned weights and masks"
    needs = f"; the weights folder read is {size(_folder_bytes(args.weights))}" if args.command == "prune" else ""
    return (f"the disk is full ({error.strerror or error}) while writing {what} to {args.output_dir}: "
            f"{files} file(s), {size(written)}, had been written; removed, none is a usable output{needs}. "
            "Free space or choose another --output-dir, and run again")


def _folder_bytes(folder: str) -> int:
    total = 0
    for name in os.listdir(folder):
        with contextlib.suppress(OSError):
            total += os.path.getsize(os.path.join(folder, name))
    return total


def check_arguments(args: argparse.Namespace) -> None:
    """Every mistake in what was typed, found without torch and before anything is written."""
    if args.command == "write-weights":
        check_model_options(args)
        _check_new_folder(args.output_dir, "--output-dir")
        return
    if not os.path.isdir(args.weights):  # a folder, never a name: say so before names are looked up
        raise ValueError(f"--weights: folder {args.weights!r} does not exist (write one with write-weights)")
    check_pruning_arguments(args, "weights")
    _check_new_folder(args.output_dir, "--output-dir")
    if os.path.abspath(args.output_dir) == os.path.abspath(args.weights):
        raise ValueError(f"--output-dir {args.output_dir!r} is the weights folder: give a new folder for the "
                         "pruned weights")
    check_output_files(args, ("masks_out", "summary_json"))
    if args.scratch is not None and not os.path.isdir(args.scratch):
        raise ValueError(f"--scratch: folder {args.scratch!r} does not exist")


def _check_new_folder(path: str, option: str) -> None:
    """A folder to write into: new or empty, in a folder that exists and can be written."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{option} {path!r} is a file; give a new folder")
    if os.path.isdir(path) and os.listdir(path):
        raise ValueError(f"{option} {path!r} is not empty: give a new or empty folder")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"{option}: folder {parent!r} does not exist")
    if not os.access(path if os.path.isdir(path) else parent, os.W_OK | os.X_OK):
        raise ValueError(f"{option}: cannot write in {path!r} (permission denied)")


def write_weights(args: argparse.Namespace) -> str:
    from architectures import build_model, make_config

    from ..process_memory import peak_rss
    from .writing import generate_random_weights, save_model
    overrides: dict[str, Any] = size_overrides(args)  # Any: as `gradprobe.cli._overrides` says why
    dtype = storage_dtypes()[args.dtype]
    start = time.perf_counter()
    if args.generate:
        generate_random_weights(make_config(args.arch, **overrides), args.output_dir, args.seed, dtype)
    else:
        save_model(build_model(args.arch, seed=args.seed, dtype=dtype, **overrides), args.output_dir)
    return (f"wrote {args.arch} ({args.dtype}, seed {args.seed}, "
            f"{'generated tensor by tensor' if args.generate else 'built with build_model'}) to {args.output_dir} "
            f"in {time.perf_counter() - start:.1f} s; peak RSS {size(peak_rss())}")


def prune(args: argparse.Namespace) -> str:
    import torch

    from architectures.calibration import synthetic_batches

    from ..masks import mask_digest
    from ..process_memory import current_rss, peak_rss
    from .pruner import StreamingGradProbe
    if args.threads:
        torch.set_num_threads(args.threads)
    rss_start = current_rss()
    pruner = StreamingGradProbe(args.weights, args.strategy, progress=_printer() if args.progress else None)
    vocab = pruner.model.config.vocab_size
    batches = synthetic_batches(vocab, args.seq_len, args.batch_size, args.batches, args.seed)
    result = pruner.prune(batches, args.output_dir, sparsity=args.sparsity, num_batches=args.batches,
                          reduction_factor=args.reduction, gradient_threshold=args.threshold,
                          masks_out=args.masks_out, scratch=args.scratch)
    summary = {
        "variant": "streaming", "weights": args.weights, "out": result.out, "masks": result.masks_path,
        "parameters": sum(torch.Size(s).numel() for s in pruner.model.shapes.values()),
        "prunable": result.prunable, "candidates": result.candidates, "pruned": result.pruned,
        "sparsity": result.sparsity, "prune_seconds": result.seconds, "rss_start": rss_start,
        "rss_end": current_rss(), "peak_rss": peak_rss(),
        "decoder_layers_loaded": pruner.model.layers_loaded,
        "most_decoder_layers_resident": pruner.model.most_layers_resident,
        "mask_digest": mask_digest(result.masks),
    }
    if args.summary_json:
        with open(args.summary_json, "w") as file:
            json.dump(summary, file, indent=1)
    return _summary_text(args, pruner, summary)


def _summary_text(args, pruner, s: dict) -> str:
    import torch
    config = pruner.model.config
    rows = [
        ("parameters", f"{s['parameters']:,}"),
        ("prunable parameters", f"{s['prunable']:,}"),
        ("candidates", f"{s['candidates']:,} ({100 * s['candidates'] / s['prunable']:.3f}% of prunable)"),
        ("pruned", f"{s['pruned']:,} ({100 * s['pruned'] / max(1, s['candidates']):.2f}% of candidates)"),
        ("final sparsity", f"{100 * s['sparsity']:.3f}% of prunable parameters"),
        ("wall time", f"{s['prune_seconds']:.2f} s pruning"),
        ("layers loaded", f"{s['decoder_layers_loaded']} decoder layer loads, "
                          f"at most {s['most_decoder_layers_resident']} resident"),
        ("RSS at start", size(s['rss_start'])),
        ("RSS after prune", size(s['rss_end'])),
        ("peak RSS", size(s['peak_rss'])),
        ("output", f"{s['out']} (masks: {s['masks']})"),
        ("mask digest", s["mask_digest"]),
    ]
    head = (f"gradprobe streaming: {args.weights} ({config.model_type}), {args.strategy} global, "
            f"s={args.sparsity} r={args.reduction} tau={args.threshold}, {args.batches} batches of "
            f"{args.batch_size}x{args.seq_len} tokens, stored {_stored_dtype(pruner)}, computed in fp32, "
            f"cpu, {torch.get_num_threads()} threads")
    return "\n".join([head] + [f"{label:<21}{value}" for label, value in rows])


def _stored_dtype(pruner) -> str:
    dtypes = {str(pruner.folder.stored_tensor(n).dtype).replace("torch.", "") for n in pruner.model.shapes}
    return "/".join(sorted(dtypes))


def _printer():
    from ..process_memory import current_rss, peak_rss
    start = time.perf_counter()

    def show(moment) -> None:
        if moment.what != "batch":
            live = ", ".join(f"{name} {size / MiB:,.0f}" for name, size in moment.resident.items())
            print(f"[{time.perf_counter() - start:7.1f} s] {moment.what:<6} {moment.stage:<10} "
                  f"RSS {current_rss() / MiB:,.0f} MiB, peak {peak_rss() / MiB:,.0f} MiB | {live} MiB",
                  file=sys.stderr, flush=True)
    return show


if __name__ == "__main__":
    sys.exit(main())
