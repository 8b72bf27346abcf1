"""One run of one side: a fresh process, its exact peak RSS, CPU and wall time, and what it
reported through the result protocol.

The command is started by `launcher.py` (see there why), itself a child in a process group of
its own (auditor.capture.process_group) waited for with `os.wait4` on its own pid. The
command's output goes to files in the run folder (`stdout.txt`, `stderr.txt`), shown only
when the run fails.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from auditor.capture.process_group import child_group
from auditor.comparison import protocol
from auditor.comparison.launcher import PARENT_DIED
from auditor.comparison.side import Side, Tolerance
from auditor.facts import safe_files

LAUNCHER = Path(__file__).with_name("launcher.py")
TAIL_LINES = 20


class RunFailed(Exception):
    """A run exited with a non-zero status, or reported something unreadable."""

    def __init__(self, side: Side, repeat: int, message: str, exit_status: int | None, stderr_tail: str):
        super().__init__(f"{side.name} run {repeat}: {message}")
        self.side, self.repeat, self.exit_status, self.stderr_tail = side, repeat, exit_status, stderr_tail


def measure(side: Side, repeat: int, run_dir: Path) -> dict:
    """Runs `side` once in `run_dir` (created, empty) and returns the run's entry for the record:
    started_at, load_average, command, exit_status, peak_rss, wall_s, cpu_s, and the protocol's
    fields (loaded_rss, result_file, result_digest, tolerance, anything else under `reported`)."""
    run_dir.mkdir(parents=True, exist_ok=False)
    command = side.command_for(run_dir)
    result_json, launch_json = run_dir / "auditor-result.json", run_dir / "auditor-launch.json"
    env = {**os.environ, **side.env, protocol.ENV: str(result_json)}
    entry = {"side": side.name, "repeat": repeat,
             "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "load_average": list(os.getloadavg()), "command": command}
    # The launcher in a group of its own, ended on an exception here (Ctrl-C, SIGTERM) or our death
    with open(safe_files.open_new(run_dir / "stdout.txt"), "wb") as stdout, \
            open(safe_files.open_new(run_dir / "stderr.txt"), "wb") as stderr, \
            child_group([sys.executable, "-I", "-S", str(LAUNCHER), str(launch_json), *command],
                        death_signal=PARENT_DIED, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                        env=env, cwd=side.cwd) as launcher:
        _, status, _ = os.wait4(launcher.pid, 0)
        launcher.returncode = os.waitstatus_to_exitcode(status)
    launch: dict[str, Any] = (json.loads(launch_json.read_text()) if launch_json.exists()
                              else {"error": "the launcher died"})
    if "error" in launch:
        raise RunFailed(side, repeat, launch["error"], None, _tail(run_dir / "stderr.txt"))
    entry.update(exit_status=launch["exit_status"], peak_rss=launch["peak_rss"], wall_s=launch["wall_s"],
                 cpu_s=launch["cpu_s"])
    if launch["exit_status"] != 0:
        raise RunFailed(side, repeat, f"exited with status {launch['exit_status']}", launch["exit_status"],
                        _tail(run_dir / "stderr.txt"))
    try:
        fields = protocol.read(result_json, Path(side.cwd or os.getcwd()))
        if side.collect is not None:
            collected = side.collect(run_dir)
            protocol.check(collected)
            fields.update(collected)
        Tolerance.from_json(fields.get("tolerance"))
    except (ValueError, OSError) as error:
        raise RunFailed(side, repeat, str(error), 0, _tail(run_dir / "stderr.txt")) from None
    for key in ("loaded_rss", "result_file", "result_digest", "tolerance"):
        entry[key] = fields.pop(key, None)
    entry["reported"] = fields
    return entry


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-TAIL_LINES:])
