"""Child processes of an audited script (a subprocess, DataLoader workers) are not audited: the
record says how much memory they held, from the kernel's own figures, and the report and the
terminal say it beside the process's own. Real children, real `auditor run`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import auditor
from auditor.cli import main

MB = 1_000_000

# A child interpreter that touches 300 MB and ends; the script's own process stays small.
ENDED_CHILD = """
    import subprocess, sys
    import auditor
    with auditor.stage("child"):
        subprocess.run([sys.executable, "-c", "x = bytearray(300_000_000)"], check=True)
"""

# A child still running when the script ends, holding 200 MB.
RUNNING_CHILD = """
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(200_000_000); "
                              "print('ready', flush=True); time.sleep(120)"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert child.stdout.readline().strip() == "ready"
    open(sys.argv[1], "w").write(str(child.pid))
"""


def audit(tmp_path: Path, text: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(text).lstrip())
    return subprocess.run([sys.executable, "-m", "auditor", "run", "--run-dir", str(tmp_path / "run"),
                           str(script), *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_a_child_that_ended_is_reported_with_its_peak_and_never_counted_as_the_process_s(tmp_path):
    done = audit(tmp_path, ENDED_CHILD)
    assert done.returncode == 0, done.stderr
    record = auditor.load(tmp_path / "run")
    children = record.process.children
    assert children is not None and children.alive_at_end == 0
    assert 300 * MB <= children.largest_ended_peak_rss <= 340 * MB  # the bytearray and an interpreter
    assert record.peak.rss < 200 * MB  # the script's own process never held it
    assert "child processes (not audited, not in these figures): the largest that ended peaked at" in done.stderr

    assert main(["report", str(tmp_path / "run"), "-o", str(tmp_path / "report.md")]) == 0
    banner = (tmp_path / "report.md").read_text().split("## ")[0]
    assert ("**Child processes held memory outside this record**: the largest that ended during the run peaked at"
            in banner)


def test_a_child_still_running_at_the_end_is_read_as_it_is(tmp_path):
    pid_file = tmp_path / "child.pid"
    try:
        done = audit(tmp_path, RUNNING_CHILD, str(pid_file))
        assert done.returncode == 0, done.stderr
        children = json.loads((tmp_path / "run" / "run.json").read_text())["process"]["children"]
        assert children["alive_at_end"] == 1 and children["largest_ended_peak_rss"] is None
        assert 200 * MB <= children["alive_rss_at_end"] <= 240 * MB
        assert 200 * MB <= children["alive_uss_at_end"] <= children["alive_rss_at_end"]
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


# A forked worker (as a DataLoader's) that holds 100 MB of its own beside its parent's 300 MB.
FORKED_WORKER = """
    import multiprocessing, time

    def hold(ready):
        mine = bytearray(100_000_000)
        for i in range(0, len(mine), 4096):
            mine[i] = 1
        ready.set()
        time.sleep(120)

    if __name__ == "__main__":
        parents = bytearray(300_000_000)
        for i in range(0, len(parents), 4096):
            parents[i] = 1
        context = multiprocessing.get_context("fork")
        ready = context.Event()
        context.Process(target=hold, args=(ready,), daemon=True).start()  # ended at exit
        assert ready.wait(60)
"""


def test_a_forked_worker_s_own_memory_is_told_from_the_pages_it_shares(tmp_path):
    done = audit(tmp_path, FORKED_WORKER)
    assert done.returncode == 0, done.stderr
    children = auditor.load(tmp_path / "run").process.children
    assert children.alive_at_end == 1
    assert children.alive_rss_at_end >= 400 * MB  # the parent's pages count in its RSS
    assert 100 * MB <= children.alive_uss_at_end <= 130 * MB  # its own: what it added
    assert "of it their own (USS)" in done.stderr
    # terminated at exit as a daemon, it ends by SIGTERM as it does without the auditor: no traceback
    assert "Traceback" not in done.stderr, done.stderr


def test_a_script_without_children_says_nothing_of_them(tmp_path):
    done = audit(tmp_path, """
        import auditor
        with auditor.stage("work"):
            data = bytearray(10_000_000)
    """)
    assert done.returncode == 0, done.stderr
    assert "children" not in json.loads((tmp_path / "run" / "run.json").read_text())["process"]
    assert "child processes" not in done.stderr


def test_the_merged_report_names_the_rank_whose_children_held_memory(tmp_path):
    """Two ranks as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK in the environment): only
    rank 1 starts a child."""
    from auditor.analysis.ranks.merged import merge_ranks
    from auditor.renderers.ranks_markdown import render
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import subprocess, sys
        import auditor
        with auditor.stage("child"):
            if sys.argv[1] == "1":
                subprocess.run([sys.executable, "-c", "x = bytearray(300_000_000)"], check=True)
    """).lstrip())
    for rank in ("0", "1"):
        env = {**os.environ, "RANK": rank, "WORLD_SIZE": "2", "LOCAL_RANK": rank}
        done = subprocess.run([sys.executable, "-m", "auditor", "run", "--run-dir", str(tmp_path / "run"),
                               str(script), rank], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
    text = render(merge_ranks(tmp_path / "run"))
    assert "- Rank 1's child processes held memory outside its figures (not audited): the largest that ended" in text
    assert "Rank 0's child" not in text
