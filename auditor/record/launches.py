"""Whether ranks' records belong to one launch of a distributed job.

Each rank records the launch it was started by, in its `rank` field (auditor.capture.ranks):

    run_id   torchrun's rendezvous id (TORCHELASTIC_RUN_ID), the same on every node
    launch   {"id": ..., "host": ...}: torchrun's id (host null: it holds across nodes), or else the
             process that started the ranks on that host (its pid and start time: spawn workers,
             ranks a job starts), which only ranks on the same host can share

Two records of one launch agree on the world size and on every launch id both can be compared
by. A record from before `launch` was recorded has none: such records are taken per world size
(and torchrun's run_id where both have one). A folder of `rank-N` records that disagree is no
merged run: `auditor report` refuses it rather than call two unrelated runs one run's imbalance.
"""
from __future__ import annotations


def conflict(a: dict, b: dict) -> str | None:
    """Why rank records `a` and `b` (their `rank` fields, as JSON) cannot be of one launch, or None."""
    if a.get("world_size") != b.get("world_size"):
        return f"world size {a.get('world_size')} against {b.get('world_size')}"
    if a.get("run_id") and b.get("run_id") and a["run_id"] != b["run_id"]:
        return f"torchrun run id {a['run_id']} against {b['run_id']}"
    mine, theirs = a.get("launch"), b.get("launch")
    if not isinstance(mine, dict) or not isinstance(theirs, dict):  # from before launches were recorded
        return None
    if mine.get("host") is None and theirs.get("host") is None:
        return None if mine.get("id") == theirs.get("id") else \
            f"torchrun run id {mine.get('id')} against {theirs.get('id')}"
    if (mine.get("host") is None) != (theirs.get("host") is None):
        return "one was started by torchrun, the other not"
    if mine["host"] == theirs["host"] and mine.get("id") != theirs.get("id"):
        return f"started by different processes on {mine['host']} ({mine.get('id')} against {theirs.get('id')})"
    return None

