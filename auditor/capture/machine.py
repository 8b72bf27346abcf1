"""What a run ran on, as its record says it: the machine (`machine`) and the versions and
settings that shape its memory (`environment`), read at its start and again at its end."""
from __future__ import annotations

import os
import platform
import sys

from auditor.facts import allocator_retention


def machine() -> dict:
    import psutil
    return {"platform": platform.platform(), "cpus": os.cpu_count(),
            "memory_total": psutil.virtual_memory().total}


def environment() -> dict:
    """Versions without importing anything heavy: torch counts only once the run imported it."""
    torch = sys.modules.get("torch")
    threads = getattr(torch, "get_num_threads", None)
    return {"python": platform.python_version(), "torch": _version("torch"),
            "transformers": _version("transformers"), "threads": threads() if threads else None,
            "malloc": allocator_retention.malloc_settings(os.environ) if _on_glibc() else None}


def _on_glibc() -> bool:
    """Whether this process's C library is glibc (its malloc is the one the settings are for)."""
    return platform.libc_ver()[0] == "glibc"


def _version(package: str) -> str | None:
    module = sys.modules.get(package)
    if module is not None and isinstance(getattr(module, "__version__", None), str):
        return module.__version__
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version(package)
    except PackageNotFoundError:
        return None
