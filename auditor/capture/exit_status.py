"""The exit status a program's ending gives, as a shell sees it: what `auditor run` exits with
and what the record says, the same as under plain python."""
from __future__ import annotations

C_LONG = 1 << 63  # python reads sys.exit's integer as a C long; one beyond it exits as -1 does


def shell_code(code: object) -> int:
    """The status a shell sees for `sys.exit(code)`: None is 0; an int is cut to its low byte by
    the OS (sys.exit(263) shows 7, sys.exit(-1) 255; one too large for a C long 255); anything
    else is printed by python and exits 1."""
    if code is None:
        return 0
    if isinstance(code, int):  # bool too: sys.exit(True) is 1
        return code & 0xFF if -C_LONG <= code < C_LONG else 255
    return 1


def describe(exc: object) -> str:
    """An exception as the record names it: its type, and its message where it has one."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
