"""How sizes, times and ratios are written in reports and findings (binary units, thousands
separators): 512 B, 96.0 KiB, 901.3 MiB, 2.35 GiB, 161.20 GiB (GiB from 1 GiB on)."""
from __future__ import annotations

import re

KiB, MiB, GiB = 2**10, 2**20, 2**30


def size(n: int | float | None) -> str:
    if n is None:
        return "-"
    sign, a = ("-" if n < 0 else ""), abs(n)
    if a < KiB:
        return f"{sign}{a:,.0f} B"
    if a < MiB:
        return f"{sign}{a / KiB:,.1f} KiB"
    if a < GiB:
        return f"{sign}{a / MiB:,.1f} MiB"
    return f"{sign}{a / GiB:,.2f} GiB"


def mib(n: int | float | None) -> str:
    """Bytes in MiB always ("1,234.5 MiB"; "-" when unknown): for columns read against each other."""
    return "-" if n is None else f"{n / MiB:,.1f} MiB"


def signed_mib(n: int | float | None) -> str:
    return "-" if n is None else f"{n / MiB:+,.1f} MiB"


def mib_or_gib(n: int | float | None) -> str:
    """MiB to one decimal below 1 GiB, GiB from 1 GiB on, as the report writes them: the
    terminal's lines ("27.7 MiB", "0.0 MiB", "59.37 GiB")."""
    if n is not None and abs(n) >= GiB:
        return size(n)
    return mib(n)


def signed_mib_or_gib(n: int | float | None) -> str:
    if n is not None and abs(n) >= GiB:
        return signed_size(n)
    return signed_mib(n)


def signed_size(n: int | float | None) -> str:
    if n is None:
        return "-"
    return ("+" if n >= 0 else "") + size(n)


def share(part: float | None, whole: float | None) -> str:
    if part is None or not whole:
        return "-"
    return f"{part / whole:.1%}"


def ratio(part: float | None, whole: float | None) -> str:
    if part is None or not whole:
        return "-"
    return f"{part / whole:,.2f}x"


def seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1000:,.1f} ms" if s < 1 else f"{s:,.2f} s"


# "" and "b": whole bytes. Only spelled-out units: "1.5G" is an error rather than a guess.
_SIZE_UNITS = {"": 1, "b": 1, "kib": KiB, "mib": MiB, "gib": GiB, "tib": 2**40,
               "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_size(value: int | str) -> int:
    """Bytes from a whole number of bytes or a size with its unit (any case): 512KiB, 1.5GiB,
    1GB, 4096. ValueError, one line, for anything else."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    text = value if isinstance(value, str) else ""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS or (_SIZE_UNITS[unit] == 1 and "." in match.group(1)):
        raise ValueError(f"{value!r} is not a size: write e.g. 1.5GiB, 900MiB, 512KiB, 1GB "
                         "or a whole number of bytes")
    return round(float(match.group(1)) * _SIZE_UNITS[unit])
