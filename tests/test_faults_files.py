"""Issue 32's fault suite, files and records: what the auditor writes never goes through a link
planted in a run folder (run folders are shared and committed), no output option lands on a
record's own file, a damaged line in an event log costs that line only, and `auditor report`
merges rank-N folders only when their records say they are ranks of one launch.

Each case builds what a user would meet (a run folder from a real audit, a link planted as
anyone with write access to a shared folder could, a log line damaged in place, committed
records of real torchrun runs) and runs the real commands; a case returns `Held`.
"""
from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fault_cases import Held, not_a_rank  # noqa: F401  (an autouse fixture: plain runs)
from test_faults import TIMEOUT_S, assert_no_auditor_traceback, write_script

import auditor
from auditor.cli import main

ROOT = Path(__file__).parents[1]
TWO_RANKS = ROOT / "reports" / "multi-rank-cpu-runs" / "2-ranks"  # a real 2-rank gloo torchrun run
OTHER_TWO_RANKS = ROOT / "reports" / "sharded-gradprobe-cpu-runs" / "fsdp-train-step" / "2-ranks"  # another launch
SECRET = "a file outside the run folder, which no command may change\n"


def command(*argv) -> tuple[int, str]:
    """`auditor ARGV` as the command line runs it (its own entry point, in this process): its
    status and what it printed on stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main([str(a) for a in argv])
    return status, err.getvalue()


def one_error_line(stderr: str) -> bool:
    lines = stderr.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("auditor: error: ") and "Traceback" not in stderr


def a_run(folder: Path, stages: tuple[str, ...] = ("load", "work", "save")) -> Path:
    """A finished run of a few stages, audited in this process (no torch)."""
    with auditor.Audit(folder, name="files"):
        for name in stages:
            with auditor.stage(name):
                _kept = bytearray(b"x" * 1_000_000)
    return folder


def planted(link: Path, tmp_path: Path) -> Path:
    """`link` made a symlink to a file outside its folder; returns that file."""
    outside = tmp_path / "outside" / f"{link.name}.target"
    outside.parent.mkdir(exist_ok=True)
    outside.write_text(SECRET)
    link.unlink(missing_ok=True)
    link.symlink_to(outside)
    return outside


def untouched_and_replaced(outside: Path, link: Path) -> bool:
    """The file outside is as it was, and the name in the run folder is now a file of its own."""
    return outside.read_text() == SECRET and link.is_file() and not link.is_symlink()


# -- planted links ----------------------------------------------------------------------------

def report_through_a_planted_link(name: str):
    def case(tmp_path: Path) -> Held:
        run = a_run(tmp_path / "run")
        outside = planted(run / name, tmp_path)
        status, err = command("report", run)
        held = status == 0 and untouched_and_replaced(outside, run / name)
        kept = "unchanged" if outside.read_text() == SECRET else "OVERWRITTEN"
        return Held(held, f"report exit {status}; the linked file {kept}, "
                          f"{name} {'replaced by the report' if not (run / name).is_symlink() else 'still a link'}")
    return case


def rebuild_through_a_planted_temporary(tmp_path: Path) -> Held:
    run = a_run(tmp_path / "run")
    (run / "run.json").unlink()  # a killed run's folder: rebuild writes run.json
    outside = planted(run / "run.json.tmp", tmp_path)
    status, err = command("rebuild", run)
    held = status == 0 and outside.read_text() == SECRET and auditor.load(run).name == "files"
    return Held(held, f"rebuild exit {status}; the file run.json.tmp linked to "
                      f"{'unchanged' if outside.read_text() == SECRET else 'OVERWRITTEN'}")


def run_end_through_a_planted_temporary(tmp_path: Path) -> Held:
    run = tmp_path / "run"
    run.mkdir()
    outside = planted(run / "run.json.tmp", tmp_path)
    a_run(run)
    held = outside.read_text() == SECRET and auditor.load(run).name == "files"
    return Held(held, f"the run's record written; the file run.json.tmp linked to "
                      f"{'unchanged' if outside.read_text() == SECRET else 'OVERWRITTEN'}")


def run_into_a_planted_event_log(tmp_path: Path) -> Held:
    run = tmp_path / "run"
    run.mkdir()
    outside = planted(run / "events.jsonl", tmp_path)
    script = write_script(tmp_path, "print('ran')\n")
    done = subprocess.run([sys.executable, "-m", "auditor", "run", "--run-dir", str(run), str(script)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S)
    held = done.returncode == 2 and one_error_line(done.stderr) and "events.jsonl" in done.stderr \
        and outside.read_text() == SECRET and "ran" not in done.stdout
    return Held(held, f"auditor run exit {done.returncode}: {done.stderr.strip()[:120]}")


# -- no output option lands on a record ---------------------------------------------------------

def outputs_onto_record_files(tmp_path: Path) -> Held:
    """`export -o` and `report -o` aimed at each file of a real run folder (memray's trace and
    flamegraph included): each refused in one line, exit 2, the folder unchanged."""
    run = tmp_path / "run"
    script = write_script(tmp_path, """
        import auditor
        with auditor.stage("work"):
            data = bytearray(b"x" * 2_000_000)
    """)
    done = subprocess.run([sys.executable, "-m", "auditor", "run", "--memray", "--run-dir", str(run), str(script)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert_no_auditor_traceback(done.stderr)
    (run / "projections.json").write_text("[]\n")  # a derived result beside run.json
    files = sorted(p.name for p in run.iterdir() if p.is_file())
    before = {name: (run / name).read_bytes() for name in files}
    refused = []
    for name in files:
        for argv in (("export", run, "-o", run / name), ("report", run, "-o", run / name)):
            status, err = command(*argv)
            refused.append(status == 2 and one_error_line(err))
    after = {name: (run / name).read_bytes() for name in files}
    held = "memray.bin" in files and all(refused) and after == before
    return Held(held, f"{sum(refused)} of {len(refused)} outputs onto {', '.join(files)} refused in one line; "
                      f"the folder {'unchanged' if after == before else 'CHANGED'}")


# -- a damaged event log -------------------------------------------------------------------------

def damaged_middle_line(tmp_path: Path) -> Held:
    """A killed run's log (no run.json) with line 3 of its events overwritten by garbage:
    report, export and rebuild each recover the rest, warn naming line 3 on stderr, and the
    report and run.json say so too."""
    run = a_run(tmp_path / "run")
    (run / "run.json").unlink()
    lines = (run / "events.jsonl").read_bytes().splitlines(keepends=True)
    lines[2] = b'{"event": "stage_fini\x00\xff garbage\n'
    (run / "events.jsonl").write_bytes(b"".join(lines))
    seen, held = [], True
    for argv in (("report", run), ("export", run), ("rebuild", run)):
        status, err = command(*argv)
        warned = "line 3" in err and "warning" in err and "error" not in err
        held = held and status == 0 and warned
        seen.append(f"{argv[0]} exit {status}{' warned' if warned else ''}")
    report = (run / "report.md").read_text() if (run / "report.md").exists() else ""
    record = json.loads((run / "run.json").read_text()) if (run / "run.json").exists() else {}
    in_report = "line 3 is damaged" in report
    in_record = any("line 3 is damaged" in w for w in record.get("warnings", []))
    stages = [(s["path"], s["status"]) for s in record.get("stages", [])]
    held = held and in_report and in_record and ("save", "ok") in stages
    return Held(held, f"{'; '.join(seen)}; the report {'names' if in_report else 'omits'} line 3, "
                      f"run.json {'names' if in_record else 'omits'} it; {len(stages)} stages kept")


# -- ranks merged only when they belong together ---------------------------------------------------

def unrelated_runs_as_ranks(tmp_path: Path) -> Held:
    """Two single-process runs copied into rank-0/ and rank-1/: no merged report, one line."""
    folder = tmp_path / "runs"
    a_run(folder / "rank-0", ("small",))
    a_run(folder / "rank-1", ("small", "large"))
    status, err = command("report", folder)
    held = status == 2 and one_error_line(err) and not (folder / "report.md").exists()
    return Held(held, f"report exit {status}: {err.strip()[:140]}")


def ranks_of_two_launches(tmp_path: Path) -> Held:
    """Rank 0 of one real torchrun run and rank 1 of another (both of 2 ranks): refused."""
    folder = tmp_path / "runs"
    shutil.copytree(TWO_RANKS / "rank-0", folder / "rank-0")
    shutil.copytree(OTHER_TWO_RANKS / "rank-1", folder / "rank-1")
    status, err = command("report", folder)
    held = status == 2 and one_error_line(err) and "launch" in err and not (folder / "report.md").exists()
    return Held(held, f"report exit {status}: {err.strip()[:140]}")


def ranks_of_one_launch(tmp_path: Path) -> Held:
    """The committed records of a real 2-rank gloo torchrun run still merge."""
    folder = tmp_path / "runs"
    shutil.copytree(TWO_RANKS, folder, ignore=shutil.ignore_patterns("*.md", "*.png"))
    status, err = command("report", folder)
    text = (folder / "report.md").read_text() if (folder / "report.md").exists() else ""
    held = status == 0 and "rank 1" in text.lower() and not err.strip()
    return Held(held, f"report exit {status}; merged report {'written' if text else 'MISSING'}")


CASES = {
    "report.md planted as a link to a file outside the run folder": report_through_a_planted_link("report.md"),
    "report-timeline.png planted as a link outside the run folder": report_through_a_planted_link(
        "report-timeline.png"),
    "run.json.tmp planted as a link, then auditor rebuild": rebuild_through_a_planted_temporary,
    "run.json.tmp planted as a link before the run ends": run_end_through_a_planted_temporary,
    "events.jsonl planted as a link in a new run folder": run_into_a_planted_event_log,
    "export -o and report -o onto each record file of a run": outputs_onto_record_files,
    "events.jsonl with a damaged line in the middle": damaged_middle_line,
    "two unrelated runs in rank-0/ and rank-1/": unrelated_runs_as_ranks,
    "rank 0 and rank 1 of two different torchrun launches": ranks_of_two_launches,
    "the committed records of a real 2-rank gloo torchrun run still merge": ranks_of_one_launch,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_holds(name, tmp_path):
    result = CASES[name](tmp_path)
    assert result.held, result.seen
