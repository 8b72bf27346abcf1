"""What glibc's malloc keeps after frees, as the projections model it.

glibc serves blocks below its mmap threshold from the heap, and each thread's arena may keep up
to its trim threshold (twice the mmap threshold) free at its top. The threshold starts at
128 KiB and follows the largest mmapped block freed, up to 32 MiB on 64-bit (a threshold set
in the environment stays fixed). The live-tensor meter follows it (`allocator_threshold` of a
stage's live tensors); a small run's stays small, a large one's reaches tens of MiB, and the
heap then holds blocks up to that size, freed ones included.

How much more a larger run keeps is not given by the trim thresholds alone: holes between live
blocks count too, and some come from buffers no dispatch mode sees (inside a matmul, on worker
threads). The projections take it as FACTOR x threads x the threshold's growth, FACTOR measured:
on the projection-validation matrix's ten GradProbe cases (reports/projection-validation-matrix.md,
1 layer at hidden 128 -> 2 layers at hidden 512, thresholds 2-4 MiB -> 16 MiB, 2 threads) the
RSS beyond live tensors grew by 0.75 to 2.46 times threads x the threshold's growth, 1.5 on
average (GPT-Neo's tied 16 MiB embedding gradients sit at the top of that range, Mistral's at the
bottom). RANGE is that spread, printed with each projected figure.
Also measured: GPT-Neo 1 -> 2 layers, hidden 128 -> 512, RSS beyond tensors grew from 366 to
429 MiB, and stayed at 366 with the threshold fixed (MALLOC_MMAP_THRESHOLD_=131072).

A sharded program keeps far more: FSDP2 frees a gathered layer and its gradients for each layer,
all below the risen threshold, and the main thread's heap keeps their space in ways the threshold
does not predict. What bounds it is how much the heap served: the live-tensor meter's
`heap_high_water` (the most bytes of CPU storages below the threshold alive at once). On real
gloo ranks (benchmarks/rank_rss_retention.py --sweep: hidden 128-512, 2 and 4 ranks) glibc's
default kept 0.90 to 1.93 times that high water more than the same run with the threshold fixed
in the two runs of the sweep kept in reports/rank-projection-cpu-runs, and 1.12 to 2.38 in a
first run whose records were not kept (2.38: hidden 512 on 4 ranks). `heap_may_keep` takes
HEAP_KEEPS_AT_MOST times the high water's growth as what a projection may miss. It is wide where
the heap serves much (a larger model: blocks of one layer's size are reused by the next layer's):
at hidden 2048 real ranks were 2-6% above the projection where it allowed 16-22%.
"""
from __future__ import annotations

from collections.abc import Mapping

MMAP_THRESHOLD_START = 128 * 1024
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
FACTOR = 1.5
RANGE = (0.75, 2.5)
HEAP_KEEPS_AT_MOST = 2.4
# glibc stops moving the mmap threshold once any of these is set (mallopt or the environment)
FIXES_THRESHOLD = ("mmap_threshold", "trim_threshold", "top_pad", "mmap_max")


def malloc_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """What the environment sets of glibc's malloc (read once, when a process starts): each
    `MALLOC_<NAME>_` (or `MALLOC_ARENA_MAX`-style) variable and each `glibc.malloc.<name>` of
    GLIBC_TUNABLES, by its lower-case name."""
    found = {key[len("MALLOC_"):].rstrip("_").lower(): value for key, value in environ.items()
             if key.startswith("MALLOC_") and key.rstrip("_") != "MALLOC"}
    for entry in environ.get("GLIBC_TUNABLES", "").split(":"):
        name, _, value = entry.partition("=")
        if name.startswith("glibc.malloc."):
            found[name[len("glibc.malloc."):]] = value
    return found


def threshold_fixed(settings: Mapping[str, str]) -> bool:
    """Whether glibc's mmap threshold stays where `settings` (malloc_settings) put it."""
    return any(name in settings for name in FIXES_THRESHOLD)


def starting_threshold(settings: Mapping[str, str]) -> int:
    """The mmap threshold a process starts with."""
    value = settings.get("mmap_threshold", "")
    return int(value) if value.isdigit() else MMAP_THRESHOLD_START


def growth(threads: int, audited_threshold: int, target_threshold: float) -> int:
    """The retention growth a projection adds: FACTOR x threads x the threshold's growth
    (never below 0)."""
    return max(round(FACTOR * threads * (target_threshold - audited_threshold)), 0)


def growth_range(growth_added: int) -> list[int]:
    """The measured spread around a growth `growth()` gave."""
    return [round(growth_added * RANGE[0] / FACTOR), round(growth_added * RANGE[1] / FACTOR)]


def heap_may_keep(audited_high_water: int, target_high_water: int) -> int:
    """What glibc's default heap may keep beyond a projection that carried the audited run's
    retention: HEAP_KEEPS_AT_MOST x the growth of the heap's high water (never below 0)."""
    return max(round(HEAP_KEEPS_AT_MOST * (target_high_water - audited_high_water)), 0)
