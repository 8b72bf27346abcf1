"""GradProbe, the comparison's first user: a variant name as a side.

The side `lean` is the command

    python -P -m gradprobe --variant lean --masks-out RUN/masks.safetensors \
        --summary-json RUN/summary.json [common gradprobe arguments]

(`-P`, from `python_command`: the installed gradprobe runs, never a `gradprobe/` folder in the
current one), and after it exits its summary gives the protocol's fields: `loaded_rss` is the RSS once the
model is built (`rss_after_build`), the result is the masks file (one uint8 0/1 tensor per
parameter), `result_digest` GradProbe's own mask digest; the rest of the summary is kept as
reported. This is the one module of the auditor that knows GradProbe's command line.
"""
from __future__ import annotations

import json
from pathlib import Path

from auditor.capture.fresh_process import python_command
from auditor.comparison.side import RUN_DIR, Side, Tolerance

# Asked from gradprobe itself when it can say (its settings, which import without torch).
DEFAULT_VARIANTS = ("baseline", "sparse-state", "grad-in-backward", "checkpointed", "low-precision",
                    "lean", "streaming")
MASKS, SUMMARY = "masks.safetensors", "summary.json"
SUMMARY_KEPT = ("variant", "architecture", "parameters", "prunable", "candidates", "pruned", "sparsity",
                "rss_before_build", "rss_after_build", "rss_after_prune", "peak_rss", "prune_seconds",
                "build_seconds")


def known_variants() -> tuple[str, ...]:
    """The names `gradprobe --variant` accepts, asked without importing torch: a mistake on the
    command line is answered at once."""
    try:
        from gradprobe.settings import VARIANTS
        return tuple(VARIANTS)
    except ImportError:
        return DEFAULT_VARIANTS


def check_arguments(variant: str, common: list[str]) -> None:
    """ValueError, with gradprobe's own one line, for arguments its command would refuse:
    asked in this process, without torch, before any run starts."""
    try:
        from gradprobe import cli
    except ImportError:
        return  # the first run will say
    parser = cli.build_parser()

    def refuse(message: str):
        raise ValueError(f"{parser.prog}: error: {' '.join(message.split())}")
    # gradprobe's own parser, made by build_parser (so no subclass of ours): its refusals as ValueError
    parser.error = refuse  # type: ignore[method-assign]
    args = parser.parse_args(["--variant", variant, *common])
    try:
        cli.check_arguments(args)
    except ValueError as error:
        refuse(str(error))


def gradprobe_side(variant: str, common: list[str], tolerance: Tolerance | None = None,
                   name: str | None = None) -> Side:
    command = python_command("gradprobe", "--variant", variant, "--masks-out", f"{RUN_DIR}/{MASKS}",
                             "--summary-json", f"{RUN_DIR}/{SUMMARY}", *common)
    return Side(name or variant, command, tolerance, collect=collect_summary)


def collect_summary(run_dir: Path) -> dict:
    """The protocol's fields from the run's GradProbe summary and masks file."""
    summary_path = run_dir / SUMMARY
    if not summary_path.exists():
        raise ValueError(f"gradprobe wrote no {SUMMARY} (does its CLI have --summary-json?)")
    summary = json.loads(summary_path.read_text())
    fields = {"loaded_rss": summary.get("rss_after_build"), "result_digest": summary.get("mask_digest"),
              "gradprobe": {key: summary[key] for key in SUMMARY_KEPT if key in summary}}
    if (run_dir / MASKS).exists():
        fields["result_file"] = str(run_dir / MASKS)
    return {key: value for key, value in fields.items() if value is not None}
