"""The machine a comparison ran on: interpreter, library versions, CPUs, memory, and how
busy the machine was (load average), since other work scatters wall times."""
from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

LIBRARIES = ("torch", "transformers", "numpy", "safetensors")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def environment() -> dict:
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_total": _memory_total(),
        "libraries": {name: _version(name) for name in LIBRARIES},
        "thread_variables": {name: os.environ[name] for name in THREAD_VARIABLES if name in os.environ},
        "load_average_start": list(os.getloadavg()),
    }


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_total() -> int | None:
    try:
        import psutil
        return psutil.virtual_memory().total
    except ImportError:
        return None
