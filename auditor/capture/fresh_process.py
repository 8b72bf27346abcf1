"""One fresh-process runner for every command that starts a child: train-step's
configurations, calibration, the validation's real runs, compare's sides.

    command = python_command("auditor.jobs.train_step", settings_json, out)   # the argv alone
    child = run_module("auditor.jobs.train_step", settings_json, out, run_folder=out)
    child.ending        # "exit status 0", "killed by SIGKILL: out of memory?", "interrupted (SIGINT)"
    child.record        # the run folder's record, rebuilt from events.jsonl if run.json is missing

Why a fresh process: its RSS owes nothing to the parent's past. Why an isolated import
path: `python -m` puts the current folder first on sys.path, so a local `architectures/` or
`gradprobe/` (an upstream clone, say) would be imported instead of the installed package.
PYTHONPATH is still honoured.

The child runs in a process group of its own and dies with the parent
(auditor.capture.process_group). Ctrl-C, or SIGTERM or SIGHUP under `ending_signals`, reaches
its group; the parent waits for the child to write its interrupted record (SIGKILL after a
grace period), and raises `Interrupted` (a KeyboardInterrupt naming the signal) that carries
the child's result, so a caller can report what finished.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from auditor.capture import process_group
from auditor.record.schema import RunRecord, Stage

# Python < 3.11 has no -P: drop sys.path[0] (the current folder) before running the module.
_SAFE_PATH_BOOT = ("import runpy, sys; del sys.path[0]; sys.argv.pop(0); "
                   "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")
TAIL_CHARS = 4000
GRACE_S = process_group.GRACE_S  # for an interrupted child to write its record


def python_command(module: str, *args: str) -> list[str]:
    """`python -m module args` in this interpreter, without the current folder on sys.path."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module, *map(str, args)]
    return [sys.executable, "-c", _SAFE_PATH_BOOT, module, *map(str, args)]


@dataclass
class ChildRun:
    """How a child ended, its output's tail and, when it ran an audit, its run record."""
    command: list[str]
    returncode: int
    timeout_s: float | None = None
    timed_out: bool = False
    output: str = ""            # the last TAIL_CHARS of its stdout and stderr
    wall_s: float = 0.0
    record: RunRecord | None = None  # the run folder's record (finished or rebuilt), if any
    parent_interrupted: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def signal(self) -> str | None:
        """The signal's name when the child was killed by one."""
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    @property
    def interrupted(self) -> bool:
        return self.signal in ("SIGINT", "SIGTERM", "SIGHUP") or self.returncode in (129, 130, 143)

    @property
    def ending(self) -> str:
        """In words: exit status, the killing signal (and its likely cause), or the timeout."""
        if self.timed_out:
            return f"killed after the {self.timeout_s:g} s timeout"
        if self.signal == "SIGKILL":
            return "killed by SIGKILL: out of memory?"
        if self.interrupted:
            return f"interrupted ({self.signal or f'exit status {self.returncode}'})"
        if self.signal:
            return f"killed by {self.signal}"
        return f"exit status {self.returncode}"

    @property
    def last_line(self) -> str:
        return (self.output.strip().splitlines() or [""])[-1]

    @property
    def stages(self) -> list[Stage]:
        """The finished stages of its run record (none without one)."""
        return [s for s in self.record.stages if s.finished] if self.record is not None else []

    def failure(self, what: str) -> str:
        """One line for an error: what failed, how it ended, its last line of output."""
        return f"{what} failed ({self.ending})" + (f": {self.last_line}" if self.last_line else "")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or the `signum` that stopped the parent) while a child ran; `.child` is its
    result, finished stages included."""

    def __init__(self, child: ChildRun, signum: int = signal.SIGINT):
        super().__init__(child.ending)
        self.child, self.signum = child, signum


def run_module(module: str, *args: str, run_folder: str | os.PathLike | None = None,
               timeout_s: float | None = None, env: dict | None = None) -> ChildRun:
    """Run `module` in a fresh interpreter (python_command) and wait for it.

    `run_folder`: where the child writes a run record; it is read back (rebuilt from the
    event log when the child died before run.json) and amended with how the child ended.
    Raises ValueError (one line) before starting when `run_folder` already holds a record:
    an old record must never pass for the new run's. Raises `Interrupted` after the child
    has ended when the parent got Ctrl-C.
    """
    if run_folder is not None:
        from auditor.record.run_folder import check_run_folder
        check_run_folder(run_folder)
    command = python_command(module, *args)
    started = time.perf_counter()
    with tempfile.TemporaryFile() as output:  # a file, not a pipe: waiting is resumable
        with process_group.child_group(command, stdout=output, stderr=subprocess.STDOUT,
                                       env=None if env is None else {**os.environ, **env}) as process:
            returncode, timed_out, stop = _wait(process, timeout_s)
        output.seek(max(output.seek(0, os.SEEK_END) - TAIL_CHARS, 0))
        tail = output.read().decode("utf-8", "replace")
    child = ChildRun(command, returncode, timeout_s, timed_out, tail, time.perf_counter() - started,
                     parent_interrupted=stop is not None)
    if run_folder is not None:
        child.record = recovered_record(run_folder, child)
    if stop is not None:
        raise Interrupted(child, process_group.signal_of(stop))
    return child


def _wait(process: subprocess.Popen, timeout_s: float | None) -> tuple[int, bool, KeyboardInterrupt | None]:
    """(returncode, timed out, what interrupted the parent). A timed-out child's group is
    killed; an interrupted one's gets the signal, time to write its record, then SIGKILL."""
    try:
        return process.wait(timeout=timeout_s), False, None
    except subprocess.TimeoutExpired:
        process_group.kill_group(process)
        return process.wait(), True, None
    except KeyboardInterrupt as stop:
        return process_group.end(process, stop, GRACE_S), False, stop


def recovered_record(folder: str | os.PathLike, child: ChildRun | None = None) -> RunRecord | None:
    """The run record in `folder`: run.json, else rebuilt from events.jsonl (and written back
    when the disk allows), amended with how `child` ended when the run did not finish.
    None when the folder holds neither, or a rebuilt record that does not read as one."""
    from auditor.record import run_folder as run_record
    folder = Path(folder)
    try:
        return run_record.load(folder / run_record.RUN_FILE)
    except run_record.RunRecordError:
        pass  # missing or cut short: the event log has every finished stage
    try:
        record = run_record.rebuild(folder, write=False)
    except run_record.RunRecordError:
        return None
    if child is not None and (record.get("exit") or {}).get("status") == "unfinished":
        record["exit"] = _exit_of(child)
    try:
        run_record.write_json_atomically(folder / run_record.RUN_FILE, record)
    except OSError:  # a full disk: the record still comes back in memory
        record.setdefault("warnings", []).append(f"run.json could not be written to {str(folder)!r}")
    try:
        return RunRecord.from_json(record, f"record rebuilt from the event log of {str(folder)!r}")
    except run_record.RunRecordError:
        return None


def _exit_of(child: ChildRun) -> dict:
    status = "interrupted" if child.interrupted and not child.timed_out else "unfinished"
    exit_ = {"status": status, "code": child.returncode, "error": child.ending}
    if child.signal:
        exit_["signal"] = child.signal
    return exit_
