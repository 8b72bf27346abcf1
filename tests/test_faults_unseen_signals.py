"""Issue 32's fault suite, second round: signals, resource limits and the standard streams, as
a user meets them. Each script runs alone and under `auditor run` (real processes, real
signals, real limits); the program ends with the status, output and traceback it has alone,
no finished stage is lost and nothing is left half-written.

What broke before these cases: rich's console, on a reader gone from stderr (`2>&1 | head -1`),
put /dev/null on the program's stdout and raised SystemExit(1) inside it; started with stdin
and stdout closed, the audit's event log took descriptor 0 and clear_refs 1, which the
program's children then inherited; a program holding every descriptor RLIMIT_NOFILE allows
made each RSS reading fail (EMFILE); a Ctrl-C as the record was written lost run.json; a
SIGTERM to `auditor report` left a temporary PNG behind; `auditor report | head -0` ended in a
BrokenPipeError traceback.
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_cases import Held, not_a_rank  # noqa: F401  (an autouse fixture: plain runs)
from test_faults import (
    FINISHED_BEFORE_THE_FAULT,
    TIMEOUT_S,
    Injected,
    assert_no_auditor_traceback,
    audited,
    default_signals,
    plain,
    run,
    shell_status,
    signal_as_the_record_is_written,
    signalled,
    write_script,
)

import auditor

# -- the program's stderr read by a reader that leaves (`2>&1 | head -1`) ------------------

FIRST_LINE_THEN_STAGES = """
    import time
    import auditor
    print("first", flush=True)
    time.sleep(0.3)  # the reader has left by now; the program writes nothing more
    for step in range(5):
        with auditor.stage(f"step {step}"):
            data = bytearray(1_000_000)
"""


def read_one_line(command, cwd: Path) -> subprocess.CompletedProcess:
    """`command 2>&1 | grep -m1 first`: stdout and stderr into one pipe, closed after the
    program's first line (a warning of the auditor's before it, where clear_refs cannot be
    written, is read past)."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, preexec_fn=default_signals)
    assert process.stdout is not None
    line = process.stdout.readline()
    while line.startswith("auditor: "):
        line = process.stdout.readline()
    process.stdout.close()
    process.wait(timeout=TIMEOUT_S)
    return subprocess.CompletedProcess(command, process.returncode, line, "")


def reader_left(tmp_path: Path) -> Injected:
    script = write_script(tmp_path, FIRST_LINE_THEN_STAGES)
    alone = read_one_line(plain(script), tmp_path)
    result = read_one_line(audited("--out", tmp_path / "run", script), tmp_path)
    every = [(f"step {step}", "ok") for step in range(5)]
    return Injected(shell_status(alone.returncode), shell_status(result.returncode), result, tmp_path / "run", every)


# -- started with stdin and stdout closed (`<&- >&-`) ---------------------------------------

WITHOUT_STDIN_AND_STDOUT = """
    import subprocess, sys
    import auditor
    with auditor.stage("open"):
        with open("mine.txt", "w") as mine:
            print("my first file is descriptor", mine.fileno(), file=sys.stderr)
    with auditor.stage("child"):  # what its stdin and stdout are: nothing, as the program's
        child = subprocess.run(["sh", "-c", "readlink /proc/self/fd/0 /proc/self/fd/1 | tr -d 0-9 >&2"])
        print("child status", child.returncode, file=sys.stderr)
"""


def without_stdin_and_stdout() -> None:
    default_signals()
    os.close(0)
    os.close(1)


def streams_closed(tmp_path: Path) -> Injected:
    script = write_script(tmp_path, WITHOUT_STDIN_AND_STDOUT)
    alone = run(plain(script), tmp_path, preexec_fn=without_stdin_and_stdout)
    result = run(audited("--out", tmp_path / "run", script), tmp_path, preexec_fn=without_stdin_and_stdout)
    return Injected(shell_status(alone.returncode), shell_status(result.returncode), result, tmp_path / "run",
                    [("open", "ok"), ("child", "ok")], alone.stderr)


# -- RLIMIT_NOFILE 32, every descriptor taken by the program --------------------------------

HOLDS_EVERY_DESCRIPTOR = """
    import os
    import auditor
    with auditor.stage("load"):
        data = bytearray(5_000_000)
    files = []
    with auditor.stage("open all"):
        try:
            while True:
                files.append(open(os.devnull))
        except OSError as error:
            print("out of descriptors:", error.strerror, flush=True)
    with auditor.stage("still all"):
        more = bytearray(2_000_000)
    for f in files:
        f.close()
    with auditor.stage("after"):
        pass
"""


def few_descriptors() -> None:
    default_signals()
    resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))


def every_descriptor_taken(tmp_path: Path) -> Injected:
    script = write_script(tmp_path, HOLDS_EVERY_DESCRIPTOR)
    alone = run(plain(script), tmp_path, preexec_fn=few_descriptors)
    result = run(audited("--out", tmp_path / "run", script), tmp_path, preexec_fn=few_descriptors)
    finished = [("load", "ok"), ("open all", "ok"), ("still all", "ok"), ("after", "ok")]
    return Injected(shell_status(alone.returncode), shell_status(result.returncode), result, tmp_path / "run",
                    finished, alone.stderr)


# -- the program's own signal handling: SIG_IGN for Ctrl-C, SIGUSR1, SIGALRM, SIGTSTP ----------

OWN_SIGNAL_HANDLING = """
    import signal, time
    import auditor
    got = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: got.append("USR1"))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C does nothing to it
    class TooSlow(Exception):
        pass
    def too_slow(signum, frame):
        raise TooSlow("the alarm rang")
    signal.signal(signal.SIGALRM, too_slow)
    with auditor.stage("load"):
        data = bytearray(5_000_000)
    with auditor.stage("wait"):
        print("ready", flush=True)
        while not got:
            time.sleep(0.01)
    try:
        with auditor.stage("slow"):
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            time.sleep(10)
    except TooSlow as error:
        print("timed out:", error)
    print("got", got)
"""


def signals_in_turn(command, cwd: Path) -> subprocess.CompletedProcess:
    """Ctrl-C, a stop and a continue (a terminal's ^Z then fg), then SIGUSR1, once it is ready."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, preexec_fn=default_signals)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line == "ready\n", line
        for signum in (signal.SIGINT, signal.SIGTSTP, signal.SIGCONT, signal.SIGUSR1):
            process.send_signal(signum)
            time.sleep(0.1)
        out, err = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(command, process.returncode, line + out, err)


def own_signal_handling(tmp_path: Path) -> Injected:
    script = write_script(tmp_path, OWN_SIGNAL_HANDLING)
    alone = signals_in_turn(plain(script), tmp_path)
    result = signals_in_turn(audited("--out", tmp_path / "run", script), tmp_path)
    assert alone.stdout == "ready\ntimed out: the alarm rang\ngot ['USR1']\n", alone
    return Injected(shell_status(alone.returncode), shell_status(result.returncode), result, tmp_path / "run",
                    [("load", "ok"), ("wait", "ok"), ("slow", "failed")], alone.stderr)


SLEEPS_A_SECOND = """
    import time
    import auditor
    with auditor.stage("load"):
        data = bytearray(5_000_000)
    with auditor.stage("wait"):
        print("ready", flush=True)
        time.sleep(1)
    print("done")
"""


def ignoring_sigterm_and_sighup() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def sent_while_ignored(command, cwd: Path) -> subprocess.CompletedProcess:
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=ignoring_sigterm_and_sighup)
    assert process.stdout is not None
    line = process.stdout.readline()
    process.send_signal(signal.SIGTERM)
    process.send_signal(signal.SIGHUP)
    out, err = process.communicate(timeout=TIMEOUT_S)
    return subprocess.CompletedProcess(command, process.returncode, line + out, err)


def started_ignoring(tmp_path: Path) -> Injected:
    """Started with SIGTERM and SIGHUP ignored (nohup, `trap '' TERM HUP`), then sent both:
    python alone goes on ignoring them; the auditor's SIGTERM handler ended the program (-15)."""
    script = write_script(tmp_path, SLEEPS_A_SECOND)
    alone = sent_while_ignored(plain(script), tmp_path)
    result = sent_while_ignored(audited("--out", tmp_path / "run", script), tmp_path)
    assert alone.stdout == "ready\ndone\n", alone
    return Injected(shell_status(alone.returncode), shell_status(result.returncode), result, tmp_path / "run",
                    [("load", "ok"), ("wait", "ok")], alone.stderr)


def ended_mid_stage(tmp_path: Path, signum: int) -> Injected:
    """SIGTERM, or SIGHUP (the terminal closed), inside a stage: python alone is ended by it,
    silently; so is `auditor run`, once its record is written (after SIGTERM it exited 143 and
    printed 'Terminated (SIGTERM)'; SIGHUP killed it with the event log alone)."""
    fault = signalled(tmp_path, signum)
    fault.finished = [*FINISHED_BEFORE_THE_FAULT, ("wait", "failed")]
    return fault


FAULTS = {
    "SIGTERM mid-stage: ended by the signal, as python is": lambda tmp_path: [
        ended_mid_stage(tmp_path, signal.SIGTERM)],
    "SIGHUP mid-stage (the terminal closed): ended by it, the record says so": lambda tmp_path: [
        ended_mid_stage(tmp_path, signal.SIGHUP)],
    "started with SIGTERM and SIGHUP ignored (nohup), sent both mid-stage": lambda tmp_path: [
        started_ignoring(tmp_path)],
    "stdout and stderr into `| head -1`, the program quiet after its first line": lambda tmp_path: [
        reader_left(tmp_path)],
    "started with stdin and stdout closed (<&- >&-), opening a file and starting a child": lambda tmp_path: [
        streams_closed(tmp_path)],
    "RLIMIT_NOFILE 32, the program holding every descriptor": lambda tmp_path: [every_descriptor_taken(tmp_path)],
    "Ctrl-C ignored (SIG_IGN), ^Z and fg, SIGUSR1 and SIGALRM handled by the program": lambda tmp_path: [
        own_signal_handling(tmp_path)],
}


def program_lines(stderr: str) -> list[str]:
    """stderr without the auditor's own lines (stage lines, warnings, the closing summary)."""
    ours = ("auditor:", "┏", "┃", "┡", "│", "└", "peak RSS", "run record", "child processes", "...")
    return [line for line in stderr.splitlines() if not line.startswith(ours)]


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_the_program_ends_as_it_does_alone(name, tmp_path):
    [fault] = FAULTS[name](tmp_path)
    assert fault.status == fault.alone, (fault.alone_stderr, fault.result.stderr)
    assert_no_auditor_traceback(fault.result.stderr)
    assert program_lines(fault.result.stderr) == fault.alone_stderr.splitlines()
    record = auditor.load(fault.folder)
    assert [(s.path, s.status) for s in record.stages] == fault.finished
    assert record.exit.code == fault.alone
    if name.startswith("RLIMIT_NOFILE"):  # VmHWM read through the descriptor the probe holds
        assert not any("Too many open files" in warning for warning in record.warnings), record.warnings
        assert "Too many open files" not in (record.probes["rss"].reason or "")
    for signum in (signal.SIGTERM, signal.SIGHUP):  # as python: killed by it, not an exit status
        if name.startswith(signal.Signals(signum).name):
            assert fault.result.returncode == -signum, fault.result.returncode
            assert record.exit.to_json() == {"status": "interrupted", "code": 128 + signum,
                                             "error": signal.Signals(signum).name}
    if name.startswith("started with stdin"):
        assert "my first file is descriptor 0" in fault.result.stderr


# -- the auditor's own commands ------------------------------------------------------------

CTRL_C_AS_THE_RECORD_IS_WRITTEN = signal_as_the_record_is_written("SIGINT")


def ctrl_c_as_the_record_is_written(tmp_path: Path) -> Held:
    """A program that finished, Ctrl-C pressed as the audit writes its record: the record waits."""
    script = write_script(tmp_path, """
        import auditor
        with auditor.stage("work"):
            data = bytearray(1_000_000)
        print("done")
    """)
    driver = write_script(tmp_path, CTRL_C_AS_THE_RECORD_IS_WRITTEN, "driver.py")
    result = run([sys.executable, driver, tmp_path / "run", script], tmp_path)
    written = (tmp_path / "run" / "run.json").is_file()
    exit_ = auditor.load(tmp_path / "run").exit.status if written else None
    held = (shell_status(result.returncode) == 130 and written and exit_ == "ok"
            and 'File "' not in result.stderr)
    return Held(held, f"status {shell_status(result.returncode)}, run.json {'written' if written else 'missing'}"
                      f", exit {exit_}")


# the signal lands as soon as the run's event log is made, still empty
SIGNAL_AS_THE_AUDIT_STARTS = """
    import os, signal, sys
    from auditor.record.run_folder import EventLog
    made = EventLog.__init__
    def made_then_signalled(self, *args, **kwargs):
        made(self, *args, **kwargs)
        os.kill(os.getpid(), getattr(signal, os.environ["SIGNAL"]))
    EventLog.__init__ = made_then_signalled
    from auditor.cli import main
    sys.exit(main(["run", "--out", sys.argv[1], sys.argv[2]]))
"""


def sigterm_as_the_audit_starts(tmp_path: Path) -> Held:
    """SIGTERM while the audit makes its folder and log, before the program's first line: it
    left an empty events.jsonl that report and rebuild refuse; now a record that says so."""
    script = write_script(tmp_path, """
        print("the program ran")
    """)
    driver = write_script(tmp_path, SIGNAL_AS_THE_AUDIT_STARTS, "driver.py")
    result = run([sys.executable, driver, tmp_path / "run", script], tmp_path, env={**os.environ, "SIGNAL": "SIGTERM"})
    written = (tmp_path / "run" / "run.json").is_file()
    exit_ = auditor.load(tmp_path / "run").exit.to_json() if written else None
    held = (result.returncode == -signal.SIGTERM and written and "the program ran" not in result.stdout
            and exit_ == {"status": "interrupted", "code": 143, "error": "SIGTERM"})
    return Held(held, f"status {result.returncode}, run.json {'written' if written else 'missing'}, exit {exit_}")


def ctrl_c_as_the_audit_starts(tmp_path: Path) -> Held:
    """Ctrl-C while the audit starts (with --census it imports torch there, seconds): it left
    an empty events.jsonl in a new folder, which report and rebuild refuse; now no folder."""
    script = write_script(tmp_path, """
        print("the program ran")
    """)
    driver = write_script(tmp_path, SIGNAL_AS_THE_AUDIT_STARTS, "driver.py")
    result = run([sys.executable, driver, tmp_path / "run", script], tmp_path, env={**os.environ, "SIGNAL": "SIGINT"})
    left = sorted(p.name for p in (tmp_path / "run").iterdir()) if (tmp_path / "run").exists() else None
    held = (shell_status(result.returncode) == 130 and left is None and "the program ran" not in result.stdout
            and result.stderr.strip() == "auditor: interrupted")
    return Held(held, f"status {shell_status(result.returncode)}, run folder {left}, stderr {result.stderr[-200:]!r}")


def a_finished_run(folder: Path) -> Path:
    with auditor.Audit(folder, "finished"):
        for step in range(3):
            with auditor.stage(f"step {step}"):
                _kept = bytearray(1_000_000)
    return folder


SIGTERM_AS_THE_PLOT_IS_SAVED = """
    import os, signal, sys
    from matplotlib.figure import Figure
    save = Figure.savefig
    def savefig_under_sigterm(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return save(self, *args, **kwargs)
    Figure.savefig = savefig_under_sigterm
    from auditor.cli import main
    sys.exit(main(sys.argv[1:]))
"""


def sigterm_to_report(tmp_path: Path) -> Held:
    """SIGTERM while `auditor report` writes its timeline PNG (into its temporary file)."""
    folder = a_finished_run(tmp_path / "run")
    out = tmp_path / "out"
    out.mkdir()
    driver = write_script(tmp_path, SIGTERM_AS_THE_PLOT_IS_SAVED, "driver.py")
    result = run([sys.executable, driver, "report", folder, "-o", out / "r.md"], tmp_path)
    left = sorted(p.name for p in out.iterdir())
    held = shell_status(result.returncode) == 143 and not left and "interrupted (SIGTERM)" in result.stderr
    return Held(held, f"status {shell_status(result.returncode)}, left in the output folder: {left or 'nothing'}")


def report_into_a_closed_pipe(tmp_path: Path) -> Held:
    """`auditor report RUN -o R.md | head -0`: the report written, then its path into a closed pipe."""
    folder = a_finished_run(tmp_path / "run")
    command = [sys.executable, "-m", "auditor", "report", folder, "-o", tmp_path / "r.md"]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    process.stdout.close()  # head -0 left at once
    _, err = process.communicate(timeout=TIMEOUT_S)
    report = (tmp_path / "r.md").read_text() if (tmp_path / "r.md").is_file() else ""
    held = (process.returncode == 128 + signal.SIGPIPE and "Traceback" not in err and not err.strip()
            and "## Summary" in report)
    return Held(held, f"status {process.returncode}, stderr {err.strip()[-80:]!r}, report "
                      f"{'whole' if '## Summary' in report else 'missing'}")


CASES = {
    "SIGTERM as the audit starts, before the program's first line": sigterm_as_the_audit_starts,
    "Ctrl-C as the audit starts, before the program's first line": ctrl_c_as_the_audit_starts,
    "Ctrl-C as a finished program's record is written": ctrl_c_as_the_record_is_written,
    "SIGTERM to auditor report as it saves its PNG": sigterm_to_report,
    "auditor report | head -0": report_into_a_closed_pipe,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_holds(name, tmp_path):
    outcome = CASES[name](tmp_path)
    assert outcome.held, outcome.seen
