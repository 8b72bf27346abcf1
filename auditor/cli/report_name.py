"""The default report path of a job: reports/JOB-ARCH.md when every setting is the default, and a
name that says what differs otherwise, so a scaled-down smoke test or a changed setting never
replaces the committed report of the default run:

    auditor gradprobe --arch tinystories-33m                       reports/gradprobe-tinystories-33m.md
    auditor gradprobe --arch tinystories-33m --layers 1 --hidden 64
                                           reports/gradprobe-tinystories-33m-layers1-hidden64.md
    auditor train-step --optimizer sgd --steps 3           reports/train-step-tinystories-33m-steps3-sgd.md

Each setting adds itself in the order the command defines it: a number as NAME+VALUE (seq-len512),
a name as itself (lean, wanda, sgd), a switch as its flag (no-trace), a list as NAME and its items
(seq-len128-512, precision-fp32-amp-bf16).
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

FOLDER = Path("reports")
LONGEST = 160  # characters before ".md"; longer names keep a digest of the rest


def defaults_of(parser) -> dict:
    """Every setting's default, as the parser would give it with nothing typed."""
    return vars(parser.parse_args([]))


def default_report_path(job: str, architectures: list[str], settings: dict, defaults: dict) -> Path:
    """reports/JOB-ARCH[-ARCH...][-what differs].md; `settings` and `defaults` by option name
    (dest), only the settings that shape the report."""
    parts = [job, *(Path(name.rstrip("/")).name or name for name in architectures)]
    parts += [_part(name, value, defaults.get(name)) for name, value in settings.items()
              if value != defaults.get(name)]
    name = re.sub(r"[^A-Za-z0-9.+_-]+", "_", "-".join(parts))
    if len(name) > LONGEST:
        name = f"{name[:LONGEST - 13]}-{hashlib.sha1(name.encode()).hexdigest()[:12]}"
    return FOLDER / f"{name}.md"


def _part(name: str, value, default) -> str:
    option = name.replace("_", "-")
    if isinstance(value, bool):
        return option if value else f"no-{option}"
    if value is None:  # an option left out whose default is set
        return f"no-{option}"
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):  # precision-fp32-bf16, seq-len128-512
        words = [_number(item) if not isinstance(item, str) else item for item in value]
        return f"{option}{'-' if value and isinstance(value[0], str) else ''}{'-'.join(words)}"
    return f"{option}{_number(value)}"


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
