"""The fresh-process runner (auditor.capture.fresh_process): an isolated import path, how a child
ended (exit status, signal by name, timeout), its finished stages recovered from the event log,
and the jobs that start children through it. Real children, real signals, real files."""
from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import TINY_GPT_NEO

from auditor.capture import fresh_process
from auditor.capture.fresh_process import Interrupted, python_command, run_module
from auditor.jobs import train_step

SLEEPER = """\
    import sys, time, auditor
    with auditor.Audit(out=sys.argv[1], name="sleeper"):
        with auditor.stage("first"):
            pass
        with auditor.stage("second"):
            time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def sleeper(tmp_path, monkeypatch):
    """A module on PYTHONPATH that audits two stages, sleeping in the second."""
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "sleeper.py").write_text(textwrap.dedent(SLEEPER))
    monkeypatch.setenv("PYTHONPATH", str(folder))
    return "sleeper"


@pytest.fixture
def decoys(tmp_path, monkeypatch):
    """Local `architectures/` and `gradprobe/` folders that fail on import, in the current folder."""
    for name in ("architectures", "gradprobe"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('the local decoy {name} was imported')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _complete_events(text: str) -> list[dict]:
    """The events of a log being written: a line the writer has not finished can end in a
    nested '}' (a long event goes out in several writes), so a line counts once it parses."""
    events = []
    for line in text.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return events


def pid_once_started(folder: Path, stage: str, timeout_s: float = 60) -> int:
    """The audited child's pid, once `stage` has finished in its event log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            events = _complete_events((folder / "events.jsonl").read_text())
        except FileNotFoundError:
            events = []
        if any(e["event"] == "stage_finished" and e["stage"]["path"] == stage for e in events):
            return events[0]["process"]["pid"]
        time.sleep(0.05)
    raise AssertionError(f"stage {stage!r} did not finish within {timeout_s} s")


def run_in_thread(*args, **kwargs) -> tuple[threading.Thread, dict]:
    outcome = {}
    def target():
        try:
            outcome["child"] = run_module(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error
    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


# -- the import path ---------------------------------------------------------------------

def test_the_command_leaves_the_current_folder_off_the_import_path():
    command = python_command("auditor.jobs.train_step", "a", 1)
    assert command[-3:] == ["auditor.jobs.train_step", "a", "1"]
    child = run_module("json.tool", "--help")  # any module: the command runs as built
    assert child.ok and child.ending == "exit status 0"


def test_a_local_package_of_the_same_name_is_not_imported(decoys):
    child = run_module("architectures")  # the installed package: a folder, no __main__
    assert "the local decoy" not in child.output
    assert "architectures.__main__" in child.output


def test_pythonpath_is_still_honoured(sleeper, tmp_path):
    child = run_module(sleeper, str(tmp_path / "run"), "0", run_folder=tmp_path / "run")
    assert child.ok, child.output
    assert [s.path for s in child.stages] == ["first", "second"]


def test_a_train_step_configuration_runs_the_installed_packages_beside_a_decoy(decoys):
    settings = train_step.Settings("tinystories-33m", overrides=dict(TINY_GPT_NEO), steps=1,
                                   sequence_length=8)
    record = train_step.audit_in_fresh_process(settings, decoys / "run")
    assert record.exit.status == "ok"


def test_calibration_runs_in_the_runner_beside_a_decoy(decoys):
    """The whole calibration takes ~15 s here: cut short by its timeout, which the runner names;
    the decoy would fail it within the first second."""
    from auditor.jobs.calibration import calibrate
    from auditor.jobs.gradprobe import Settings
    with pytest.raises(RuntimeError) as failed:
        calibrate(Settings(overrides=dict(TINY_GPT_NEO), sequence_length=8), decoys / "calibration",
                  timeout_s=3)
    assert "calibration runs for tinystories-33m failed (killed after the 3 s timeout)" in str(failed.value)
    assert "decoy" not in str(failed.value)


def test_the_validation_real_run_is_a_job_that_runs_the_installed_packages(decoys):
    from auditor.jobs.gradprobe import Settings
    from auditor.jobs.validation_run import real_audit
    record = real_audit(Settings(overrides=dict(TINY_GPT_NEO), sequence_length=8), decoys / "small", threads=1)
    assert record.exit.status == "ok" and record.annotations["result"]["pruned"] >= 0


def test_analysis_starts_no_process():
    source = Path(fresh_process.__file__).parent.parent / "analysis" / "projection" / "validation.py"
    assert "subprocess" not in source.read_text() and "sys.executable" not in source.read_text()


# -- how a child ended -------------------------------------------------------------------

def test_a_child_killed_by_sigkill_is_named_and_keeps_its_finished_stages(sleeper, tmp_path):
    run = tmp_path / "run"
    thread, outcome = run_in_thread(sleeper, str(run), "60", run_folder=run, timeout_s=120)
    os.kill(pid_once_started(run, "first"), signal.SIGKILL)
    thread.join(30)
    child = outcome["child"]
    assert child.signal == "SIGKILL" and child.ending == "killed by SIGKILL: out of memory?"
    assert [s.path for s in child.stages] == ["first"]
    on_disk = json.loads((run / "run.json").read_text())  # rebuilt, and says how the child ended
    assert on_disk["exit"] == {"status": "unfinished", "code": -9, "signal": "SIGKILL",
                               "error": "killed by SIGKILL: out of memory?"}


def test_a_child_stopped_by_sigterm_is_interrupted(sleeper, tmp_path):
    run = tmp_path / "run"
    thread, outcome = run_in_thread(sleeper, str(run), "60", run_folder=run, timeout_s=120)
    os.kill(pid_once_started(run, "first"), signal.SIGTERM)
    thread.join(30)
    child = outcome["child"]
    assert child.ending == "interrupted (SIGTERM)"
    assert child.record.exit.status == "interrupted"
    assert [s.path for s in child.stages] == ["first"]


def test_a_child_past_its_timeout_is_killed_and_says_so(sleeper, tmp_path):
    run = tmp_path / "run"
    child = run_module(sleeper, str(run), "60", run_folder=run, timeout_s=3)
    assert child.timed_out and child.ending == "killed after the 3 s timeout"
    assert child.record.exit.error == "killed after the 3 s timeout"
    assert [s.path for s in child.stages] == ["first"]


def test_a_failing_child_gives_its_exit_status_and_last_line(tmp_path):
    child = run_module("auditor.jobs.no_such_module")
    assert not child.ok and child.ending == "exit status 1"
    assert child.failure("the job") == f"the job failed (exit status 1): {child.last_line}"
    assert "no_such_module" in child.last_line


def test_a_folder_holding_a_record_is_refused_before_the_child_starts(sleeper, tmp_path):
    run = tmp_path / "run"
    assert run_module(sleeper, str(run), "0", run_folder=run).ok
    before = (run / "run.json").read_bytes()
    with pytest.raises(ValueError, match="already holds a run record"):
        run_module(sleeper, str(run), "0", run_folder=run)
    assert (run / "run.json").read_bytes() == before


@pytest.fixture
def python_ctrl_c():
    """Python's own Ctrl-C handler while the test runs, whatever this process inherited: a job
    a shell starts in the background without job control ignores SIGINT, and python then never
    raises KeyboardInterrupt (CI run that way failed this test)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_in_the_parent_waits_for_the_child_and_carries_its_stages(sleeper, tmp_path, monkeypatch,
                                                                         python_ctrl_c):
    """SIGINT to the parent alone (the child is not told by a terminal): the child is sent
    SIGINT after the grace period and its interrupted record comes back with the exception."""
    monkeypatch.setattr(fresh_process, "GRACE_S", 1)
    run = tmp_path / "run"
    timer = threading.Thread(target=lambda: (pid_once_started(run, "first"),
                                             signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)))
    timer.start()
    with pytest.raises(Interrupted) as stopped:
        run_module(sleeper, str(run), "60", run_folder=run, timeout_s=120)
    timer.join()
    child = stopped.value.child
    assert child.parent_interrupted and child.interrupted
    assert child.record.exit.status == "interrupted"
    assert [s.path for s in child.stages if s.status == "ok"] == ["first"]
