"""How sizes, times and ratios are written in reports and findings (binary units, thousands
separators): 512 B, 96.0 KiB, 2,401.3 MiB, 161.20 GiB."""
from __future__ import annotations

KiB, MiB, GiB = 2**10, 2**20, 2**30


def size(n: int | float | None) -> str:
    if n is None:
        return "-"
    sign, a = ("-" if n < 0 else ""), abs(n)
    if a < KiB:
        return f"{sign}{a:,.0f} B"
    if a < MiB:
        return f"{sign}{a / KiB:,.1f} KiB"
    if a < 10 * GiB:
        return f"{sign}{a / MiB:,.1f} MiB"
    return f"{sign}{a / GiB:,.2f} GiB"


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
