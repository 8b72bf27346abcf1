"""`run_comparison`: each side in fresh processes, alternating (baseline, variant 1, variant 2,
baseline, ...) `repeats` times, every result compared with the baseline's first.

Alternating spreads slow spells of a busy machine over every side instead of one. Each run's
folder is deleted once its result is compared (the reference's at the end), unless
`keep_runs` names a folder to keep them in. Interrupted (Ctrl-C, or SIGTERM and SIGHUP under
process_group.ending_signals), the run in progress is ended and `Interrupted` carries the
comparison of the runs that finished, its record saying which run was cut short.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from auditor.capture.process_group import interruption, signal_of
from auditor.comparison.environment import environment
from auditor.comparison.measurement import RunFailed, measure
from auditor.comparison.record import SCHEMA, Comparison
from auditor.comparison.result_files import differing_elements, digest
from auditor.comparison.side import Side


class Interrupted(KeyboardInterrupt):
    """The comparison stopped by Ctrl-C or a signal (`signum`); `.comparison`: the runs that finished."""

    def __init__(self, comparison: Comparison, signum: int):
        super().__init__(comparison.record["interrupted"]["why"])
        self.comparison, self.signum = comparison, signum


def run_comparison(baseline: Side, variants: list[Side], repeats: int = 3, *, require_result: bool = False,
                   name: str | None = None, command: str | None = None, keep_runs: str | Path | None = None,
                   on_run: Callable[[dict], None] | None = None) -> Comparison:
    """Measures every side `repeats` times and returns the comparison (not yet saved).
    Raises ValueError for bad arguments, RunFailed when a run fails, and Interrupted."""
    sides = [baseline, *variants]
    if not variants:
        raise ValueError("a comparison needs at least one variant besides the baseline")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a whole number >= 1, got {repeats!r}")
    names = [side.name for side in sides]
    if len(set(names)) != len(names):
        raise ValueError(f"side names must differ, got {names}")
    record: dict[str, Any] = {  # the comparison record, as JSON holds it
        "schema": SCHEMA, "name": name or f"{baseline.name} vs {', '.join(v.name for v in variants)}",
        "command": command, "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "repeats": repeats, "require_result": require_result, "environment": environment(),
        "sides": [{"name": side.name, "role": "baseline" if side is baseline else "variant",
                   "command": list(side.command),
                   "tolerance": None if side.tolerance is None else side.tolerance.to_json()}
                  for side in sides],
        "reference": f"{baseline.name} run 1", "runs": []}
    if keep_runs is not None and Path(keep_runs).exists() and any(Path(keep_runs).iterdir()):
        raise ValueError(f"keep_runs folder {str(keep_runs)!r} is not empty; name a new or empty folder")
    scratch = Path(keep_runs) if keep_runs is not None else Path(tempfile.mkdtemp(prefix="auditor-compare-"))
    scratch.mkdir(parents=True, exist_ok=True)
    reference = None  # the first run: the baseline's
    side, repeat = baseline, 1
    try:
        for repeat in range(1, repeats + 1):
            for side in sides:
                order = len(record["runs"]) + 1
                run_dir = scratch / f"{order:03d}-{_slug(side.name)}-run{repeat}"
                entry = {"order": order, **measure(side, repeat, run_dir)}
                try:
                    entry["result"] = _result(entry, reference)
                except (OSError, ValueError, RuntimeError) as error:  # an unreadable result file
                    raise RunFailed(side, repeat, f"cannot read its result file "
                                                  f"{entry['result_file']}: {error}", 0, "") from None
                if order == 1:
                    reference = _keep_reference(entry, run_dir, scratch)
                record["runs"].append(entry)
                if on_run is not None:
                    on_run(entry)
                if keep_runs is None and order != 1:
                    shutil.rmtree(run_dir, ignore_errors=True)
    except KeyboardInterrupt as stop:
        done = len(record["runs"])
        record["interrupted"] = {"signal": signal.Signals(signal_of(stop)).name, "run": f"{side.name} run {repeat}",
                                 "why": f"{interruption(stop)} during {side.name} run {repeat}, after "
                                        f"{done} of {repeats * len(sides)} run{'s' * (repeats * len(sides) != 1)}"}
        raise Interrupted(Comparison(record), signal_of(stop)) from None
    finally:
        if keep_runs is None:
            shutil.rmtree(scratch, ignore_errors=True)
    record["environment"]["load_average_end"] = list(os.getloadavg())
    return Comparison(record)


def _result(entry: dict, reference: dict | None) -> dict | None:
    """The run's result, compared with the reference run's (None: this run is the reference)."""
    ref = reference["result"] if reference is not None else None
    if entry.get("result_file"):
        file_digest, elements = digest(entry["result_file"])
        if reference is None:
            return {"kind": "file", "digest": file_digest, "elements": elements,
                    "same_as_reference": True, "differing_elements": 0}
        if not ref or ref["kind"] != "file":
            return {"kind": "file", "digest": file_digest, "elements": elements,
                    "same_as_reference": None, "differing_elements": None}
        differing = differing_elements(reference["result_file"], entry["result_file"])
        return {"kind": "file", "digest": file_digest, "elements": elements,
                "same_as_reference": differing == 0, "differing_elements": differing}
    if entry.get("result_digest"):
        same = True if reference is None else (entry["result_digest"] == ref["digest"]
                                               if ref and ref["kind"] == "digest" else None)
        return {"kind": "digest", "digest": entry["result_digest"], "elements": None,
                "same_as_reference": same, "differing_elements": 0 if same else None}
    return None


def _keep_reference(entry: dict, run_dir: Path, scratch: Path) -> dict:
    """The reference run, its result file copied aside if a later run could overwrite it."""
    file = entry.get("result_file")
    if file and not Path(file).resolve().is_relative_to(run_dir.resolve()):
        copy = scratch / ("reference-result" + Path(file).suffix)
        shutil.copyfile(file, copy)
        return {**entry, "result_file": str(copy)}
    return entry


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:40] or "side"
