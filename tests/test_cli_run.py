"""`auditor run`: scripts run as python would, exit statuses, memray sites, bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid

import pytest
from conftest import one_error_line

import auditor
from auditor.cli import main


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty current folder (so a default runs/ folder would show up here)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(path, text: str):
    path.write_text(textwrap.dedent(text).lstrip())
    return path




def test_runs_a_script_like_python_with_staged_targets(workdir, capsys):
    helper = f"helper_{uuid.uuid4().hex[:8]}"  # imported from the script's own folder
    scripts = workdir / "scripts"
    scripts.mkdir()
    write(scripts / f"{helper}.py", """
        class Phase:
            def run(self):
                return bytearray(20_000_000)
    """)
    write(scripts / "job.py", f"""
        import sys
        import auditor
        import {helper}
        print("argv", sys.argv[1:])
        with auditor.stage("work"):
            kept = [{helper}.Phase().run() for _ in range(2)]
    """)
    saved_path, saved_argv = list(sys.path), list(sys.argv)
    status = main(["run", "--out", "out", "--stage", f"{helper}:Phase.run",
                   "scripts/job.py", "--flag", "x"])
    sys.modules.pop(helper, None)
    assert status == 0
    assert (sys.path, sys.argv) == (saved_path, saved_argv)
    captured = capsys.readouterr()
    assert "argv ['--flag', 'x']" in captured.out
    assert "work/Phase.run  2 calls" in captured.err  # its calls folded into one line
    assert "run record: out/run.json" in captured.err
    record = auditor.load(workdir / "out")
    assert [s.path for s in record.stages] == ["work", "work/Phase.run", "work/Phase.run#2"]
    assert record.name == "job"
    assert record.command == f"auditor run --out out --stage {helper}:Phase.run scripts/job.py --flag x"


def test_default_output_folder_under_runs(workdir, capsys):
    write(workdir / "tiny.py", "x = 1\n")
    assert main(["run", "tiny.py"]) == 0
    (folder,) = (workdir / "runs").iterdir()
    assert folder.name.endswith("-tiny")
    assert auditor.load(folder).exit.status == "ok"


def test_exit_status_is_the_scripts(workdir, capsys):
    write(workdir / "exits.py", """
        import sys, auditor
        with auditor.stage("before exit"):
            sys.exit(3)
    """)
    assert main(["run", "--out", "o1", "exits.py"]) == 3
    record = auditor.load(workdir / "o1")
    assert record.exit.code == 3 and record.stages[0].status == "failed"


def test_a_failing_script_exits_1_with_its_traceback_and_a_record(workdir, capsys):
    write(workdir / "fails.py", """
        import auditor
        def broken():
            raise RuntimeError("script bug")
        with auditor.stage("step"):
            broken()
    """)
    assert main(["run", "--out", "o", "fails.py"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: script bug" in err
    assert "auditor/cli/run.py" not in err and "runpy" not in err  # the script's frames only
    record = auditor.load(workdir / "o")
    assert record.stages[0].status == "failed"
    assert record.exit.to_json() == {"status": "failed", "code": 1, "error": "RuntimeError: script bug"}


def test_a_staged_function_that_raises_shows_python_s_traceback_without_the_auditor_s_frames(workdir, capsys):
    script = write(workdir / "fails.py", """
        def step(x):
            raise ValueError("bad step")
        def main():
            step(1)
        main()
    """)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=workdir)
    assert main(["run", "--out", "o", "--stage", "fails:step", "fails.py"]) == 1
    err = capsys.readouterr().err
    audited = err[err.index("Traceback"):err.index("ValueError: bad step")]
    assert audited == plain.stderr[:plain.stderr.index("ValueError: bad step")]  # the wrapper's frame hidden
    assert auditor.load(workdir / "o").stages[0].status == "failed"


def test_memray_top_site_is_the_known_line(workdir, capsys):
    pytest.importorskip("memray")
    script = write(workdir / "big.py", """
        import torch
        import auditor
        with auditor.stage("build"):
            big = torch.ones(40_000_000)  # line 4: 160 MB, alive at the high-water mark
            small = torch.ones(1_000_000)
        with auditor.stage("after"):
            total = float(big.sum() + small.sum())
    """)
    assert main(["run", "--memray", "--out", "o", str(script)]) == 0
    record = auditor.load(workdir / "o")
    memray = record.memray
    top = memray.sites[0]
    assert top.location == f"{script}:4"
    assert 160_000_000 <= top.bytes < 161_000_000
    assert top.python_stack[0] == f"<module> at {script}:4"
    assert any("alloc_cpu" in frame for frame in top.native_stack)
    assert memray.peak_memory >= 164_000_000
    assert record.probes["memray"].state == "on"
    # the sites go with the stage open at memray's high-water moment (found by time from its
    # ~10 ms snapshots: `big` is alive from `build` on, so the moment may fall in either stage
    # or in the unstaged time after them, where no stage carries them)
    assert memray.stage in ("build", "after", None)
    holders = [s for s in record.stages if s.memray_sites]
    assert [s.path for s in holders] == ([memray.stage] if memray.stage else [])
    for holder in holders:
        assert holder.memray_sites[0].location == top.location
    html = (workdir / "o" / memray.flamegraph).read_text()
    assert "<html" in html.lower() and '<script src="http' not in html  # offline
    assert f"{script}:4" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["run", "missing.py"], "script 'missing.py' does not exist"),
    (["run"], "run needs a script"),
    (["run", "--bogus", "ok.py"], "unrecognized arguments: --bogus"),
    (["nonsense"], "invalid choice: 'nonsense'"),
    (["run", "--stage", "no_such_module_q:f", "ok.py"], "no module named 'no_such_module_q'"),
    (["run", "--stage", "json:nope", "ok.py"], "json has no attribute 'nope'"),
    (["run", "--stage", "math:pi", "ok.py"], "is not callable"),
    (["run", "--out", "blocker/run", "ok.py"], "'blocker' is not a folder"),
    (["run", "--out", "blocker", "ok.py"], "exists and is not a folder"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(workdir, capsys, argv, message):
    write(workdir / "ok.py", "raise SystemExit('the script must not run')\n")
    write(workdir / "blocker", "a file\n")
    before = sorted(p.name for p in workdir.iterdir())
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert message in line, line
    assert sorted(p.name for p in workdir.iterdir()) == before  # no runs/, no output folder


def test_an_existing_run_folder_is_refused(workdir, capsys):
    write(workdir / "ok.py", "x = 1\n")
    assert main(["run", "--out", "o", "ok.py"]) == 0
    capsys.readouterr()
    before = json.loads((workdir / "o" / "run.json").read_text())
    assert main(["run", "--out", "o", "ok.py"]) == 2
    assert "already holds a run record" in one_error_line(capsys)
    assert json.loads((workdir / "o" / "run.json").read_text()) == before


def test_a_script_that_changes_folder_keeps_its_record_where_asked(workdir, capsys):
    (workdir / "elsewhere").mkdir()
    write(workdir / "moves.py", """
        import os, auditor
        with auditor.stage("moves"):
            os.chdir("elsewhere")
        with auditor.stage("after"):
            pass
    """)
    assert main(["run", "--out", "o", "moves.py"]) == 0
    assert capsys.readouterr().err.strip().endswith("run record: o/run.json")
    assert [s.path for s in auditor.load(workdir / "o").stages] == ["moves", "after"]
    assert list((workdir / "elsewhere").iterdir()) == []
    assert os.getcwd() == str(workdir)  # the command gives the folder back
