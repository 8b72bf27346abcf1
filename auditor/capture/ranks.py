"""Which rank of a torch.distributed job this process is, and its own folder in the run folder
the ranks share.

Under torchrun (or any launcher that sets RANK and WORLD_SIZE), in torch.multiprocessing
spawn workers with a process group, and in the workers a script under `auditor run` spawns
(auditor.capture.staging.spawned_ranks: rank = the worker's index, source "spawn index", until its group says
otherwise; its launcher's record stays in R), every rank audits itself: `Audit(out=R)` and
`auditor run --run-dir R` write rank N's record into R/rank-N/ (events.jsonl, run.json), so the
ranks never touch each other's files, and `auditor report R` merges them.

The record's `rank` field: {rank, world_size, local_rank, host, backend, run_id (torchrun's
TORCHELASTIC_RUN_ID, a uuid with --standalone; else null), launch, source, read_at}. `launch`
says which launch started the rank (auditor.record.launches): torchrun's run id where there is
one, else the process that started the ranks on this host (its pid and start time: a spawn's
parent, torchrun's agent, a job that starts ranks), so `auditor report` merges only ranks of one
launch. A rank refuses a shared folder holding a plain run's record, its own rank's, or a rank
of another run (more ranks, another world size, another launch).
It is read twice:
  - where the audit is created (it chooses the folder): from torch.distributed if a process
    group is initialised then, else from the RANK / WORLD_SIZE / LOCAL_RANK environment that
    torchrun sets. A spawn worker without that environment must initialise its process group
    before it creates its Audit, or it is audited as a plain run (and two such workers would
    clash on R).
  - at each stage's end and the audit's end, until a process group is seen: one initialised
    by then (the usual case under torchrun, whose script initialises it after the audit began)
    replaces the figures with its own (source "torch.distributed", read_at "stage end" or
    "end"); one that disagrees with the folder's rank is a warning at the end. A script that
    destroys its group before its first stage ends keeps the environment's figures.
torch is never imported here: torch.distributed counts only once the program imported it.
"""
from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from auditor.record import launches
from auditor.record.run_folder import EVENTS_FILE, check_run_folder, rank_folder_name, rank_folders

ENVIRONMENT = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
SPAWNED = "spawn index"  # source of a worker's rank that `auditor run` spawned (auditor.capture.staging.spawned_ranks)


def identity(read_at: str = "start") -> dict | None:
    """This process's rank, or None when it is no rank of a distributed job."""
    found = _from_process_group() or _from_environment()
    if found is None:
        return None
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")  # torchrun's rendezvous id ("none" without one)
    run_id = run_id if run_id not in (None, "", "none") else None
    host = socket.gethostname()
    return {**found, "local_rank": _int(os.environ.get("LOCAL_RANK")), "host": host, "run_id": run_id,
            "launch": launch(run_id, host), "read_at": read_at}


def launch(run_id: str | None, host: str) -> dict:
    """Which launch started this rank: torchrun's id, valid across hosts, or the process that
    started it on this host, named by its pid and start time (a pid alone is reused)."""
    if run_id is not None:
        return {"id": run_id, "host": None}
    parent = os.getppid()
    return {"id": f"pid {parent} started at {_start_ticks(parent)}", "host": host}


def _start_ticks(pid: int) -> str:
    """A process's start time in clock ticks after boot (/proc/PID/stat's 22nd field); "?" elsewhere."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return "?"


def _from_process_group() -> dict | None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                "backend": str(dist.get_backend()), "source": "torch.distributed"}
    except Exception:  # a group being torn down: the environment still says who we are
        return None


def _from_environment() -> dict | None:
    rank, world = _int(os.environ.get("RANK")), _int(os.environ.get("WORLD_SIZE"))
    if rank is None or world is None or not 0 <= rank < world:
        return None
    return {"rank": rank, "world_size": world, "backend": None, "source": "environment"}


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def confirmed(known: dict, read_at: str = "stage end") -> dict:
    """`known`, or the process group's figures once the program has initialised one."""
    if known["source"] == "torch.distributed":
        return known
    group = _from_process_group()
    return known if group is None else {**known, **group, "read_at": read_at}


def at_end(started: dict, known: dict) -> tuple[dict, str | None]:
    """The record's rank at the audit's end, and a warning when it contradicts the rank whose
    folder the audit writes into (`started`)."""
    final = confirmed(known, "end")
    if final["rank"] == started["rank"] and final["world_size"] == started["world_size"]:
        return final, None
    return final, (f"torch.distributed says rank {final['rank']} of {final['world_size']}, but the "
                   f"audit began as rank {started['rank']} of {started['world_size']} "
                   f"({started['source']}) and wrote into {rank_folder_name(started['rank'])}")


def rank_run_folder(out, rank: dict) -> Path:
    """R/rank-N for rank N of a run folder R the ranks share; ValueError (one line) if R holds
    a plain run's record or an earlier run's ranks, or R/rank-N is taken."""
    who = f"this process is rank {rank['rank']} of {rank['world_size']} ({rank['source']})"
    if out is None:
        raise ValueError(f"{who}: the ranks share one run folder; give it (--run-dir DIR, Audit(out=DIR))")
    shared = Path(out)
    for name in ("events.jsonl", "run.json"):  # a spawned worker's: its launcher's record, by design
        if (shared / name).exists() and rank["source"] != SPAWNED:
            raise ValueError(f"output folder {str(shared)!r} already holds a single-process run "
                             f"record ({name}); {who}: choose a new folder (--run-dir)")
    for other in rank_folders(shared):
        earlier = _other_run(shared / rank_folder_name(other), other, rank)
        if earlier:
            raise ValueError(f"output folder {str(shared)!r} holds rank {other} of {earlier}; "
                             f"{who}: choose a new folder (--run-dir)")
    return check_run_folder(shared / rank_folder_name(rank["rank"]))


def _other_run(folder: Path, other: int, rank: dict) -> str | None:
    """What says rank `other`'s record is no rank of this run (more ranks, another world size,
    torchrun id or launch), or None. A log not written yet (a rank of this run starting) is no objection."""
    if other >= rank["world_size"]:
        return "an earlier run with more ranks"
    try:
        with open(folder / EVENTS_FILE, encoding="utf-8") as log:
            theirs = json.loads(log.readline()).get("rank") or {}
    except (OSError, ValueError, AttributeError):
        return None
    if theirs.get("world_size") not in (None, rank["world_size"]):
        return f"an earlier run of {theirs['world_size']} ranks"
    if theirs.get("run_id") and rank.get("run_id") and theirs["run_id"] != rank["run_id"]:
        return f"an earlier torchrun (run id {theirs['run_id']})"
    why = launches.conflict(theirs, rank) if theirs.get("world_size") is not None else None
    return f"another launch ({why})" if why else None
