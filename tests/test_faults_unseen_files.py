"""Issue 32's fault suite, second round: files, records and command outputs tried in ways the
first round did not (red team). Each case builds what a user could meet (an output that is a
stream or a device, a name only its case tells from a record's, a run folder whose audit is still
going, a script or folder named in bytes that are not UTF-8, a name near the 255-byte limit, an
error message of megabytes, event logs cut, doubled in CRLF or holding a 100 MB line, a folder
made immutable, a leftover rank of a larger world) and runs the real commands; a case returns
`Held`. Bad input: one line, exit 2, nothing written; else a best-effort result and a warning.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_cases import Held, not_a_rank  # noqa: F401  (an autouse fixture: plain runs)
from test_faults import TIMEOUT_S, assert_no_auditor_traceback, write_script
from test_faults_files import TWO_RANKS, a_run, command, one_error_line

import auditor

# -- outputs that are not files of their own -----------------------------------------------------

def outputs_that_are_streams(tmp_path: Path) -> Held:
    """`export -o` and `report -o` at a FIFO and at a link to /proc/self/fd/1 (what /dev/stdout
    is): a safe write renames a file over the name, which replaced /dev/stdout itself for the
    whole machine. Each refused in one line; the FIFO is still a FIFO, the link still a link."""
    run = a_run(tmp_path / "run")
    fifo, fifo_md, stdout = tmp_path / "trace.json", tmp_path / "report.md", tmp_path / "stdout.json"
    os.mkfifo(fifo)
    os.mkfifo(fifo_md)
    stdout.symlink_to("/proc/self/fd/1")
    answers = [command("export", run, "-o", out) for out in (fifo, stdout)] + [command("report", run, "-o", fifo_md)]
    refused = [status == 2 and one_error_line(err) and ("not a regular file" in err or "/proc" in err)
               for status, err in answers]
    kept = stat.S_ISFIFO(fifo.lstat().st_mode) and stat.S_ISFIFO(fifo_md.lstat().st_mode) and stdout.is_symlink()
    return Held(all(refused) and kept, f"{sum(refused)} of 3 refused in one line "
                f"({answers[1][1].strip()[:90]}...); FIFOs and link {'kept' if kept else 'REPLACED'}")


def outputs_by_other_names(tmp_path: Path) -> Held:
    """Outputs reaching a record's file by another name: D/../D/run.json, a symlinked alias of the
    folder, a case-changed name (one file on macOS) are refused; a hard link to run.json is
    replaced as a name of its own, run.json untouched."""
    run = a_run(tmp_path / "run")
    (tmp_path / "alias").symlink_to(run)
    os.link(run / "run.json", tmp_path / "hard.json")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    refused = [command("export", run, "-o", out)[0] == 2
               for out in (run / ".." / "run" / "run.json", tmp_path / "alias" / "events.jsonl",
                           run / "RUN.JSON", run / "Events.JSONL")]
    refused.append(command("report", run, "-o", tmp_path / "alias" / "run.json")[0] == 2)
    hard, _ = command("export", run, "-o", tmp_path / "hard.json")
    unchanged = {p.name: p.read_bytes() for p in run.iterdir()} == before
    held = all(refused) and hard == 0 and unchanged and json.loads((tmp_path / "hard.json").read_text()) != {}
    return Held(held, f"{sum(refused)} of {len(refused)} aliases refused; export onto a hard link exit {hard}; "
                      f"the run folder {'unchanged' if unchanged else 'CHANGED'}")


def long_output_names(tmp_path: Path) -> Held:
    """An output name of 245 characters (legal: 255 bytes is the limit): export writes it (its
    temporary's name kept short); report refuses before any work, its PNG's name being too long."""
    run = a_run(tmp_path / "run")
    export, _ = command("export", run, "-o", tmp_path / ("t" * 245 + ".json"))
    report, err = command("report", run, "-o", tmp_path / ("r" * 245 + ".md"))
    left = sorted(p.name[:8] for p in tmp_path.iterdir() if p.name.startswith(("r", ".r")))
    held = export == 0 and report == 2 and one_error_line(err) and "255" in err and left == ["run"]
    return Held(held, f"export exit {export}; report exit {report}: {err.strip()[:100]}")


def a_folder_at_the_reports_png(tmp_path: Path) -> Held:
    """A folder named report-timeline.png in the run folder: the report is refused before it is
    rendered (it was found only on writing the PNG), nothing written."""
    run = a_run(tmp_path / "run")
    (run / "report-timeline.png").mkdir()
    status, err = command("report", run)
    held = status == 2 and one_error_line(err) and "is a folder" in err and not (run / "report.md").exists()
    return Held(held, f"report exit {status}: {err.strip()[16:110]}")


# -- a run folder whose audit is still going --------------------------------------------------------

WAITS_FOR_A_FILE = """
    import os, sys, time
    import auditor
    with auditor.stage("load"):
        data = bytearray(b"x" * 1_000_000)
    with auditor.stage("wait"):
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.02)
    print("finished")
"""


def report_of_a_run_still_going(tmp_path: Path) -> Held:
    """`auditor report` of a folder an audit is writing says the run is still going (it said the
    run was killed); `auditor rebuild` refuses it (it wrote an 'unfinished' run.json mid-run);
    the run then ends with its own run.json."""
    script, go, run = write_script(tmp_path, WAITS_FOR_A_FILE), tmp_path / "go", tmp_path / "run"
    going = subprocess.Popen([sys.executable, "-m", "auditor", "run", "--run-dir", str(run), str(script), str(go)],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while b'"wait"' not in ((run / "events.jsonl").read_bytes() if (run / "events.jsonl").exists() else b""):
            assert time.monotonic() < deadline and going.poll() is None, "the run never reached its stage"
            time.sleep(0.05)
        status, _ = command("report", run)
        top = (run / "report.md").read_text().split("## ")[0] if status == 0 else ""
        rebuilt, err = command("rebuild", run)
        mid_run_json = (run / "run.json").exists()
    finally:
        go.write_text("")
        out, err_run = going.communicate(timeout=TIMEOUT_S)
    assert_no_auditor_traceback(err_run)
    ended = json.loads((run / "run.json").read_text())["exit"]["status"] if (run / "run.json").exists() else None
    held = "still going" in top and "killed" not in top and rebuilt == 2 and one_error_line(err) \
        and not mid_run_json and going.returncode == 0 and out.strip() == "finished" and ended == "ok"
    return Held(held, f"report exit {status} ({'says still going' if 'still going' in top else 'NOT said going'}); "
                      f"rebuild exit {rebuilt}; the run ended {going.returncode}, its record {ended}")


# -- names -------------------------------------------------------------------------------------

NOT_UTF8 = """
    import os
    import auditor
    with auditor.stage(os.fsdecode(b"st\\xe9p")):
        data = bytearray(b"x" * 1_000_000)
    print("ok")
"""


def names_that_are_not_utf8(tmp_path: Path) -> Held:
    """A script named caf\\xe9.py run into folder d\\xe9/ (names in Latin-1 bytes), a stage named
    from such bytes: the run as alone; report (also -o o\\xe9.md), export and rebuild work (report
    exited 2 'malformed' on matplotlib's title and the markdown's encoding)."""
    script = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9.py"))
    script.write_text(write_script(tmp_path, NOT_UTF8).read_text())
    run = Path(os.fsdecode(bytes(tmp_path) + b"/d\xe9"))
    alone = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, timeout=TIMEOUT_S)
    done = subprocess.run([sys.executable, "-m", "auditor", "run", "--run-dir", str(run), str(script)],
                          cwd=tmp_path, capture_output=True, timeout=TIMEOUT_S)
    same = (done.returncode, done.stdout) == (alone.returncode, alone.stdout) and b"Traceback" not in done.stderr
    out = Path(os.fsdecode(bytes(tmp_path) + b"/o\xe9.md"))
    answers = [command("report", run)[0], command("report", run, "-o", out)[0], command("export", run)[0],
               command("rebuild", "--force", run)[0]]
    shown = "caf\\\\udce9" in (run / "report.md").read_text(errors="replace") if answers[0] == 0 else False
    held = same and answers == [0, 0, 0, 0] and shown and out.with_name(out.stem + "-timeline.png").exists()
    return Held(held, f"alone {alone.returncode}, audited {done.returncode}; report, report -o, export, rebuild: "
                      f"exit {answers}; the name {'shown escaped' if shown else 'MISSING'}")


def a_script_name_of_250_characters(tmp_path: Path) -> Held:
    """`auditor run` of a script whose name has 250 characters (legal), into its default folder
    under runs/: the run as alone (it died with a traceback, exit 1: runs/STAMP-NAME was over
    255 bytes)."""
    script = write_script(tmp_path, NOT_UTF8, name="a" * 247 + ".py")
    alone = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                           timeout=TIMEOUT_S)
    done = subprocess.run([sys.executable, "-m", "auditor", "run", str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert_no_auditor_traceback(done.stderr)
    records = list((tmp_path / "runs").glob("*/run.json")) if (tmp_path / "runs").is_dir() else []
    held = (done.returncode, done.stdout) == (alone.returncode, alone.stdout) and len(records) == 1
    return Held(held, f"alone exit {alone.returncode}, audited exit {done.returncode}; "
                      f"{len(records)} record under runs/ ({records[0].parent.name[:40] if records else '-'}...)")


def an_error_of_megabytes(tmp_path: Path) -> Held:
    """A stage fails with a 5 MB message (what a program printing a big value in its error
    makes): the record keeps it whole; the report quotes its head and says how much more (the
    report was 25 MB, the message five times)."""
    run = tmp_path / "run"
    try:
        with auditor.Audit(run, name="big-error"), auditor.stage("boom"):
            raise ValueError("x" * 5_000_000)
    except ValueError:
        pass
    status, err = command("report", run)
    size = (run / "report.md").stat().st_size if status == 0 else 0
    text = (run / "report.md").read_text() if status == 0 else ""
    held = status == 0 and size < 100_000 and "characters more, in the run record" in text
    return Held(held, f"report exit {status}, {size:,} bytes")


# -- event logs cut, doubled, huge -----------------------------------------------------------------

def killed_log(tmp_path: Path, name: str, change) -> Path:
    """A run folder as a killed run leaves it (no run.json), its log's bytes changed by `change`."""
    run = a_run(tmp_path / name)
    (run / "run.json").unlink()
    (run / "events.jsonl").write_bytes(change((run / "events.jsonl").read_bytes()))
    return run


def logs_in_odd_shapes(tmp_path: Path) -> Held:
    """events.jsonl with CRLF endings, a line of NUL bytes, cut half-way, with only its header, an
    editor's byte-order mark (refused before):
    each renders (a warning for the damaged line); empty, or NUL bytes only: one line, exit 2."""
    renders = {
        "crlf": lambda b: b.replace(b"\n", b"\r\n"),
        "nul line": lambda b: b"\n".join([*b.split(b"\n")[:2], b"\0" * 64, *b.split(b"\n")[2:]]),
        "cut half-way": lambda b: b[:len(b) // 2],
        "header only": lambda b: b.split(b"\n")[0] + b"\n",
        "a BOM": lambda b: b"\xef\xbb\xbf" + b,
    }
    refused = {"empty": lambda b: b"", "nul only": lambda b: b"\0" * 4096}
    seen, held = [], True
    for name, change in renders.items():
        run = killed_log(tmp_path, name.replace(" ", "-"), change)
        status, err = command("report", run)
        ok = status == 0 and "Traceback" not in err and (run / "report.md").exists()
        ok = ok and (name != "nul line" or "line 3 is damaged" in err)
        held, seen = held and ok, [*seen, f"{name} {status}"]
    for name, change in refused.items():
        run = killed_log(tmp_path, name.replace(" ", "-"), change)
        status, err = command("report", run)
        ok = status == 2 and one_error_line(err) and not (run / "report.md").exists()
        held, seen = held and ok, [*seen, f"{name} {status}"]
    return Held(held, "report exit: " + ", ".join(seen))


def a_log_with_a_100mb_line(tmp_path: Path) -> Held:
    """events.jsonl with a 100 MB line of garbage in the middle, and another with a 20 MB warning
    event: the first is skipped with a warning naming it, the second is quoted by its head."""
    garbage = killed_log(tmp_path, "garbage", lambda b: b.replace(b"\n", b"\n" + b"x" * 100_000_000 + b"\n", 1))
    status, err = command("export", garbage)
    skipped = status == 0 and "line 2 is damaged" in err
    warning = json.dumps({"event": "warning", "message": "w" * 20_000_000}).encode()
    huge = killed_log(tmp_path, "huge", lambda b: b.replace(b"\n", b"\n" + warning + b"\n", 1))
    shown, _ = command("report", huge)
    size = (huge / "report.md").stat().st_size if shown == 0 else 0
    return Held(skipped and shown == 0 and size < 100_000,
                f"export of the 100 MB line exit {status} ({'skipped, warned' if skipped else 'NOT warned'}); "
                f"report of the 20 MB warning exit {shown}, {size:,} bytes")


def a_run_json_cut_short(tmp_path: Path) -> Held:
    """run.json cut short (a copy interrupted) beside a whole events.jsonl: report refuses in one
    line naming the rebuild that restores it; after `rebuild --force` the report renders."""
    run = a_run(tmp_path / "run")
    whole = (run / "run.json").read_bytes()
    (run / "run.json").write_bytes(whole[:len(whole) // 2])
    refused, err = command("report", run)
    rebuilt, _ = command("rebuild", "--force", run)
    again, _ = command("report", run)
    held = refused == 2 and one_error_line(err) and "rebuild --force" in err and rebuilt == 0 and again == 0
    return Held(held, f"report exit {refused} ({err.strip()[16:90]}...); rebuild --force exit {rebuilt}; "
                      f"report then exit {again}")


def fifos_at_record_names(tmp_path: Path) -> Held:
    """A FIFO planted at run.json, at events.jsonl (a killed run's folder) and at projections.json:
    report and export waited forever for a writer; now each is refused in one line."""
    seen, held = [], True
    for name in ("run.json", "events.jsonl", "projections.json"):
        run = a_run(tmp_path / name.split(".")[0])
        if name == "events.jsonl":
            (run / "run.json").unlink()
        (run / name).unlink(missing_ok=True)
        os.mkfifo(run / name)
        for what in ("report", "export"):
            try:
                status, err = within(10, command, what, run)
            except TimeoutError:
                held, seen = False, [*seen, f"{what} at {name} HUNG"]
                continue
            held = held and status == 2 and one_error_line(err) and "regular file" in err
            seen.append(f"{what} at {name} {status}")
    return Held(held, "; ".join(seen))


def within(seconds: int, function, *args):
    """`function(*args)`, or TimeoutError when it has not returned after `seconds` (SIGALRM breaks
    a blocking open or read in this, the main, thread)."""
    def late(signum, frame):
        raise TimeoutError(f"still waiting after {seconds} s")
    previous = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        return function(*args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -- folders ------------------------------------------------------------------------------------

def an_immutable_run_folder(tmp_path: Path) -> Held:
    """A killed run's folder made immutable (chattr +i: even root cannot write; chmod for others):
    report, export and rebuild each refuse in one line, before any work; the folder unchanged."""
    run = killed_log(tmp_path, "run", lambda b: b)
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(run)]).returncode != 0:
            return Held(True, "not tried: chattr +i is not available here")
        undo = ["chattr", "-i", str(run)]
    else:
        run.chmod(0o555)
        undo = ["chmod", "755", str(run)]
    try:
        answers = [command(*argv) for argv in (("report", run), ("export", run), ("rebuild", run))]
    finally:
        subprocess.run(undo)
    held = all(status == 2 and one_error_line(err) for status, err in answers) \
        and sorted(p.name for p in run.iterdir()) == ["events.jsonl"]
    return Held(held, "report, export, rebuild: exit " + ", ".join(str(status) for status, _ in answers))


def a_run_dir_that_links_to_a_run(tmp_path: Path) -> Held:
    """--run-dir a symlink to an existing run's folder: refused before the program runs."""
    run = a_run(tmp_path / "run")
    (tmp_path / "alias").symlink_to(run)
    script = write_script(tmp_path, "print('ran')\n")
    done = subprocess.run([sys.executable, "-m", "auditor", "run", "--run-dir", "alias", str(script)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S)
    held = done.returncode == 2 and one_error_line(done.stderr) and "ran" not in done.stdout
    return Held(held, f"auditor run exit {done.returncode}: {done.stderr.strip()[:100]}")


def a_leftover_rank_of_a_larger_world(tmp_path: Path) -> Held:
    """A real 2-rank run's folder with a rank-7/ whose record says rank 7 of that world of 2 (a copy,
    a leftover): refused in one line (it was merged as a third rank)."""
    folder = tmp_path / "runs"
    shutil.copytree(TWO_RANKS, folder, ignore=shutil.ignore_patterns("*.md", "*.png"))
    shutil.copytree(folder / "rank-1", folder / "rank-7")
    record = json.loads((folder / "rank-7" / "run.json").read_text())
    record["rank"]["rank"] = 7
    (folder / "rank-7" / "run.json").write_text(json.dumps(record))
    status, err = command("report", folder)
    held = status == 2 and one_error_line(err) and "rank-7" in err and not (folder / "report.md").exists()
    return Held(held, f"report exit {status}: {err.strip()[:120]}")


def ranks_missing_or_linked(tmp_path: Path) -> Held:
    """A real 2-rank run's folder without rank-1/ gives rank 0's report saying rank 1 left no
    record; rank-0/ and rank-1/ as symlinks to the ranks' folders elsewhere merge as the folders
    do, the report written in the folder named, not through the links."""
    missing, linked, real = tmp_path / "missing", tmp_path / "linked", tmp_path / "real"
    shutil.copytree(TWO_RANKS, real, ignore=shutil.ignore_patterns("*.md", "*.png"))
    shutil.copytree(real / "rank-0", missing / "rank-0")
    status, err = command("report", missing)
    said = status == 0 and "No record from rank 1" in (missing / "report.md").read_text()
    linked.mkdir()
    for rank in ("rank-0", "rank-1"):
        (linked / rank).symlink_to(real / rank)
    merged, _ = command("report", linked)
    text = (linked / "report.md").read_text() if merged == 0 else ""
    held = said and merged == 0 and "| 1 |" in text and not list(real.rglob("report.md"))
    return Held(held, f"rank 1 missing: report exit {status} ({'says so' if said else 'SILENT'}); "
                      f"linked ranks: report exit {merged}")


CASES = {
    "export -o and report -o at a FIFO and at a link to /proc/self/fd/1": outputs_that_are_streams,
    "outputs reaching run.json by another name (D/../D, an alias, RUN.JSON, a hard link)": outputs_by_other_names,
    "an output name of 245 characters": long_output_names,
    "a folder named report-timeline.png in the run folder": a_folder_at_the_reports_png,
    "auditor report and rebuild while the audit is still writing the folder": report_of_a_run_still_going,
    "a script caf\\xe9.py and a run folder d\\xe9 named in bytes that are not UTF-8": names_that_are_not_utf8,
    "auditor run of a script named in 250 characters": a_script_name_of_250_characters,
    "a stage that fails with a 5 MB error message": an_error_of_megabytes,
    "events.jsonl in CRLF, with NUL bytes, cut half-way, header only, empty": logs_in_odd_shapes,
    "events.jsonl with a 100 MB line": a_log_with_a_100mb_line,
    "run.json cut short beside a whole events.jsonl": a_run_json_cut_short,
    "a FIFO at run.json, events.jsonl or projections.json": fifos_at_record_names,
    "a run folder made immutable, then report, export and rebuild": an_immutable_run_folder,
    "--run-dir a symlink to an existing run": a_run_dir_that_links_to_a_run,
    "a rank-7/ beside a 2-rank run's rank-0/ and rank-1/": a_leftover_rank_of_a_larger_world,
    "a 2-rank run's folder without rank-1/, and one whose rank folders are links": ranks_missing_or_linked,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_holds(name, tmp_path):
    result = CASES[name](tmp_path)
    assert result.held, result.seen
