"""The options that set a job's settings, each defined once for every command that runs the job,
each defaulting to its Settings field (auditor.jobs.settings): no default is written twice, and
--help shows the field's default as `(default: VALUE)`.

    add_gradprobe_options(parser)         --variant --strategy --seq-len --batch-size --batches
                                          --sparsity --reduction --threshold --weights-dtype --seed
    take_defaults(parser, Settings)       every option of the parser that sets a field of Settings
                                          defaults to that field (again after adding more: --device)
    gradprobe_settings(args, overrides)   the GradProbe job's Settings from those options, checked
    settings_from(args, Settings, ...)    any job's Settings from the options the command has

Names, help and choices of GradProbe's own options are gradprobe's command line's (gradprobe.cli),
so `gradprobe --help` and `auditor gradprobe --help` describe them in the same words. Nothing here
imports torch: a mistake is answered before it loads.
"""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, TypeVar

from architectures.options import add_seed_argument
from auditor.jobs.settings import GradProbeSettings, TrainStepSettings, defaults

S = TypeVar("S")

# Which Settings field each option (by dest) sets; the other fields come from elsewhere (overrides
# from the size options) or keep their default.
FIELDS: dict[type, dict[str, str]] = {
    GradProbeSettings: {"arch": "architecture", "variant": "variant", "strategy": "strategy", "device": "device",
                        "seq_len": "sequence_length", "batch_size": "batch_size", "batches": "batches",
                        "sparsity": "sparsity", "reduction": "reduction", "threshold": "threshold",
                        "seed": "seed", "weights_dtype": "weights_dtype"},
    TrainStepSettings: {"arch": "architecture", "device": "device", "seq_len": "sequence_length",
                        "batch_size": "batch_size", "accumulation": "accumulation", "steps": "steps",
                        "optimizer": "optimizer", "lr": "learning_rate", "seed": "seed"},
}
GRADPROBE_DEFAULTS = defaults(GradProbeSettings)
TRAIN_STEP_DEFAULTS = defaults(TrainStepSettings)


def _typed_names() -> dict[str, dict[str, str]]:
    """Options typed as short names of a field's values: --weights-dtype bf16 is "bfloat16"."""
    from gradprobe.settings import TORCH_DTYPES
    return {"weights_dtype": TORCH_DTYPES}


def as_field(option: str, value: Any) -> Any:
    """An option's value as its Settings field holds it."""
    names = _typed_names().get(option)
    return names.get(value, value) if names else value


def as_option(option: str, value: Any) -> Any:
    """A Settings field's value as the option is typed."""
    names = _typed_names().get(option, {})
    return next((typed for typed, held in names.items() if held == value), value)


def take_defaults(parser: argparse.ArgumentParser, settings_class: type) -> None:
    """Each option of `parser` that sets a field of `settings_class` defaults to that field's
    default (a list of it for an option taking several values: --seq-len 128 512)."""
    fields, found = FIELDS[settings_class], defaults(settings_class)
    taken: dict[str, Any] = {}
    for action in parser._actions:
        if action.dest in fields and action.option_strings:
            value = as_option(action.dest, found[fields[action.dest]])
            taken[action.dest] = [value] if action.nargs in ("+", "*") else value
    parser.set_defaults(**taken)


def settings_from(args: argparse.Namespace, settings_class: type[S], **given: Any) -> S:
    """`settings_class` from the options the command has, `given` fields set as they are (a
    sweep's own architecture, length, precision); every other field keeps its default."""
    fields = FIELDS[settings_class]
    values = {name: as_field(option, getattr(args, option)) for option, name in fields.items()
              if hasattr(args, option)}
    return settings_class(**{**values, **given})


# -- GradProbe ---------------------------------------------------------------------------------

def add_gradprobe_options(parser: argparse.ArgumentParser) -> None:
    """The GradProbe settings every command that runs the job takes: gradprobe's own options
    and the weights folder's dtype, each defaulting to its GradProbeSettings field (as does any
    option added before them that sets one: --arch)."""
    from gradprobe.cli import add_pruning_arguments, add_strategy_argument, add_variant_argument
    from gradprobe.settings import STORAGE_DTYPES
    add_variant_argument(parser)
    add_strategy_argument(parser)
    add_pruning_arguments(parser)
    parser.add_argument("--weights-dtype", choices=STORAGE_DTYPES,
                        help="dtype of the weights folder a folder variant (streaming) prunes from; a 7B "
                             "checkpoint is usually bf16")
    add_seed_argument(parser)
    take_defaults(parser, GradProbeSettings)


def check_gradprobe_options(args: argparse.Namespace) -> None:
    """ValueError (one line) for a GradProbe setting or model option of those arguments; without
    torch, so a mistake is answered at once."""
    from gradprobe.cli import check_pruning_arguments
    from gradprobe.settings import FOLDER_VARIANTS, check_variant_name
    check_variant_name(args.variant)
    check_pruning_arguments(args)
    weights = getattr(args, "weights_dtype", None)
    in_memory = as_option("weights_dtype", GRADPROBE_DEFAULTS["weights_dtype"])  # what the others build in
    if weights is not None and weights != in_memory and args.variant not in FOLDER_VARIANTS:
        raise ValueError(f"--weights-dtype is the dtype of a weights folder, which only "
                         f"{', '.join(FOLDER_VARIANTS)} prunes from; variant {args.variant!r} builds its model "
                         f"in {in_memory}")


def gradprobe_settings(args: argparse.Namespace, overrides: Mapping[str, int]) -> GradProbeSettings:
    """The GradProbe job's Settings from those arguments, checked: ValueError (one line) if wrong."""
    check_gradprobe_options(args)
    return settings_from(args, GradProbeSettings, overrides=dict(overrides))

