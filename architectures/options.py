"""The options of every command that runs a model, defined and checked once: which model (--arch
and the size overrides), the tokens it reads (--seq-len, --batch-size, --seed), where it runs
(--device, --threads). The checks need neither torch nor transformers, so a mistake costs one line
and milliseconds, before anything is imported, built or written.

    add_size_arguments(parser)        --layers --hidden --vocab --heads --intermediate
    add_sequence_arguments(parser)    --seq-len (several with many=True), --batch-size
    add_seed_argument(parser)         --seed
    add_device_argument(parser)       --device cpu | cuda | cuda:N
    add_threads_argument(parser)      --threads N
    finite_float                      the type of every float option: nan and inf are refused
    check_model_options(args)         ValueError (one line) for anything the run could not take
    HelpFormatter, epilog             every command's help: defaults shown one way, examples and
                                      exit statuses below the options
    installed_version()               the installed distribution's version, for --version
"""
from __future__ import annotations

import argparse
import math
import re

import architectures

SIZES = ("layers", "hidden", "vocab", "heads", "intermediate")
MIN_SEQUENCE_LENGTH = 2  # a causal LM's loss predicts each next token: one token has none
SEEDS = (-(2**63), 2**64 - 1)  # what torch.manual_seed accepts
_DEVICE = re.compile(r"cpu|cuda(:[0-9]+)?")


def add_size_arguments(parser, prefix: str = "", scale: str = "") -> None:
    """--PREFIXlayers ... overrides of the architecture's sizes (a scaled-down member)."""
    for name in SIZES:
        parser.add_argument(f"--{prefix}{name}", type=int, metavar="N",
                            help=f"{scale}override the architecture's {name}")


def size_overrides(args, prefix: str = "") -> dict[str, int]:
    """The size overrides given, by name (without the prefix)."""
    given = {name: getattr(args, prefix.replace("-", "_") + name, None) for name in SIZES}
    return {name: value for name, value in given.items() if value is not None}


def add_sequence_arguments(parser, many: bool = False) -> None:
    if many:
        parser.add_argument("--seq-len", nargs="+", type=int, default=[128], metavar="N",
                            help="sequence lengths to sweep")
    else:
        parser.add_argument("--seq-len", type=int, default=128, metavar="N",
                            help="tokens per sequence")
    parser.add_argument("--batch-size", type=int, default=1, metavar="N", help="sequences per batch")


def add_seed_argument(parser, help: str = "seed of the random weights and tokens") -> None:
    parser.add_argument("--seed", type=int, default=0, metavar="N", help=help)


def add_device_argument(parser) -> None:
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")


def add_threads_argument(parser) -> None:
    parser.add_argument("--threads", type=int, metavar="N", help="torch threads (default: torch's own)")


def finite_float(text: str) -> float:
    """argparse type: a float, but not nan or inf (no setting here means anything by them)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def check_model_options(args, architecture_option: str = "arch", prefix: str = "") -> None:
    """ValueError (one line) for a model option of `args` the run could not take. Options the
    command lacks are skipped. torch is imported only to ask whether a CUDA device exists, and
    transformers (with torch) only, last, to load a checkpoint folder's config as the run will."""
    for name in ("batch_size", "threads"):
        at_least(getattr(args, name, None), 1, f"--{name.replace('_', '-')}")
    seed = getattr(args, "seed", None)
    if seed is not None and not SEEDS[0] <= seed <= SEEDS[1]:
        raise ValueError(f"--seed must be between {SEEDS[0]:,} and {SEEDS[1]:,} (torch's seeds), got {seed:,}")
    lengths = getattr(args, "seq_len", None)
    lengths = [] if lengths is None else lengths if isinstance(lengths, list) else [lengths]
    names = getattr(args, architecture_option)
    overrides = size_overrides(args, prefix)
    for name in names if isinstance(names, list) else [names]:
        option = f"--{architecture_option.replace('_', '-')}"
        try:
            architectures.config_fields(name, **overrides)
        except architectures.UnknownArchitecture as error:
            raise ValueError(f"{option}: {error}") from None
        for length in lengths:
            check_sequence_length(name, length, overrides)
    check_device(getattr(args, "device", None))
    for name in names if isinstance(names, list) else [names]:
        if architectures.is_checkpoint_folder(name):
            architectures.make_config(name, **overrides)


def check_sequence_length(architecture: str, length: int, overrides: dict | None = None,
                          option: str = "--seq-len") -> None:
    at_least(length, MIN_SEQUENCE_LENGTH, option, "a causal LM's loss needs a next token to predict")
    limit = architectures.max_positions(architecture, **(overrides or {}))
    if limit is not None and length > limit:
        raise ValueError(f"{option} {length} exceeds {architecture}'s maximum of {limit} positions")


def at_least(value: int | None, minimum: int, option: str, why: str = "") -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        raise ValueError(f"{option} must be at least {minimum}{f' ({why})' if why else ''}, got {value!r}")


def positive_number(value: float, option: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{option} must be a finite number > 0, got {value!r}")


def check_device(device: str | None) -> None:
    """A device the run can use: its name without torch, then (for CUDA only) torch's word on it."""
    if device is None:
        return
    if not _DEVICE.fullmatch(device):
        raise ValueError(f"--device: unknown device {device!r}; use cpu, cuda or cuda:N")
    if device.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device}: no CUDA device is available here; use --device cpu")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ValueError(f"--device {device}: there are {torch.cuda.device_count()} CUDA devices "
                             f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written; every option's default shown where it has one
    (not for flags, and not where its help already says it), always as `(default: VALUE)`, a
    list as its items the way they are typed (`(default: 2 4 8)`)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        shown = not (default is None or isinstance(default, bool) or default == []
                     or default is argparse.SUPPRESS)
        if action.option_strings and "default" not in text and shown:
            typed = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
            text += f" (default: {typed.replace('%', '%%')})"
        return text

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if action.nargs == argparse.REMAINDER and action.option_strings and action.metavar:
            return f"{action.metavar} [ARGS...]"  # an option whose value is followed by its own arguments
        return super()._format_args(action, default_metavar)


def examples(*lines: str) -> str:
    """An epilog's examples block: each line a command as typed."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def exit_statuses(*rows: tuple[int | str, str]) -> str:
    """An epilog's exit status block: (status, what it means) per row."""
    import textwrap
    return "exit status:\n" + "\n".join(textwrap.fill(meaning, 79, initial_indent=f"  {str(status):<5}",
                                                        subsequent_indent=" " * 7) for status, meaning in rows)


def epilog(examples_: list[str], statuses: list[tuple[int | str, str]], notes: str = "") -> str:
    """A command's epilog: its examples, its exit statuses, then any notes."""
    return "\n\n".join(part for part in (examples(*examples_), exit_statuses(*statuses), notes) if part)


def installed_version() -> str:
    """The installed distribution's version (pyproject.toml's), or say it is not installed."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("memory-auditor")
    except PackageNotFoundError:
        return "(not installed: run from a source tree)"
