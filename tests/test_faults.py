"""Fault injection on `auditor run`: each case runs a tiny staged script in a real subprocess,
under the auditor and under plain python, and injects a real fault: SIGINT, SIGTERM, SIGKILL,
MemoryError under an address-space limit, an OOM kill under a memory cgroup, a full disk (a
small tmpfs in a private mount namespace), runs started together.

For each: the script ends with the status it has without the auditor (as a shell sees it:
a process a signal ended shows 128 + the signal), no finished stage is lost, and the auditor
prints no traceback of its own. Cases the machine does not permit (no cgroup memory
controller to write, no mount namespace) are skipped with the reason.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

import auditor
from auditor.record.run_folder import assembled

AUDITOR_PACKAGE = str(Path(auditor.__file__).parent)
TIMEOUT_S = 120

STAGED = """
    import sys, time
    import auditor
    with auditor.stage("load"):
        data = bytearray(b"x" * 5_000_000)
    with auditor.stage("work"):
        more = bytearray(b"y" * 1_000_000)
    with auditor.stage("wait"):
        print("ready", flush=True)  # the test injects its fault now
        time.sleep(60)
    print("never reached")
"""
FINISHED_BEFORE_THE_FAULT = [("load", "ok"), ("work", "ok")]


def write_script(folder: Path, text: str, name: str = "job.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def audited(*args) -> list[str]:
    return [sys.executable, "-m", "auditor", "run", *map(str, args)]


def plain(script: Path, *args) -> list[str]:
    return [sys.executable, str(script), *map(str, args)]


def shell_status(returncode: int) -> int:
    """The status a shell shows: a process a signal ended shows 128 + the signal."""
    return 128 - returncode if returncode < 0 else returncode


def default_signals() -> None:
    """The child starts with default handlers, whatever the test runner ignores (a
    background job ignores SIGINT; python then never raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run(command, cwd: Path, preexec_fn=default_signals, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S,
                          preexec_fn=preexec_fn, env=env)


def run_and_signal(command, cwd: Path, signum: int) -> subprocess.CompletedProcess:
    """Start `command`, wait until the script prints "ready" inside its stage, send `signum`."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, preexec_fn=default_signals)
    try:
        line = process.stdout.readline()
        assert line.strip() == "ready", (line, process.stderr.read() if process.poll() is not None else "")
        process.send_signal(signum)
        out, err = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(command, process.returncode, line + out, err)


def assert_no_auditor_traceback(stderr: str) -> None:
    assert f'File "{AUDITOR_PACKAGE}' not in stderr, stderr
    assert "auditor: error" not in stderr, stderr


def stages_of(record: dict) -> list[tuple[str, str]]:
    """(path, status) of each stage of a run record as JSON (run.json's text, `.to_json()`)."""
    return [(s["path"], s["status"]) for s in record["stages"]]


def finished_stages(folder: Path) -> list[tuple[str, str]]:
    return [s for s in stages_of(auditor.load(folder, from_events=True).to_json()) if s[1] != "open"]


@dataclass
class Injected:
    """One fault injected into the same script twice: alone (plain python), then under `auditor run`.
    The functions that inject return it; the tests assert on it, benchmarks/reliability.py counts it."""
    alone: int  # the script's status alone, as a shell shows it
    status: int  # its status under the auditor, as a shell shows it
    result: subprocess.CompletedProcess  # the auditor's process: its output
    folder: Path | None  # the run folder (None: no folder was made)
    finished: list[tuple[str, str]]  # the stages finished before the fault: each must stay in the record
    alone_stderr: str = ""  # the script's own stderr, alone: what it prints without the auditor
    ran: int | None = None  # stages the script finishes in all, where later ones may find no room


# -- signals ------------------------------------------------------------------------------

HANDLES_SIGTERM = """
    import signal, sys, time
    import auditor
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(7))
    with auditor.stage("load"):
        data = bytearray(b"x" * 5_000_000)
    with auditor.stage("wait"):
        print("ready", flush=True)
        time.sleep(60)
"""


def signalled(tmp_path: Path, signum: int, text: str = STAGED,
              finished=tuple(FINISHED_BEFORE_THE_FAULT)) -> Injected:
    """`text` sent `signum` inside its "wait" stage, alone and under the auditor."""
    script = write_script(tmp_path, text)
    alone = run_and_signal(plain(script), tmp_path, signum)
    result = run_and_signal(audited("--out", tmp_path / "run", script), tmp_path, signum)
    return Injected(shell_status(alone.returncode), shell_status(result.returncode), result,
                    tmp_path / "run", list(finished), alone.stderr)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_stage_gives_an_interrupted_record(tmp_path, signum):
    fault = signalled(tmp_path, signum)
    result = fault.result
    assert fault.status == fault.alone == 128 + signum
    # as python alone: Ctrl-C's KeyboardInterrupt shows the script's traceback, SIGTERM none
    assert ("Traceback" in result.stderr) == ("Traceback" in fault.alone_stderr), (fault.alone_stderr, result.stderr)
    assert_no_auditor_traceback(result.stderr)
    record = auditor.load(tmp_path / "run")  # a finished record: run.json
    assert stages_of(record.to_json()) == FINISHED_BEFORE_THE_FAULT + [("wait", "failed")]
    name = signal.Signals(signum).name
    expected = "KeyboardInterrupt" if signum == signal.SIGINT else name
    assert record.exit.to_json() == {"status": "interrupted", "code": 128 + signum, "error": expected}
    assert record.stages[-1].error.endswith(expected)


def handled_sigterm(tmp_path: Path) -> Injected:
    return signalled(tmp_path, signal.SIGTERM, HANDLES_SIGTERM, finished=[("load", "ok")])


def test_a_script_that_handles_sigterm_itself_keeps_its_own_ending(tmp_path):
    fault = handled_sigterm(tmp_path)
    assert fault.result.returncode == fault.status == fault.alone == 7
    record = auditor.load(tmp_path / "run")
    assert record.exit.status == "failed" and record.exit.code == 7
    assert stages_of(record.to_json()) == [("load", "ok"), ("wait", "failed")]


# `auditor run`, with a SIGTERM sent to itself the moment the audit starts writing its record:
# where torchrun's lands on a rank that had just finished when another rank failed.
def signal_as_the_record_is_written(name: str) -> str:
    """A driver of `auditor run` that sends itself signal `name` (SIGTERM, SIGINT, ...) the
    moment the audit starts writing its record."""
    return f"""
    import os, signal, sys
    from auditor.capture.audit import Audit
    finish = Audit._finish
    def finish_under_the_signal(self, exc):
        os.kill(os.getpid(), signal.{name})
        finish(self, exc)
    Audit._finish = finish_under_the_signal
    from auditor.cli import main
    sys.exit(main(["run", "--out", sys.argv[1], sys.argv[2]]))
"""


SIGTERM_AS_THE_RECORD_IS_WRITTEN = signal_as_the_record_is_written("SIGTERM")


def test_a_sigterm_while_the_record_is_written_waits_for_it(tmp_path):
    script = write_script(tmp_path, STAGED.replace('print("ready", flush=True)', "pass")
                          .replace("time.sleep(60)", "pass"))
    driver = write_script(tmp_path, SIGTERM_AS_THE_RECORD_IS_WRITTEN, "driver.py")
    result = run([sys.executable, driver, tmp_path / "run", script], tmp_path)
    assert result.returncode == -signal.SIGTERM, result.stderr  # ended by it, as python would be
    record = auditor.load(tmp_path / "run")  # a finished record: run.json, written first
    assert stages_of(record.to_json()) == FINISHED_BEFORE_THE_FAULT + [("wait", "ok")]
    assert record.exit.status == "ok"
    assert_no_auditor_traceback(result.stderr)


# A Ctrl-C that lands while a finished stage's line is being made durable (fsync), as a
# terminal's does when a user presses it on seeing the stage end: the stage is in the log, so
# the record has it too, finished.
CTRL_C_AS_A_STAGE_IS_WRITTEN = """
    import os, signal
    import auditor
    real_fsync = os.fsync
    def fsync_then_ctrl_c(fd):
        real_fsync(fd)
        os.fsync = real_fsync
        os.kill(os.getpid(), signal.SIGINT)
    with auditor.stage("load"):
        data = bytearray(b"x" * 5_000_000)
    with auditor.stage("work"):
        os.fsync = fsync_then_ctrl_c
    with auditor.stage("never"):
        pass
"""


def test_ctrl_c_while_a_finished_stage_is_written_keeps_it_finished(tmp_path):
    script = write_script(tmp_path, CTRL_C_AS_A_STAGE_IS_WRITTEN)
    result = run(audited("--out", tmp_path / "run", script), tmp_path)
    assert shell_status(result.returncode) == 130, result.stderr
    assert_no_auditor_traceback(result.stderr)
    logged = stages_of(assembled(tmp_path / "run"))  # the event log on disk
    assert logged == FINISHED_BEFORE_THE_FAULT, logged
    record = auditor.load(tmp_path / "run")  # run.json: what the audit kept in memory
    assert stages_of(record.to_json()) == FINISHED_BEFORE_THE_FAULT
    assert record.exit.status == "interrupted"
    assert record.event_log.lines == len((tmp_path / "run" / "events.jsonl").read_text().splitlines())


def test_sigkill_mid_stage_loses_no_finished_stage_and_still_reports(tmp_path):
    fault = signalled(tmp_path, signal.SIGKILL)
    folder = fault.folder
    assert fault.result.returncode == -signal.SIGKILL and fault.status == fault.alone == 128 + signal.SIGKILL
    assert finished_stages(folder) == FINISHED_BEFORE_THE_FAULT
    before = sorted(p.name for p in folder.iterdir())

    report = run([sys.executable, "-m", "auditor", "report", folder, "-o", tmp_path / "killed.md"], tmp_path)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "killed.md").read_text()
    assert "This run did not finish" in text.split("## Summary")[0]  # said at the top
    assert "2 of 3 stages finished, the last `work`" in text and "open when it stopped: `wait`" in text
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing written into the run

    rebuilt = run([sys.executable, "-m", "auditor", "rebuild", folder], tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "2 finished stages, 1 open; exit unfinished" in rebuilt.stdout
    assert stages_of(auditor.load(folder).to_json()) == FINISHED_BEFORE_THE_FAULT + [("wait", "open")]


# -- memory --------------------------------------------------------------------------------

def over_an_address_space_limit(tmp_path: Path) -> Injected:
    """A script asking for 8 GiB under a 2 GiB RLIMIT_AS: a MemoryError in its second stage."""
    script = write_script(tmp_path, """
        import auditor
        with auditor.stage("load"):
            data = bytearray(b"x" * 5_000_000)
        with auditor.stage("too big"):
            huge = bytearray(8 * 2**30)
    """)

    def limited():
        default_signals()
        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))

    alone = run(plain(script), tmp_path, preexec_fn=limited)
    result = run(audited("--out", tmp_path / "run", script), tmp_path, preexec_fn=limited)
    return Injected(shell_status(alone.returncode), shell_status(result.returncode), result,
                    tmp_path / "run", [("load", "ok")], alone.stderr)


def test_memory_error_under_an_address_space_limit(tmp_path):
    fault = over_an_address_space_limit(tmp_path)
    result = fault.result
    assert result.returncode == fault.alone == 1
    assert "MemoryError" in result.stderr  # the script's own traceback, as python shows it
    assert_no_auditor_traceback(result.stderr)
    record = auditor.load(tmp_path / "run")
    assert stages_of(record.to_json()) == [("load", "ok"), ("too big", "failed")]
    assert record.exit.to_json() == {"status": "failed", "code": 1, "error": "MemoryError"}


def memory_cgroup(limit: int) -> Path:
    """A child of this process's memory cgroup limited to `limit` bytes (cgroup v2's
    memory.max, or v1's memory.limit_in_bytes); skips with the reason where not permitted."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") or [""]:
            own[controller] = path
    mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    name = f"auditor-test-{uuid.uuid4().hex[:8]}"
    for _, where, kind, options, *_ in mounts:
        if kind == "cgroup2" and "" in own and "memory" in _read(
                Path(where) / own[""].lstrip("/") / "cgroup.subtree_control"):
            return _make_cgroup(Path(where) / own[""].lstrip("/") / name, {"memory.max": limit, "memory.swap.max": 0})
        if kind == "cgroup" and "memory" in options.split(",") and "memory" in own:
            return _make_cgroup(Path(where) / own["memory"].lstrip("/") / name,
                                {"memory.limit_in_bytes": limit, "memory.memsw.limit_in_bytes": limit})
    pytest.skip("no memory cgroup controller this process may use (cgroup v2 memory not "
                "delegated to its cgroup, no v1 memory hierarchy)")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _make_cgroup(path: Path, limits: dict) -> Path:
    try:
        path.mkdir()
    except OSError as error:
        pytest.skip(f"cannot create a memory cgroup at {path}: {error.strerror}")
    for name, value in limits.items():
        try:
            (path / name).write_text(str(value))
        except FileNotFoundError:
            continue  # memsw / swap.max: absent without swap accounting, and then not needed
        except OSError as error:
            path.rmdir()
            pytest.skip(f"cannot set {name} in {path}: {error.strerror}")
    return path


def oom_killed_in_a_memory_cgroup(tmp_path: Path) -> Injected:
    """A script growing without end in a 300 MiB memory cgroup, until the kernel's OOM killer
    ends it (skips with the reason where no memory cgroup can be made)."""
    script = write_script(tmp_path, """
        import auditor
        with auditor.stage("load"):
            data = bytearray(b"x" * 5_000_000)
        with auditor.stage("work"):
            more = bytearray(b"y" * 1_000_000)
        with auditor.stage("grow"):
            chunks = []
            while True:
                chunks.append(b"z" * 10_000_000)  # touched pages: real memory
    """)
    cgroup = memory_cgroup(300 * 2**20)

    def contained():
        default_signals()
        (cgroup / "cgroup.procs").write_text("0")  # this child, before it runs anything

    try:
        alone = run(plain(script), tmp_path, preexec_fn=contained)
        result = run(audited("--out", tmp_path / "run", script), tmp_path, preexec_fn=contained)
    finally:
        for _ in range(50):  # the killed processes leave the cgroup as they are reaped
            try:
                cgroup.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    return Injected(shell_status(alone.returncode), shell_status(result.returncode), result,
                    tmp_path / "run", FINISHED_BEFORE_THE_FAULT, alone.stderr)


def test_oom_kill_under_a_memory_cgroup_loses_no_finished_stage(tmp_path):
    fault = oom_killed_in_a_memory_cgroup(tmp_path)
    result = fault.result
    assert result.returncode == -signal.SIGKILL and fault.alone == 128 + signal.SIGKILL, result.stderr
    assert finished_stages(tmp_path / "run") == FINISHED_BEFORE_THE_FAULT
    report = run([sys.executable, "-m", "auditor", "report", tmp_path / "run", "-o", tmp_path / "oom.md"], tmp_path)
    assert report.returncode == 0, report.stderr
    assert "open when it stopped: `grow`" in (tmp_path / "oom.md").read_text()


# -- a full disk -----------------------------------------------------------------------------

FILLS_THE_DISK = """
    import os, sys
    import auditor
    disk, then = sys.argv[1], sys.argv[2]
    with auditor.stage("load"):
        data = bytearray(b"x" * 5_000_000)
    with auditor.stage("fill"):  # the program fills the disk the run folder is on
        filler = os.path.join(disk, "filler")
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\\0" * 65536)
            except OSError as error:
                print("disk full:", error.strerror, flush=True)
        if then == "leave-1mb":  # room for a record, not for a 4 MB flamegraph
            os.truncate(filler, os.path.getsize(filler) - 1_000_000)
    for step in range(40):  # more events than the log's last page holds
        with auditor.stage(f"step {step}"):
            more = bytearray(b"y" * 100_000)
    if then == "free":
        os.remove(filler)
    print("script done", flush=True)
"""

IN_A_SMALL_DISK = """
    set -u
    disk=$(mktemp -d)
    mount -t tmpfs -o size="$SIZE" tmpfs "$disk" || exit 97
    cd "$disk"
    "$@" "$disk" "$THEN"
    echo "$?" > "$HOST/status"
    cp -a "$disk/." "$HOST/disk"
"""


def on_a_small_disk(tmp_path: Path, size: str, then: str, *command) -> tuple[int, subprocess.CompletedProcess, Path]:
    """Run `command DISK THEN` in a private mount namespace (inside a user namespace, so no
    root is needed) with a tmpfs of `size` as DISK (its current folder), then copy the
    disk's files to the returned folder."""
    host = tmp_path / f"host-{uuid.uuid4().hex[:6]}"
    (host / "disk").mkdir(parents=True)
    shell = ["unshare", "--map-root-user", "--mount", "--propagation", "private", "sh", "-c",
             textwrap.dedent(IN_A_SMALL_DISK), "sh", *map(str, command)]
    try:
        result = run(shell, tmp_path, env={**os.environ, "SIZE": size, "THEN": then, "HOST": str(host)})
    except FileNotFoundError:
        pytest.skip("no unshare command: cannot mount a small disk apart from this machine's")
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace here: {result.stderr.strip()[:200]}")
    return int((host / "status").read_text()), result, host / "disk"


EVERY_STAGE_OF_FILLS_THE_DISK = [("load", "ok"), ("fill", "ok")] + [(f"step {i}", "ok") for i in range(40)]


def on_a_full_disk(tmp_path: Path, then: str, size: str = "1m", *options: str) -> Injected:
    """FILLS_THE_DISK on a small disk of `size`, alone and under `auditor run OPTIONS`. `then`:
    "keep" the disk full to the end, "free" it before the script ends, or "leave-1mb" free."""
    script = write_script(tmp_path, FILLS_THE_DISK)
    alone, by_itself, _ = on_a_small_disk(tmp_path, size, then, *plain(script))
    status, result, disk = on_a_small_disk(tmp_path, size, then, *audited(*options, "--out", "run", script))
    # Kept full: the stages that ended before the disk was full (and "fill", whose end the log
    # still holds); with space again by the end: every stage, in run.json.
    finished = EVERY_STAGE_OF_FILLS_THE_DISK[:2] if then == "keep" else EVERY_STAGE_OF_FILLS_THE_DISK
    return Injected(alone, status, result, disk / "run", finished, by_itself.stderr,
                    ran=len(EVERY_STAGE_OF_FILLS_THE_DISK))


def record_before_flamegraph(tmp_path: Path) -> Injected:
    """--memray with 1 MB left on an 8 MB disk: room for the record, not for the flamegraph."""
    pytest.importorskip("memray")
    return on_a_full_disk(tmp_path, "leave-1mb", "8m", "--memray")


def test_a_full_disk_never_changes_the_scripts_status_and_loses_no_finished_stage(tmp_path):
    fault = on_a_full_disk(tmp_path, "keep")
    status, result, disk = fault.status, fault.result, fault.folder.parent
    assert status == fault.alone == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "events.jsonl could not be written: No space left on device" in result.stderr
    folder = disk / "run"
    assert sorted(p.name for p in folder.iterdir()) == ["events.jsonl"]  # no run.json.tmp
    last = result.stderr.strip().splitlines()[-1]
    assert "run record: not written" in last and "run.json " not in last.replace("writes run.json", "")
    finished = finished_stages(folder)  # every stage finished before the disk filled
    assert finished[:2] == [("load", "ok"), ("fill", "ok")]

    rebuilt = run([sys.executable, "-m", "auditor", "rebuild", folder], tmp_path)  # space again
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert [s for s in stages_of(auditor.load(folder).to_json()) if s[1] != "open"] == finished


def test_a_disk_that_frees_up_gets_the_whole_record_from_memory(tmp_path):
    fault = on_a_full_disk(tmp_path, "free")
    status, result, disk = fault.status, fault.result, fault.folder.parent
    assert status == fault.alone == 0 and "Traceback" not in result.stderr, result.stderr
    record = json.loads((disk / "run" / "run.json").read_text())
    assert stages_of(record) == EVERY_STAGE_OF_FILLS_THE_DISK
    log = record["event_log"]
    assert log["state"] == "incomplete" and "No space left on device" in log["reason"]
    assert log["lines"] == len((disk / "run" / "events.jsonl").read_text().splitlines())
    assert result.stderr.strip().splitlines()[-1].endswith("run/run.json")


def test_the_record_is_written_before_the_flamegraph(tmp_path):
    fault = record_before_flamegraph(tmp_path)
    status, result, disk = fault.status, fault.result, fault.folder.parent
    assert status == fault.alone == 0 and "Traceback" not in result.stderr, result.stderr
    folder = disk / "run"
    record = json.loads((folder / "run.json").read_text())
    assert len(record["stages"]) == 42 and record["memray"]["sites"]  # the record is whole
    assert record["memray"]["flamegraph"] is None and "flamegraph" not in record["files"]
    assert record["probes"]["memray"]["state"] == "failed"
    assert not (folder / "memray-flamegraph.html").exists()  # no half-written file
    assert "flamegraph not written" in result.stderr


# -- runs started together -------------------------------------------------------------------

def started_together(tmp_path: Path, count: int = 8) -> list[Injected]:
    """`count` copies of a one-stage script started at once, alone, then under `auditor run`
    with no --out (each claims its own folder under runs/). One Injected per audited run; the
    folders are paired with the runs in name order, None where fewer folders than runs exist."""
    script = write_script(tmp_path, """
        import auditor
        with auditor.stage("load"):
            data = bytearray(b"x" * 1_000_000)
    """)

    def together(command) -> list[subprocess.CompletedProcess]:
        processes = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for _ in range(count)]
        outputs = [p.communicate(timeout=TIMEOUT_S) for p in processes]
        return [subprocess.CompletedProcess(command, p.returncode, *output)
                for p, output in zip(processes, outputs, strict=False)]

    alone = together(plain(script))
    results = together(audited(script))
    runs = tmp_path / "runs"
    folders = sorted(runs.iterdir()) if runs.is_dir() else []
    folders += [None] * (count - len(folders))
    return [Injected(shell_status(a.returncode), shell_status(r.returncode), r, folder, [("load", "ok")], a.stderr)
            for a, r, folder in zip(alone, results, folders, strict=False)]


def test_runs_started_together_never_share_a_folder(tmp_path):
    runs = started_together(tmp_path, 8)
    assert [(run.alone, run.status) for run in runs] == [(0, 0)] * 8, [run.result.stderr for run in runs]
    folders = sorted((tmp_path / "runs").iterdir())
    assert len(folders) == 8
    for folder in folders:
        assert stages_of(auditor.load(folder).to_json()) == [("load", "ok")]
        assert auditor.load(folder).exit.status == "ok"


# -- every fault above, as benchmarks/reliability.py injects it -----------------------------
# name: what injects it (into a fresh empty folder), giving one Injected per audited run.

FAULTS = {
    "SIGINT mid-stage": lambda tmp_path: [signalled(tmp_path, signal.SIGINT)],
    "SIGTERM mid-stage": lambda tmp_path: [signalled(tmp_path, signal.SIGTERM)],
    "SIGTERM, the script's own handler exits 7": lambda tmp_path: [handled_sigterm(tmp_path)],
    "SIGKILL mid-stage": lambda tmp_path: [signalled(tmp_path, signal.SIGKILL)],
    "MemoryError under RLIMIT_AS 2 GiB": lambda tmp_path: [over_an_address_space_limit(tmp_path)],
    "OOM kill in a 300 MiB memory cgroup": lambda tmp_path: [oom_killed_in_a_memory_cgroup(tmp_path)],
    "ENOSPC: 1 MiB tmpfs filled, kept full": lambda tmp_path: [on_a_full_disk(tmp_path, "keep")],
    "ENOSPC: 1 MiB tmpfs filled, freed before the end": lambda tmp_path: [on_a_full_disk(tmp_path, "free")],
    "ENOSPC: --memray, 1 MB left for record and flamegraph": lambda tmp_path: [record_before_flamegraph(tmp_path)],
    "8 runs started together, no --out": lambda tmp_path: started_together(tmp_path, 8),
}
