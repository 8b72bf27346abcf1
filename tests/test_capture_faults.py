"""The audited program never breaks because of the audit: real faults injected into a live
audit (a log write past RLIMIT_FSIZE, descriptors the program closes and reuses, tracemalloc
stopped under the probe, a run.json that cannot be written, callables the auditor itself uses
staged) degrade the audit with a warning and a line in the record, and never raise into the
program."""
from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import textwrap
import tracemalloc
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest

import auditor


@contextmanager
def replaced_by_dev_full(fd: int):
    """`fd` now names /dev/full, as a descriptor the program closed and reopened would."""
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        os.dup2(full, fd)
    finally:
        os.close(full)
    yield


def paths(record: dict) -> list[tuple[str, str]]:
    """(path, status) of each stage of a run record as JSON (`Audit.record`, `.to_json()`)."""
    return [(s["path"], s["status"]) for s in record["stages"]]


def run_python(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(text).lstrip())
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)


def test_a_log_write_that_fails_never_raises_into_the_program(tmp_path):
    result = run_python(tmp_path, """
        import os, resource, signal
        import auditor
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails (EFBIG)
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        with auditor.Audit("run") as audit:
            with auditor.stage("before"):
                kept = bytearray(b"x" * 1_000_000)
            with auditor.stage("inside"):  # the log's next line will not fit
                resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize("run/events.jsonl") + 10, hard))
            for step in range(3):
                with auditor.stage(f"after {step}"):
                    more = bytearray(b"y" * 100_000)
            resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # room again for run.json
        print("program done")
    """)
    assert result.returncode == 0 and "program done" in result.stdout, result.stderr
    assert "Traceback" not in result.stderr
    folder = tmp_path / "run"
    lines = (folder / "events.jsonl").read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == [  # whole lines only
        "run_started", "unstaged", "stage_started", "stage_finished", "unstaged", "stage_started"]
    record = auditor.load(folder)  # run.json, from the events kept in memory
    assert paths(record.to_json()) == [("before", "ok"), ("inside", "ok")] + [(f"after {i}", "ok") for i in range(3)]
    assert record.event_log.to_json() == {"state": "incomplete", "lines": 6,
                                          "reason": "events.jsonl could not be written: File too large"}
    assert record.exit.status == "ok"
    assert any("the run goes on" in w for w in record.warnings)


def test_descriptors_the_program_closes_and_reuses_are_never_written(tmp_path):
    result = run_python(tmp_path, """
        import os
        import auditor
        with auditor.Audit("run") as audit:
            with auditor.stage("before"):
                kept = bytearray(b"x" * 1_000_000)
            with auditor.stage("closes"):
                os.closerange(3, 1024)  # as a daemon does; the audit's log and clear_refs go too
                mine = [open(f"mine-{i}.txt", "w") for i in range(20)]  # the numbers, reused
            with auditor.stage("after"):
                for f in mine:
                    f.write("the program's own\\n")
                    f.close()
        print("program done")
    """)
    assert result.returncode == 0 and "program done" in result.stdout, result.stderr
    for i in range(20):
        assert (tmp_path / f"mine-{i}.txt").read_text() == "the program's own\n"
    record = auditor.load(tmp_path / "run")
    assert paths(record.to_json()) == [("before", "ok"), ("closes", "ok"), ("after", "ok")]
    assert record.event_log.state == "incomplete"
    assert record.probes["rss"].method == "sampler"


def test_a_complete_event_log_says_so(tmp_path):
    with auditor.Audit(tmp_path / "run") as audit, auditor.stage("one"):
        pass
    lines = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    events = [json.loads(line)["event"] for line in lines]
    assert audit.record["event_log"] == {"state": "complete", "lines": events.index("run_finished") + 1}


def test_clear_refs_failing_mid_run_falls_back_to_sampling(tmp_path):
    with (pytest.warns(auditor.AuditorWarning, match="resetting VmHWM failed mid-run"),
          auditor.Audit(tmp_path / "run") as audit):
        with auditor.stage("first"):
            pass
        rss = audit._probe_set.meters[0]
        with replaced_by_dev_full(rss._fd):
            with auditor.stage("second"):  # opening it resets VmHWM: through another file
                data = mmap.mmap(-1, 20_000_000)  # fresh pages, whatever malloc keeps
                data.write(b"x" * 20_000_000)
            with auditor.stage("third"):
                pass
    record = audit.record
    assert paths(record) == [("first", "ok"), ("second", "ok"), ("third", "ok")]
    assert record["probes"]["rss"]["method"] == "sampler"
    assert "the program closed the clear_refs file descriptor" in record["probes"]["rss"]["reason"]
    second = record["stages"][1]["rss"]
    assert second["end"] - second["start"] > 15_000_000 and second["peak"] >= second["end"]


def test_a_meter_failing_mid_run_is_switched_off(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # even warnings as errors never reach the program
        with auditor.Audit(tmp_path / "run", tracemalloc=True) as audit:
            with auditor.stage("traced"):
                _data = [0] * 100_000  # kept alive in the stage
            with auditor.stage("stops it"):
                tracemalloc.stop()  # the program's own call: the probe would read 0 from now on
            with auditor.stage("after"):
                _more = [1] * 100_000
    record = audit.record
    assert paths(record) == [("traced", "ok"), ("stops it", "ok"), ("after", "ok")]
    assert record["stages"][0]["py_heap"]["end"] > 0
    assert record["stages"][1]["py_heap"] is None and record["stages"][2]["py_heap"] is None
    assert record["probes"]["python_heap"]["state"] == "failed"
    assert "tracemalloc was stopped" in record["probes"]["python_heap"]["reason"]
    assert any("python_heap" in w or "py_heap probe failed" in w for w in record["warnings"])


FILL = """
def fill(disk):
    fd = os.open(os.path.join(disk, "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while True:  # until the disk is full
            os.write(fd, b"x" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
"""

RUN_JSON_MEETS_A_FULL_DISK = """
import json, os, sys, warnings
import auditor
""" + FILL + """
disk = sys.argv[1]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with auditor.Audit(os.path.join(disk, "run")) as audit:
        with auditor.stage("work"):
            pass
        fill(disk)  # the stage's end is in the log; run.json meets a full disk
print(json.dumps({"written": audit.record_written, "status": audit.record["stages"][0]["status"],
                  "warnings": [str(w.message) for w in caught]}))
"""

OLD_FILE_ON_A_FULL_DISK = """
import json, os, sys
from auditor.record.run_folder import write_json_atomically
""" + FILL + """
disk = sys.argv[1]
target = os.path.join(disk, "run.json")
with open(target, "w") as f:
    f.write('{"old": true}\\n')
fill(disk)
try:
    write_json_atomically(__import__("pathlib").Path(target), {"new": True, "pad": "y" * 100000})
    raised = None
except OSError as error:
    raised = type(error).__name__
print(json.dumps({"raised": raised}))
"""


def _on_a_full_disk(tmp_path: Path, text: str) -> tuple[dict, Path]:
    from test_faults import on_a_small_disk
    script = tmp_path / "job.py"
    script.write_text(text)
    status, result, disk = on_a_small_disk(tmp_path, "1m", "keep", sys.executable, str(script))
    assert status == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), disk


def test_a_run_json_that_cannot_be_written_is_a_warning_and_leaves_no_tmp(tmp_path):
    """A real full disk (a 1 MiB tmpfs, filled after the stage ended): run.json cannot be
    written, which is a warning, not an error; no temporary is left; the log had it all."""
    seen, disk = _on_a_full_disk(tmp_path, RUN_JSON_MEETS_A_FULL_DISK)
    assert not seen["written"] and seen["status"] == "ok"
    assert any("run.json could not be written" in w for w in seen["warnings"]), seen
    folder = disk / "run"
    assert "run.json" not in {p.name for p in folder.iterdir()}
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]  # no temporary left
    assert auditor.rebuild(folder)["stages"][0]["path"] == "work"  # the log had it all


def test_write_json_atomically_keeps_the_old_file_when_the_disk_is_full(tmp_path):
    seen, disk = _on_a_full_disk(tmp_path, OLD_FILE_ON_A_FULL_DISK)
    assert seen["raised"] == "OSError"
    assert (disk / "run.json").read_text() == '{"old": true}\n'
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "run.json"]  # no temporary left


def run_script(tmp_path: Path, text: str, *options: str) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(text).lstrip())
    return subprocess.run([sys.executable, "-m", "auditor", "run", "--out", str(tmp_path / "run"),
                           *options, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("target, calls", [
    ("builtins:len", 3), ("builtins:open", 1), ("time:perf_counter", 2), ("builtins:isinstance", 2),
    ("json:dumps", 1), ("os:write", 1)])
def test_staging_a_callable_the_auditor_uses_stages_only_the_programs_calls(tmp_path, target, calls):
    result = run_script(tmp_path, """
        import json, os, time
        import auditor
        with auditor.stage("work"):
            sizes = [len(word) for word in ("a", "bb", "ccc")]
            with open(__file__) as f:
                first = f.readline()
            took = time.perf_counter() - time.perf_counter()
            kinds = [isinstance(x, int) for x in (1, "x")]
            text = json.dumps(sizes)
            os.write(1, b"")
        print("sizes", text, kinds)
    """, "--stage", target)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "sizes [1, 2, 3] [True, False]" in result.stdout
    assert "Traceback" not in result.stderr and "RecursionError" not in result.stderr
    record = auditor.load(tmp_path / "run")
    assert len(result.stderr.splitlines()) <= 2 * len(record.stages) + 20  # progress and table
    name = target.split(":")[1]  # the program's own calls inside "work" (its imports call some too)
    inside = [s for s in record.stages if s.parent == "work" and s.name.split("#")[0] == name]
    assert len(inside) >= calls and all(s.status == "ok" for s in inside)
    assert record.exit.status == "ok"


def test_several_of_the_auditors_own_callables_staged_at_once(tmp_path):
    result = run_script(tmp_path, """
        import time
        import auditor
        with auditor.stage("work"):
            n = len([1, 2]) + len("abc")
            t = time.perf_counter()
        print("n", n)
    """, "--stage", "builtins:len", "--stage", "builtins:open", "--stage", "time:perf_counter",
        "--stage", "builtins:getattr", "--tracemalloc", "--memray")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "n 5" in result.stdout and "Traceback" not in result.stderr
    inside = [s.name.split("#")[0] for s in auditor.load(tmp_path / "run").stages if s.parent == "work"]
    assert inside.count("len") == 2 and inside.count("perf_counter") == 1


@pytest.mark.parametrize("target", ["auditor.capture.stage:stage.__enter__", "auditor.capture.audit:Audit.open_stage",
                                    "auditor:mark"])
def test_the_auditors_own_callables_are_refused_up_front(tmp_path, target, capsys):
    from conftest import one_error_line

    from auditor.cli import main
    (tmp_path / "job.py").write_text("raise SystemExit('the script must not run')\n")
    assert main(["run", "--out", str(tmp_path / "run"), "--stage", target, str(tmp_path / "job.py")]) == 2
    assert "is the auditor's own code" in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.py"]


def test_a_forked_child_never_writes_into_the_parents_record(tmp_path):
    result = run_script(tmp_path, """
        import os, sys
        import auditor
        with auditor.stage("parent work"):
            kept = bytearray(b"x" * 1_000_000)
        child = os.fork()
        if child == 0:  # the child runs the rest of the script, and leaves it
            with auditor.stage("child work"):
                pass
            sys.exit(0)
        os.waitpid(child, 0)
        with auditor.stage("after"):
            pass
        print("parent done")
    """)
    assert result.returncode == 0 and "parent done" in result.stdout, result.stderr
    assert "child work" not in (tmp_path / "run" / "events.jsonl").read_text()
    record = auditor.load(tmp_path / "run")
    assert paths(record.to_json()) == [("parent work", "ok"), ("after", "ok")]
    assert result.stderr.count("run record:") == 1  # the child prints no summary either


def test_a_script_that_closes_stderr_keeps_its_status(tmp_path):
    text = """
        import sys
        import auditor
        with auditor.stage("before"):
            pass
        sys.stderr.close()  # the progress line and the summary have nowhere to go
        with auditor.stage("after"):
            pass
        print("done")
    """
    result = run_script(tmp_path, text)
    alone = run_python(tmp_path, text)
    assert result.returncode == alone.returncode == 0 and "done" in result.stdout, result.stderr
    record = auditor.load(tmp_path / "run")
    assert paths(record.to_json()) == [("before", "ok"), ("after", "ok")]
    assert record.exit.status == "ok"
    assert any("on_stage_end failed" in w for w in record.warnings)
