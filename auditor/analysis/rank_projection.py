"""Per-rank projection of a sharded run at target world sizes, and how many devices it needs.

    worlds = project_ranks(real_ranks, {2: traced_2, 4: traced_4})   # records by rank
    fewest_devices(worlds, 80 * GiB)          # the smallest world size whose worst rank fits

Each traced rank (auditor.jobs.rank_projection: rank r of N on torch's fake process group, on the
target's fake tensors) is projected as a single traced run is (auditor.analysis.traced_projection):
its live tensors are the traced run's, exact but for the bytes that rest on data-dependent size
estimates (`estimated`); its RSS adds what the paired real rank's process held beyond its live
tensors (interpreter, libraries, gloo, allocator slack) stage by stage, plus the allocator's
retention growth. The paired real rank is the same rank where the audited run had it, else its
highest rank other than 0 (rank 0 may do more; the others run one program on their own rows).

Two peaks per rank: the whole program's, and the sharded part's (the prune, after FSDP2 sharded
the model): the audited program builds the whole model on every rank and holds it while
`fully_shard` copies out its shards, which a device run avoids by building it elsewhere (meta or
the host); the device count is read from the sharded part.
"""
from __future__ import annotations

from auditor.record_schema import RunRecord, Stage

SHARDED_FROM = ("prune",)  # the stages (and their children) once the model is sharded


def paired_rank(rank: int, real: dict[int, RunRecord]) -> int:
    if rank in real:
        return rank
    others = [r for r in real if r != 0]
    return max(others) if others else 0


def project_ranks(real: dict[int, RunRecord], traced: dict[int, dict[int, RunRecord]]) -> list[dict]:
    """One entry per world size (ascending): each rank's projection and the worst rank's."""
    worlds = []
    for world_size in sorted(traced):
        ranks = [project_rank(rank, record, real) for rank, record in sorted(traced[world_size].items())]
        worlds.append({"world_size": world_size, "ranks": ranks,
                       "worst": max(ranks, key=lambda r: r["sharded"]["live_tensors_upper"])})
    return worlds


def project_rank(rank: int, traced_record: RunRecord, real: dict[int, RunRecord]) -> dict:
    from auditor.analysis.traced_projection import project_traced
    paired = paired_rank(rank, real)
    projection = project_traced(real[paired], traced_record)
    stages = projection["stages"]
    sharded = [s for s in stages if s["path"].split("/")[0] in SHARDED_FROM]
    retained = max((traced_record.annotations.get("gather_buffers") or {}).values(), default=0)
    return {"rank": rank, "traced_as": traced_record.annotations.get("traced_as", rank), "paired_real_rank": paired,
            "retained_buffer": retained, "whole": _peak(stages, retained), "sharded": _peak(sharded, retained),
            "stages": stages, "data_dependent": projection["data_dependent"]}


def _peak(stages: list[dict], retained: int) -> dict:
    """The traced peaks, and their upper bounds with one more FSDP unit's flat buffer held
    (`retained`: what a real gloo rank was seen to hold beyond the traced run at a peak)."""
    live = max(stages, key=lambda s: s["tensor_peak"])
    rss = max(stages, key=lambda s: s["rss_peak"])
    return {"live_tensors": live["tensor_peak"], "live_stage": live["path"], "estimated": live["estimated"],
            "live_tensors_upper": live["tensor_peak"] + retained,
            "rss": rss["rss_peak"], "rss_stage": rss["path"], "rss_upper": rss["rss_peak"] + retained}


def fewest_devices(worlds: list[dict], budget: int, figure: str = "live_tensors_upper") -> int | None:
    """The smallest projected world size whose worst rank's sharded peak (`figure`: live_tensors,
    rss or their `_upper` bounds) fits `budget` bytes; None when none of them does."""
    for world in worlds:
        if max(r["sharded"][figure] for r in world["ranks"]) <= budget:
            return world["world_size"]
    return None


def compare_rank(projected: dict, real_record: RunRecord) -> dict:
    """A projected rank against the real run of the same rank at the target (held-out check):
    peak live tensors over the run and every stage's, peak RSS, as signed errors."""
    real_stages: dict[str, Stage] = {}
    for s in real_record.stages:
        if s.status != "open":
            real_stages.setdefault(s.path, s)
    seen: set[str] = set()
    worst: tuple[float, str | None] = (0.0, None)
    for s in projected["stages"]:
        real = real_stages.get(s["path"])
        real_peak = _live_peak(real) if real is not None else None
        if s["path"] in seen or not real_peak:
            continue
        seen.add(s["path"])
        error = _error(s["tensor_peak"], real_peak)
        if abs(error) > abs(worst[0]):
            worst = (error, s["path"])
    real_live = max(_live_peak(s) or 0 for s in real_stages.values())
    real_rss = max(_rss_peak(s) for s in real_stages.values())
    return {"live_tensors": _error(projected["whole"]["live_tensors"], real_live),
            "sharded_live_tensors": _error(projected["sharded"]["live_tensors"], _real_sharded(real_stages, "live")),
            "every_stage": worst[0], "every_stage_worst": worst[1],
            "within_upper": real_live <= projected["whole"]["live_tensors_upper"]
            and _real_sharded(real_stages, "live") <= projected["sharded"]["live_tensors_upper"],
            "rss": _error(max(projected["whole"]["rss"], projected["sharded"]["rss"]), real_rss),
            "sharded_rss": _error(projected["sharded"]["rss"], _real_sharded(real_stages, "rss")),
            "real": {"live_tensors": real_live, "rss": real_rss}}


def _real_sharded(stages: dict[str, Stage], figure: str) -> int:
    chosen = [s for path, s in stages.items() if path.split("/")[0] in SHARDED_FROM]
    if figure == "rss":
        return max(_rss_peak(s) for s in chosen)
    return max(_live_peak(s) or 0 for s in chosen)


def _live_peak(stage: Stage) -> int | None:
    return stage.live_tensors.peak if stage.live_tensors else None


def _rss_peak(stage: Stage) -> int:
    assert stage.rss.peak is not None, "a finished stage's RSS peak"
    return stage.rss.peak


def _error(projected: int, real: int) -> float:
    return (projected - real) / real if real else 0.0
