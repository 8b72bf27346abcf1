"""The job commands that start children (train-step, gradprobe, validate-projection) under
faults: a configuration killed by SIGKILL, Ctrl-C, a run folder that already holds a run, and
outputs that cannot be used, refused before any work. Real commands, children and signals."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import TINY_GPT_NEO, one_error_line

from auditor.cli import main
from auditor.jobs import train_step

TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256"]
CONFIGURATION = "tinystories-33m-seq8-fp32"  # train-step's folder for TINY at --seq-len 8


def events(folder: Path) -> list[dict]:
    try:
        lines = (folder / "events.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    found = []
    for line in lines:  # a line still being written can end in a nested '}': it counts once it parses
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return found


def wait_for_stage(folder: Path, path: str, timeout_s: float = 90) -> int:
    """The audited process's pid once `path` has finished in `folder`'s event log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log = events(folder)
        if any(e["event"] == "stage_finished" and e["stage"]["path"] == path for e in log):
            return log[0]["process"]["pid"]
        time.sleep(0.05)
    raise AssertionError(f"stage {path!r} did not finish in {folder} within {timeout_s} s")


def ctrl_c(argv: list[str], folder: Path, stage: str, cwd: Path) -> subprocess.CompletedProcess:
    """`auditor ARGV` in its own process group, sent SIGINT as a terminal's Ctrl-C would (the
    whole group) once `stage` has finished in `folder`."""
    process = subprocess.Popen([sys.executable, "-m", "auditor", *argv], cwd=cwd, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for_stage(folder, stage)
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


# -- train-step --------------------------------------------------------------------------

def test_a_configuration_killed_by_sigkill_shows_how_it_ended_and_its_finished_stages(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "report.md"
    killer = threading.Thread(target=lambda: os.kill(wait_for_stage(runs / CONFIGURATION, "step 1"),
                                                     signal.SIGKILL))
    killer.start()
    code = main(["train-step", *TINY, "--seq-len", "8", "--steps", "100000", "--no-memray",
                 "--run-dir", str(runs), "-o", str(out)])
    killer.join()
    assert code == 1
    text = out.read_text()
    assert "fp32 (killed by SIGKILL: out of memory?)" in text  # the sweep table's row
    assert "**This configuration did not finish: killed by SIGKILL: out of memory?.**" in text
    assert "Finished stages: `build model`, `forward only`, `step 1`" in text
    assert "### Components of one step" in text  # step 1's components are kept


@pytest.mark.slow
def test_ctrl_c_during_train_step_gives_a_partial_report_and_exit_130(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "report.md"
    done = ctrl_c(["train-step", *TINY, "--seq-len", "8", "--steps", "100000", "--no-memray",
                   "--run-dir", str(runs), "-o", str(out)], runs / CONFIGURATION, "step 1", tmp_path)
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr and "interrupted" in done.stderr
    text = out.read_text()
    assert "**This configuration did not finish: interrupted" in text
    said = next(line for line in text.splitlines() if "did not finish" in line)
    assert "Finished stages: `build model`, `forward only`, `step 1`" in said, said  # the line, when it fails
    assert json.loads((runs / CONFIGURATION / "run.json").read_text())["exit"]["status"] == "interrupted"


def test_a_run_dir_holding_that_configuration_is_refused_and_never_rendered_again(tmp_path, capsys):
    """The old run: adamw, batch 1, 2 steps. Asked for sgd, batch 4, 3 steps into the same
    --run-dir, the command refuses before any work instead of reporting the old run."""
    runs, out = tmp_path / "runs", tmp_path / "report.md"
    old = train_step.Settings("tinystories-33m", overrides=dict(TINY_GPT_NEO), sequence_length=8,
                              steps=2, batch_size=1, optimizer="adamw")
    train_step.audit(old, runs / CONFIGURATION)
    before = {p: p.read_bytes() for p in (runs / CONFIGURATION).iterdir()}
    started = time.perf_counter()
    code = main(["train-step", *TINY, "--seq-len", "8", "--optimizer", "sgd", "--batch-size", "4",
                 "--steps", "3", "--run-dir", str(runs), "-o", str(out)])
    assert code == 2 and time.perf_counter() - started < 5
    line = one_error_line(capsys)
    assert str(runs / CONFIGURATION) in line and "choose a new --run-dir" in line
    assert not out.exists()
    assert {p: p.read_bytes() for p in (runs / CONFIGURATION).iterdir()} == before


# -- gradprobe -----------------------------------------------------------------------------

@pytest.mark.slow
def test_ctrl_c_during_gradprobe_gives_a_partial_report_and_exit_130(tmp_path):
    run, out = tmp_path / "run", tmp_path / "report.md"
    done = ctrl_c(["gradprobe", *TINY, "--seq-len", "16", "--batches", "100000", "--no-trace",
                   "--no-memray", "--threads", "1", "--run-dir", str(run), "-o", str(out)],
                  run, "prune/GradProbe.save_state", tmp_path)
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr and "interrupted" in done.stderr
    text = out.read_text()
    assert "This run did not end ok (interrupted)" in text
    assert "prune/GradProbe.save_state" in text
    assert json.loads((run / "run.json").read_text())["exit"]["status"] == "interrupted"


# -- outputs checked before any work ---------------------------------------------------------

COMMANDS = {
    "gradprobe": ["gradprobe", *TINY, "--seq-len", "8", "--no-trace", "--no-memray"],
    "train-step": ["train-step", *TINY, "--seq-len", "8", "--steps", "1", "--no-memray"],
    "validate-projection": ["validate-projection", *TINY, "--seq-len", "8", "--target", "tinystories-33m",
                            "--target-layers", "2", "--target-hidden", "128", "--target-heads", "4",
                            "--target-vocab", "256"],
}


def _occupied(tmp_path: Path, command: str) -> Path:
    """A --run-dir holding what this command would write first."""
    folder = tmp_path / "occupied"
    inner = folder / CONFIGURATION if command == "train-step" else folder / "small"
    inner.mkdir(parents=True)
    (inner / "run.json").write_text("{}\n")
    return folder


CASES = {"report is a folder": "is a folder; give a file name", "run dir is a file": "is not a folder",
         "run dir is occupied": "choose a new --run-dir"}
ALREADY_REFUSED = {("validate-projection", "run dir is a file")}  # before this table, by its own check


@pytest.mark.parametrize("command, case, expected", [
    (command, case, expected) for command in COMMANDS for case, expected in CASES.items()
    if (command, case) not in ALREADY_REFUSED])
def test_outputs_that_cannot_be_used_are_refused_before_any_work(tmp_path, capsys, monkeypatch, command,
                                                                  case, expected):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports").mkdir()
    argv = list(COMMANDS[command])
    if case == "report is a folder":
        argv += ["-o", "reports", "--run-dir", "runs"]
    elif case == "run dir is a file":
        (tmp_path / "a-file").write_text("not a folder\n")
        argv += ["-o", "reports/r.md", "--run-dir", "a-file"]
    else:
        argv += ["-o", "reports/r.md", "--run-dir", str(_occupied(tmp_path, command))]
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    started = time.perf_counter()
    assert main(argv) == 2
    assert time.perf_counter() - started < 5
    assert expected in one_error_line(capsys)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing written


@pytest.mark.slow
def test_a_killed_calibration_child_still_gives_the_audited_runs_report_and_says_how(tmp_path, capsys):
    run, out = tmp_path / "run", tmp_path / "report.md"
    killer = threading.Thread(target=lambda: os.kill(
        wait_for_stage(run / "calibration" / "layers-x2", "build model"), signal.SIGKILL))
    killer.start()
    code = main(["gradprobe", *TINY, "--seq-len", "8", "--no-memray", "--threads", "1",
                 "--run-dir", str(run), "-o", str(out)])
    killer.join()
    assert code == 1
    err = capsys.readouterr().err
    assert "calibration runs for tinystories-33m failed (killed by SIGKILL: out of memory?)" in err
    assert "Traceback" not in err
    text = out.read_text()
    assert "GradProbe.decide" in text and "GradProbe.apply_masks" in text  # the audited run, whole
    assert "0 projection(s) made before it" in text


# -- validate-projection ---------------------------------------------------------------------

def test_a_killed_validation_run_is_one_line_saying_how_it_ended(tmp_path, capsys):
    run = tmp_path / "run"
    killer = threading.Thread(target=lambda: os.kill(wait_for_stage(run / "small", "build model"),
                                                     signal.SIGKILL))
    killer.start()
    code = main([*COMMANDS["validate-projection"], "--threads", "1", "--run-dir", str(run)])
    killer.join()
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("auditor: real run of tinystories-33m (") and "Traceback" not in "".join(err)
    assert "failed (killed by SIGKILL: out of memory?)" in err[-1] and str(run) in err[-1]


def test_ctrl_c_before_a_command_handles_it_is_one_line_and_exit_130(monkeypatch, capsys):
    """Ctrl-C during the argument checks or the torch import: no traceback, the usual status."""
    import auditor.cli
    import auditor.cli.export

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(auditor.cli.export, "main", interrupted)
    assert auditor.cli.main(["export", "anything"]) == 130
    assert capsys.readouterr().err == "auditor: interrupted\n"
