"""The rank-projection report's RSS-retention sections, computed once from
benchmarks/rank_rss_retention.py's JSON: where the RSS beyond live tensors is (glibc's arenas,
at two sizes, with each malloc) and, from its --sweep, what the prune adds beyond its tensors
size by size. Numbers and names only: auditor.renderers.rank_projection_markdown formats them.

    rank_retention(json.loads(path.read_text()))
    retention_sweep([json.loads(p.read_text()) for p in sweeps])
"""
from __future__ import annotations

from dataclasses import dataclass

from auditor.analysis.ranks.projection import RSS_LIMIT

# -- where the missing RSS is ----------------------------------------------------------------


@dataclass
class ArenaRow:
    """One rank run (the run of median peak RSS) at one size with one malloc."""
    size: str                    # "small" or "held-out"
    malloc: str                  # "default" or how the threshold was fixed
    stage: str                   # the gradient pass at the peak
    rss: int
    live: int                    # live tensors
    beyond: int                  # RSS beyond live tensors
    beyond_range: tuple[int, int]  # ... over the repeated runs
    main_held: int               # the main arena (the main thread's heap): held, free
    main_free: int
    others_held: int             # the other threads' arenas together (gloo's workers)
    others_free: int
    mmapped: int


@dataclass
class Repeatability:
    """How far the same rank's RSS beyond live tensors spread over repeated runs, with each malloc."""
    runs: int
    default_spread: int
    default_share: float         # of its peak RSS
    fixed_spread: int
    fixed_share: float
    beyond_target: bool          # the default varies by more than RSS_LIMIT, the fixed threshold does not


@dataclass
class RankRetention:
    rows: list[ArenaRow]
    runs: int                    # runs of each configuration
    fixed: str                   # the malloc setting that fixed the threshold
    growth_default: int          # RSS beyond live tensors, held-out size less small, with each malloc
    growth_fixed: int
    repeatability: Repeatability  # at the held-out size
    main_free: dict[str, int]    # size -> the main arena's free bytes with the default malloc
    others_held: dict[str, int]  # size -> the other threads' arenas' held bytes with the default malloc
    command: str


def rank_retention(data: dict) -> RankRetention:
    """The retention section of benchmarks/rank_rss_retention.py's JSON."""
    rows = [_arena_row(r) for r in data["rows"]]
    by = {(r["size"], r["malloc"]): r for r in data["rows"]}
    fixed = next(m for (_, m) in by if m != "default")
    shown = {(r.size, r.malloc): r for r in rows}
    sizes = dict.fromkeys(size for size, _ in by)
    return RankRetention(
        rows=rows, runs=data["rows"][0]["runs"], fixed=fixed,
        growth_default=shown["held-out", "default"].beyond - shown["small", "default"].beyond,
        growth_fixed=shown["held-out", fixed].beyond - shown["small", fixed].beyond,
        repeatability=repeatability(by["held-out", "default"], by["held-out", fixed]),
        main_free={s: shown[s, "default"].main_free for s in sizes if (s, "default") in shown},
        others_held={s: shown[s, "default"].others_held for s in sizes if (s, "default") in shown},
        command=data["command"])


def _arena_row(r: dict) -> ArenaRow:
    main, others = r["arenas"][0], r["arenas"][1:]
    low, high = r["beyond_range"]
    return ArenaRow(size=r["size"], malloc=r["malloc"], stage=r["stage"], rss=r["rss"], live=r["live"],
                    beyond=r["rss"] - r["live"], beyond_range=(low, high),
                    main_held=main["current"], main_free=main["free"],
                    others_held=sum(a["current"] for a in others), others_free=sum(a["free"] for a in others),
                    mmapped=r["mmapped"])


def repeatability(default: dict, fixed: dict) -> Repeatability:
    """Two rows of the JSON (`runs`, `beyond_range`, `rss`): the default malloc's and the fixed threshold's."""
    def spread(row: dict) -> tuple[int, float]:
        low, high = row["beyond_range"]
        return high - low, (high - low) / row["rss"]
    (wide, share), (narrow, fixed_share) = spread(default), spread(fixed)
    return Repeatability(runs=default["runs"], default_spread=wide, default_share=share, fixed_spread=narrow,
                         fixed_share=fixed_share, beyond_target=share > RSS_LIMIT >= fixed_share)


# -- size by size ------------------------------------------------------------------------------


@dataclass
class SweepRow:
    run: int                     # which run of the sweep, from 1
    hidden: int
    ranks: int
    malloc: str
    threshold: int               # glibc's mmap threshold after the prune
    live: int                    # the prune's peak live tensors
    rss: int
    beyond_after_sharding: int   # RSS beyond live tensors when `shard model` ended
    beyond: int                  # ... at the prune's peak
    added: int                   # what the prune added beyond its live tensors
    added_share: float           # ... per byte of them
    heap_high_water: int | None  # None: not kept
    kept: float | None           # the default's addition beyond the fixed run's, per heap high-water byte


@dataclass
class Added:
    """What the prune added beyond its live tensors with one malloc, least and most over the rows."""
    malloc: str
    least: int
    most: int
    least_share: float
    most_share: float


@dataclass
class RetentionSweep:
    rows: list[SweepRow]
    added: list[Added]           # per malloc, in the rows' order
    kept: tuple[float, float] | None  # least and most `kept`; None: no row has it
    most_below_largest: SweepRow | None  # the default row that added most, when not at the largest size
    largest: int                 # the sweep's largest hidden size
    commands: list[str]          # each run's command


def retention_sweep(runs: list[dict]) -> RetentionSweep:
    """The sweep section of one or more runs of benchmarks/rank_rss_retention.py --sweep."""
    raw = [{**row, "run": n} for n, data in enumerate(runs, 1) for row in data["rows"]]

    def grown(row: dict) -> int:
        return row["rss"] - row["live"] - row["beyond_after_sharding"]

    fixed_run = {(r["run"], r["hidden"], r["ranks"]): r for r in raw if r["malloc"] != "default"}

    def kept(row: dict) -> float | None:
        other, water = fixed_run.get((row["run"], row["hidden"], row["ranks"])), row.get("heap_high_water")
        if row["malloc"] != "default" or other is None or not water:
            return None
        return (grown(row) - grown(other)) / water

    rows = [SweepRow(run=r["run"], hidden=r["hidden"], ranks=r["ranks"], malloc=r["malloc"],
                     threshold=r["threshold"], live=r["live"], rss=r["rss"],
                     beyond_after_sharding=r["beyond_after_sharding"], beyond=r["rss"] - r["live"],
                     added=grown(r), added_share=grown(r) / r["live"], heap_high_water=r.get("heap_high_water"),
                     kept=kept(r)) for r in raw]
    by_malloc: dict[str, list[SweepRow]] = {}
    for row in rows:
        by_malloc.setdefault(row.malloc, []).append(row)
    added = [Added(malloc, min(r.added for r in found), max(r.added for r in found),
                   min(r.added_share for r in found), max(r.added_share for r in found))
             for malloc, found in by_malloc.items()]
    ratios = [r.kept for r in rows if r.kept is not None]
    most = max((r for r in rows if r.malloc == "default"), key=lambda r: r.added, default=None)
    largest = max(r.hidden for r in rows)
    return RetentionSweep(rows=rows, added=added, kept=(min(ratios), max(ratios)) if ratios else None,
                          most_below_largest=most if most is not None and most.hidden != largest else None,
                          largest=largest, commands=[data["command"] for data in runs])
