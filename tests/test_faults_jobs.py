"""Issue 32's job-command cases: the commands that start children (compare, train-step,
validate-projection, gradprobe's calibration) stopped by SIGTERM, SIGHUP or SIGKILL leave no
child running, remove their temporary folder, write a partial report saying what was
interrupted and exit 128 + the signal; and small command-line defects (a dangling-symlink
--run-dir, --margin -1GiB, a killed configuration's stdout, "1 runs per side").

Real commands, real children, real signals: each case is a function of an empty folder
returning fault_cases.Held (benchmarks/reliability.py counts them).
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import io
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from fault_cases import Held
from test_faults import default_signals, shell_status, write_script

TIMEOUT_S = 90
TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256"]
QUICK = 'print("quick")\n'
SLOW = """
    import os, sys, time
    open(sys.argv[1] + ".tmp", "w").write(f"{os.getpid()} {os.getppid()}")
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])  # whole, once there
    time.sleep(60)
"""


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet has ended: its parent died, and so did it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def wait_for_file(path: Path, process: subprocess.Popen, seconds: float = TIMEOUT_S) -> str:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            out, err = process.communicate()
            raise AssertionError(f"{path} never came (exit {process.returncode}): {err[-2000:]}")
        time.sleep(0.05)
    return path.read_text()


def start(command: list[str], cwd: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=cwd, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_signals, env=None if env is None else {**os.environ, **env})


# -- compare -------------------------------------------------------------------------------

def compare_stopped(tmp_path: Path, signum: int):
    """`auditor compare` of a quick baseline and a variant that sleeps, `signum` sent to the
    command while the variant runs. (result, the variant's pid, its launcher's pid, temporary
    folder, report)."""
    write_script(tmp_path, QUICK, "quick.py")
    write_script(tmp_path, SLOW, "slow.py")
    scratch, pids, report = tmp_path / "tmp", tmp_path / "pids", tmp_path / "lean.md"
    scratch.mkdir()
    python = shlex.quote(sys.executable)
    process = start([sys.executable, "-m", "auditor", "compare", "--repeats", "1",
                     "--baseline-cmd", "baseline", f"{python} quick.py",
                     "--variant-cmd", "lean", f"{python} slow.py {shlex.quote(str(pids))}", "-o", str(report)],
                    tmp_path, env={"TMPDIR": str(scratch)})
    try:
        variant, launcher = map(int, wait_for_file(pids, process).split())
        process.send_signal(signum)
        out, err = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return done, variant, launcher, scratch, report


@functools.cache
def _compare_stopped_by_sigterm():
    """compare_stopped by SIGTERM, once for the cases that look at it, in a folder of its own."""
    folder = Path(tempfile.mkdtemp(prefix="test-faults-jobs-"))
    atexit.register(shutil.rmtree, folder, True)
    return compare_stopped(folder, signal.SIGTERM)


def sigterm_to_compare(tmp_path: Path) -> Held:
    done, variant, launcher, scratch, report = _compare_stopped_by_sigterm()
    text = report.read_text() if report.exists() else ""
    left = sorted(p.name for p in scratch.glob("auditor-compare-*"))
    said = "did not finish: interrupted (SIGTERM) during lean run 1, after 1 of 2 runs" in text
    held = (shell_status(done.returncode) == 143 and not alive(variant) and not alive(launcher) and not left
            and said and "Traceback" not in done.stderr)
    return Held(held, f"exit {shell_status(done.returncode)}; measured command "
                      f"{'still running' if alive(variant) else 'ended'}, launcher "
                      f"{'still running' if alive(launcher) else 'ended'}; temporary folders left: {left or 'none'}; "
                      f"partial report {'says so' if said else 'missing or silent'}")


def sigkill_to_compare(tmp_path: Path) -> Held:
    """SIGKILL cannot be caught: the launcher learns of it by PR_SET_PDEATHSIG and ends the
    measured command's group. Its temporary folder stays (nothing of the command can run)."""
    done, variant, launcher, _, _ = compare_stopped(tmp_path, signal.SIGKILL)
    ended = gone_within([variant, launcher], 5)
    return Held(shell_status(done.returncode) == 137 and ended,
                f"exit {shell_status(done.returncode)}; measured command and launcher "
                f"{'ended within 5 s' if ended else 'still running after 5 s'} (the temporary folder stays)")


def one_run_per_side(tmp_path: Path) -> Held:
    from auditor.cli import main
    report = tmp_path / "again.md"
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(["compare", "--from", str(_compare_stopped_by_sigterm()[4].with_suffix(".json")), "-o",
                     str(report)])
    text = report.read_text() if report.exists() else ""
    said = "1 run per side" in text and "1 runs" not in text
    kept = "did not finish: interrupted (SIGTERM)" in text  # the record says so when rendered again
    return Held(code == 0 and said and kept, f"exit {code}; '1 run per side' {'written' if said else 'not written'}"
                                             f"; re-rendered report {'says' if kept else 'forgets'} it was stopped")


# -- train-step: one sweep, two configurations ------------------------------------------------

def _stage_pid(folder: Path, stage: str, seconds: float = TIMEOUT_S) -> int:
    from test_job_commands_faults import wait_for_stage
    return wait_for_stage(folder, stage, seconds)


@functools.cache
def _train_step_sweep() -> tuple[subprocess.CompletedProcess, int, Path]:
    """Sequence 8 is killed by SIGKILL (as the OOM killer would) once `forward only` finished;
    sequence 16 runs until its `forward only` finished, when the command gets SIGHUP (its
    terminal closed). (result, sequence 16's child pid, run folder)."""
    folder = Path(tempfile.mkdtemp(prefix="test-faults-jobs-"))
    atexit.register(shutil.rmtree, folder, True)
    runs = folder / "runs"
    process = start([sys.executable, "-m", "auditor", "train-step", *TINY, "--seq-len", "8", "16",
                     "--steps", "100000", "--no-memray", "--run-dir", str(runs), "-o", str(folder / "report.md")],
                    folder)
    try:
        os.kill(_stage_pid(runs / "tinystories-33m-seq8-fp32", "forward only"), signal.SIGKILL)
        child = _stage_pid(runs / "tinystories-33m-seq16-fp32", "forward only")
        process.send_signal(signal.SIGHUP)
        out, err = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), child, folder


def sighup_to_train_step(tmp_path: Path) -> Held:
    done, child, folder = _train_step_sweep()
    report = folder / "report.md"
    text = report.read_text() if report.exists() else ""
    said = next((line for line in text.splitlines() if "did not finish: interrupted (SIGHUP)" in line), "")
    kept = "Finished stages: `build model`, `forward only`" in said  # step 1 too, if it beat the signal
    ended = gone_within([child], 2)
    held = (shell_status(done.returncode) == 129 and ended and kept and "Traceback" not in done.stderr
            and "interrupted (SIGHUP)" in done.stderr)
    return Held(held, f"exit {shell_status(done.returncode)}; the configuration's process "
                      f"{'ended' if ended else 'still running'}; partial report "
                      f"{'keeps its finished stages' if kept else 'lost them'}")


def out_of_memory_stdout(tmp_path: Path) -> Held:
    """The configuration killed (as by the OOM killer) says how it ended and shows the figures
    of what finished: forward only's when no step did (was "forward only -, full step -")."""
    done, _, _ = _train_step_sweep()
    line = next((line for line in done.stdout.splitlines() if line.startswith("tinystories-33m seq 8 ")), "")
    # Killed once `forward only` finished: nearly always before step 1 did (a step takes ~0.3 s)
    before_a_step = "no full step finished (killed by SIGKILL: out of memory?); forward only " in line
    after_a_step = "live tensors; peak RSS" in line and line.endswith("(killed by SIGKILL: out of memory?)")
    held = (before_a_step or after_a_step) and "live tensors" in line and " -" not in line
    return Held(held, f"stdout: {line or 'no line for the configuration'}")


# -- a fresh-process job whose parent is killed ------------------------------------------------

SLEEPER = """
    import os, sys, time
    open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(60)
"""
PARENT = """
    import sys
    from auditor.capture.fresh_process import run_module
    run_module("sleeper", sys.argv[1])
"""


def sigkill_to_a_jobs_parent(tmp_path: Path) -> Held:
    """A job's child (fresh_process.run_module: train-step's configurations, calibration, the
    validation's real runs) dies with its parent, by PR_SET_PDEATHSIG."""
    write_script(tmp_path, SLEEPER, "sleeper.py")
    parent = write_script(tmp_path, PARENT, "parent.py")
    pid_file = tmp_path / "pid"
    process = start([sys.executable, str(parent), str(pid_file)], tmp_path, env={"PYTHONPATH": str(tmp_path)})
    try:
        child = int(wait_for_file(pid_file, process))
        process.kill()
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    ended = gone_within([child], 5)
    return Held(ended, f"the child {'ended within 5 s' if ended else 'still running 5 s'} after its parent's SIGKILL")


THREADED = """
    import sys
    from concurrent.futures import ThreadPoolExecutor
    from auditor.capture.fresh_process import run_module
    from auditor.capture.process_group import ending_signals, exit_status
    with ending_signals():
        try:
            with ThreadPoolExecutor(max_workers=1) as pool:  # as validate-projection traces the target
                traced = pool.submit(run_module, "sleeper", sys.argv[1] + "-thread")
                run_module("sleeper", sys.argv[1])
                traced.result()
        except KeyboardInterrupt as stop:
            sys.exit(exit_status(stop))
"""


def sigterm_with_a_child_in_another_thread(tmp_path: Path) -> Held:
    """validate-projection waits for its calibration runs while a thread waits for the traced
    target: SIGTERM ends both children, the one no `end` waits for too."""
    write_script(tmp_path, SLEEPER, "sleeper.py")
    parent = write_script(tmp_path, THREADED, "parent.py")
    pid_file = tmp_path / "pid"
    process = start([sys.executable, str(parent), str(pid_file)], tmp_path, env={"PYTHONPATH": str(tmp_path)})
    try:
        children = [int(wait_for_file(pid_file, process)), int(wait_for_file(tmp_path / "pid-thread", process))]
        process.terminate()
        process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    ended = gone_within(children, 2)
    return Held(shell_status(process.returncode) == 143 and ended,
                f"exit {shell_status(process.returncode)}; both children {'ended' if ended else 'not ended'}")


# -- small command-line defects ------------------------------------------------------------

def _in_process(argv: list[str]) -> tuple[int, str]:
    from auditor.cli import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


def dangling_run_dir(tmp_path: Path) -> Held:
    """Each command that takes --run-dir, given a link to nothing: one line naming it, exit 2,
    nothing created where it points."""
    link, target = tmp_path / "runs", tmp_path / "gone" / "runs"
    link.symlink_to(target)
    script = write_script(tmp_path, QUICK, "quick.py")
    python = shlex.quote(sys.executable)
    commands = {
        "run": ["run", "--run-dir", str(link), str(script)],
        "train-step": ["train-step", *TINY, "--seq-len", "8", "--run-dir", str(link), "-o", str(tmp_path / "t.md")],
        "gradprobe": ["gradprobe", *TINY, "--no-trace", "--run-dir", str(link), "-o", str(tmp_path / "g.md")],
        "validate-projection": ["validate-projection", *TINY, "--run-dir", str(link)],
        "compare": ["compare", "--baseline-cmd", "a", f"{python} {script}", "--variant-cmd", "b",
                    f"{python} {script} x", "--run-dir", str(link), "-o", str(tmp_path / "c.md")],
    }
    wrong = []
    for name, argv in commands.items():
        code, err = _in_process(argv)
        lines = err.strip().splitlines()
        if code != 2 or len(lines) != 1 or "is a dangling symlink" not in lines[0]:
            wrong.append(f"{name}: exit {code}, {lines[-1] if lines else 'nothing said'}")
    created = os.path.lexists(target.parent)
    return Held(not wrong and not created, "; ".join(wrong) or
                f"each of {', '.join(commands)}: exit 2, one line naming the dangling symlink"
                + ("; but something was created at its target" if created else ""))


def negative_margin(tmp_path: Path) -> Held:
    """--margin -1GiB is read as a value (as argparse reads -1), then refused as negative."""
    code, err = _in_process(["validate-projection", *TINY, "--margin", "-1GiB", "--run-dir", str(tmp_path / "r")])
    lines = err.strip().splitlines()
    held = code == 2 and len(lines) == 1 and "--margin -1GiB: a size cannot be negative" in lines[0]
    return Held(held, f"exit {code}: {lines[-1] if lines else 'nothing said'}")


CASES = {
    "SIGTERM to compare mid-run": sigterm_to_compare,
    "SIGKILL to compare mid-run": sigkill_to_compare,
    "compare re-rendered: 1 run per side": one_run_per_side,
    "SIGHUP to train-step mid-configuration": sighup_to_train_step,
    "train-step killed after forward only: stdout shows it": out_of_memory_stdout,
    "SIGKILL to a fresh-process job's parent": sigkill_to_a_jobs_parent,
    "SIGTERM with a job's child in another thread": sigterm_with_a_child_in_another_thread,
    "a dangling-symlink --run-dir": dangling_run_dir,
    "validate-projection --margin -1GiB": negative_margin,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_holds(name, tmp_path):
    held = CASES[name](tmp_path)
    assert held.held, held.seen


def test_a_second_signal_while_the_child_ends_kills_its_group_at_once(tmp_path):
    """The grace period for a child to write its record is cut short by a second stop."""
    from auditor.capture import process_group
    write_script(tmp_path, "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                           "print('ready', flush=True)\ntime.sleep(60)\n", "stubborn.py")
    with process_group.child_group([sys.executable, str(tmp_path / "stubborn.py")], stdout=subprocess.PIPE,
                                   text=True) as process:
        assert process.stdout.readline().strip() == "ready"
        again = threading.Timer(0.5, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM))
        started = time.monotonic()
        with process_group.ending_signals():
            again.start()
            code = process_group.end(process, process_group.Stopped(signal.SIGTERM), grace_s=30)
        again.join()
    assert code == -signal.SIGKILL and time.monotonic() - started < 10


def test_an_audit_in_the_command_itself_records_the_signal_that_stopped_it(tmp_path):
    """gradprobe audits in its own process: a SIGTERM there ends the audit as interrupted by
    SIGTERM, status 143 (not Ctrl-C's 130)."""
    import auditor
    from auditor.capture.process_group import Stopped
    with pytest.raises(KeyboardInterrupt), auditor.Audit(tmp_path / "run"), auditor.stage("long"):
        raise Stopped(signal.SIGTERM)
    ended = auditor.load(tmp_path / "run").exit
    assert (ended.status, ended.code, ended.error) == ("interrupted", 143, "SIGTERM")
