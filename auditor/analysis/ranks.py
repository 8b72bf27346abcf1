"""One view of a multi-rank run: each rank's record (RUN/rank-N/, auditor.ranks) merged.

    merged = merge_ranks("runs/ranks")
    merged["stages"]      stage rows, each with every rank's RSS and live-tensor peak
    merged["peak"]        the rank and stage of the highest RSS of any rank
    merged["imbalance"]   across ranks: max/min and spread of the run's peaks

A rank that was killed has no run.json: its record is assembled from its event log, as
`auditor report` does for any unfinished run, and marked unfinished here.

Communication buffers: the live-tensor meter names the operator that created each storage,
so the storages a c10d collective creates itself (functional collectives, `_c10d_functional::*`,
the ones DTensor and FSDP2 use) are counted where they are alive at a stage's live-tensor peak,
among the rows that peak keeps. An in-place collective (`dist.all_reduce(t)`) creates no
storage, a buffer the program allocated for a collective is the program's own tensor (named
by the line that allocated it), and a backend's own memory (gloo's, NCCL's) is no tensor: only
RSS shows it.
"""
from __future__ import annotations

import os
from pathlib import Path

from auditor.record import RunRecordError, load, rank_folder_name, rank_folders
from auditor.record_schema import AtPeak, RunRecord, Stage

COLLECTIVE_OPS = ("c10d::", "_c10d_functional::", "c10d_functional::")
# The AsyncCollectiveTensor a functional collective returns wraps the collective's output: its
# storage has a size but no memory of its own (no data pointer), yet the live-tensor meter
# counts it. Left out of the buffers, and its bytes named apart.
COLLECTIVE_WRAPPERS = ("_c10d_functional::_wrap_tensor_autograd", "c10d_functional::_wrap_tensor_autograd")


def is_multi_rank(folder: str | os.PathLike) -> bool:
    """A folder holding ranks' records and no single-process record of its own."""
    folder = Path(folder)
    return folder.is_dir() and not (folder / "events.jsonl").exists() and bool(rank_folders(folder))


def load_ranks(folder: str | os.PathLike) -> dict[int, RunRecord]:
    """Each rank's record, by rank (RunRecordError naming the rank folder if one is unreadable)."""
    records = {}
    for rank in rank_folders(folder):
        where = Path(folder) / rank_folder_name(rank)
        try:
            records[rank] = load(where, from_events=True)
        except RunRecordError as error:
            raise RunRecordError(f"rank {rank}: {error}") from None
    return records


def merge_ranks(folder: str | os.PathLike) -> dict:
    return merge(load_ranks(folder), folder)


def merge(records: dict[int, RunRecord], folder: str | os.PathLike = "") -> dict:
    ranks = [_rank_summary(rank, record) for rank, record in sorted(records.items())]
    stages = _stage_rows(records)
    world = {r["world_size"] for r in ranks if r["world_size"] is not None}
    expected = max(world) if world else len(ranks)
    return {
        "folder": str(folder), "name": next(iter(records.values())).name if records else None,
        "command": next(iter(records.values())).command if records else None,
        "world_size": sorted(world), "ranks": ranks,
        "missing_ranks": [n for n in range(expected) if n not in records],
        "stages": stages, "peak": _global_peak(ranks, "rss_peak", "rss_peak_stage"),
        "live_peak": _global_peak(ranks, "live_peak", "live_peak_stage"),
        "imbalance": {"rss": spread({r["rank"]: r["rss_peak"] for r in ranks}),
                      "live": spread({r["rank"]: r["live_peak"] for r in ranks})},
        "communication": _communication(stages),
    }


def _rank_summary(rank: int, record: RunRecord) -> dict:
    identity = record.rank  # None: a record without its rank's identity
    status = record.exit.status if record.exit is not None else None
    live = [(s.live_tensors.peak, s.path) for s in record.stages
            if s.live_tensors is not None and s.live_tensors.peak is not None]
    live_peak, live_stage = max(live, key=lambda pair: pair[0]) if live else (None, None)
    return {"rank": rank, "world_size": identity.world_size if identity else None,
            "local_rank": identity.local_rank if identity else None, "host": identity.host if identity else None,
            "backend": identity.backend if identity else None, "source": identity.source if identity else None,
            "status": status or "unknown", "finished": status != "unfinished",
            "rss_peak": record.peak.rss, "rss_peak_stage": record.peak.stage,
            "live_peak": live_peak, "live_peak_stage": live_stage,
            "rss_at_start": record.process.rss_at_start,
            "duration_s": record.duration_s,
            "open_stages": [s.path for s in record.stages if s.status == "open"]}


def _stage_rows(records: dict[int, RunRecord]) -> list[dict]:
    """Stage paths in the order they first ran (rank 0's, then others' own), every rank's
    readings side by side; a path a rank entered several times keeps its highest."""
    rows: dict[str, dict] = {}
    for rank, record in sorted(records.items()):
        for stage in record.stages:
            row = rows.setdefault(stage.path, {"path": stage.path, "ranks": {}})
            row["ranks"][rank] = _highest(row["ranks"].get(rank), _reading(stage))
    for row in rows.values():
        row["rss"] = spread({r: v["rss_peak"] for r, v in row["ranks"].items()})
        row["live"] = spread({r: v["live_peak"] for r, v in row["ranks"].items()})
    return list(rows.values())


def _reading(stage: Stage) -> dict:
    live = stage.live_tensors
    at_peak = live.at_peak if live is not None else None
    return {"rss_peak": stage.rss.peak, "live_peak": live.peak if live is not None else None,
            "status": stage.status, "calls": 1,
            "communication": collective_bytes(at_peak),
            "wrappers": collective_bytes(at_peak, COLLECTIVE_WRAPPERS)}


def _highest(kept: dict | None, new: dict) -> dict:
    if kept is None:
        return new
    merged = {key: _max(kept[key], new[key]) for key in ("rss_peak", "live_peak", "communication", "wrappers")}
    status = "open" if "open" in (kept["status"], new["status"]) else \
        "failed" if "failed" in (kept["status"], new["status"]) else "ok"
    return {**merged, "status": status, "calls": kept["calls"] + 1}


def _max(a, b):
    values = [v for v in (a, b) if v is not None]
    return max(values) if values else None


def collective_bytes(at_peak: AtPeak | None, ops: tuple[str, ...] = COLLECTIVE_OPS) -> int | None:
    """Bytes alive at a live-tensor peak that a c10d collective created, its wrappers left out
    (or, with `ops=COLLECTIVE_WRAPPERS`, the wrappers' alone); None: meter off."""
    if at_peak is None:
        return None
    wanted = [row for row in at_peak.rows if (row.op or "").startswith(ops)]
    if ops is COLLECTIVE_OPS:
        wanted = [row for row in wanted if not (row.op or "").startswith(COLLECTIVE_WRAPPERS)]
    return sum(row.bytes for row in wanted)


def spread(values: dict[int, int | None]) -> dict | None:
    """max, min, max/min and max - min over the ranks that have a value, and which ranks."""
    known = {rank: value for rank, value in values.items() if value is not None}
    if not known:
        return None
    high = max(known, key=lambda rank: (known[rank], -rank))
    low = min(known, key=lambda rank: (known[rank], rank))
    return {"max": known[high], "max_rank": high, "min": known[low], "min_rank": low,
            "ratio": known[high] / known[low] if known[low] else None,
            "spread": known[high] - known[low], "ranks": len(known)}


def _global_peak(ranks: list[dict], key: str, stage_key: str) -> dict | None:
    known = [r for r in ranks if r[key] is not None]
    if not known:
        return None
    top = max(known, key=lambda r: (r[key], -r["rank"]))  # a tie: the lowest rank
    return {"bytes": top[key], "rank": top["rank"], "stage": top[stage_key]}


def _communication(stages: list[dict]) -> dict:
    seen = [(row["path"], rank, reading["communication"]) for row in stages
            for rank, reading in sorted(row["ranks"].items()) if reading["communication"]]
    metered = any(reading["communication"] is not None for row in stages for reading in row["ranks"].values())
    wrapped = [(row["path"], rank, reading["wrappers"]) for row in stages
               for rank, reading in sorted(row["ranks"].items()) if reading["wrappers"]]
    return {"metered": metered, "stages": [{"stage": path, "rank": rank, "bytes": size}
                                           for path, rank, size in seen],
            "wrappers": [{"stage": path, "rank": rank, "bytes": size} for path, rank, size in wrapped]}
