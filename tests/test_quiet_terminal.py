"""The terminal stays a screenful whatever the call count: one line per distinct stage, calls
folded (auditor.renderers.terminal.StageLines), a capped stage table (terminal_summary.shown_rows),
sparse progress lines in a log (auditor.cli.progress)."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap

from rich.console import Console

from auditor.cli.progress import ChildProgress, Reading, StatusLine, run_reader, stage_reader
from auditor.renderers.terminal import MAX_STAGE_LINES, StageLines
from auditor.report_models.terminal import MAX_ROWS, StageEnd, SummaryRow, shown_rows

SCRIPT = """
    def accumulate_hessian_statistics(i):
        if i == 3:
            raise ValueError("a bad batch")  # caught below: the call's stage fails, the run goes on
        return [0.0] * 100

    def prune_one_layer(layer):
        for i in range(2500):
            try:
                accumulate_hessian_statistics(i)
            except ValueError:
                pass

    def never_called():
        pass

    def main():
        for layer in range(2):
            prune_one_layer(layer)

    main()
"""


def test_a_function_staged_5000_times_prints_a_screenful(tmp_path):
    (tmp_path / "prune.py").write_text(textwrap.dedent(SCRIPT))
    stages = ["prune:main", "prune:prune_one_layer", "prune:accumulate_hessian_statistics", "prune:never_called"]
    done = subprocess.run([sys.executable, "-m", "auditor", "run", "--run-dir", str(tmp_path / "run"),
                           *[arg for s in stages for arg in ("--stage", s)], "prune.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "80"})  # not a terminal: a log's lines
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert len(record["stages"]) == 5003  # every call is in the record
    lines = done.stderr.splitlines()
    assert len(lines) <= 60, done.stderr  # the bound; it printed 5,011 lines before
    # each distinct stage has its line, the failed call its own, the warning is shown
    for stage in ("main", "main/prune_one_layer", "main/prune_one_layer/accumulate_hessian_statistics"):
        assert any(f" ok {stage}  " in line for line in lines), (stage, done.stderr)
    assert any("FAILED main/prune_one_layer/accumulate_hessian_statistics#4  " in line for line in lines)
    assert any("warning: stage target prune:never_called was never called" in line for line in lines)
    # the final fold: every call counted, the two failures said
    assert any("2 FAILED main/prune_one_layer/accumulate_hessian_statistics  5,000 calls" in line
               for line in lines), done.stderr
    # the table at 80 columns: no stage name cut mid-word
    rows = [line for line in lines if line.startswith("│")]
    assert any("│     accumulate_hessian_statistics [2 not ok] │" in row for row in rows), done.stderr
    assert "(5,003 stages in 3 rows" in done.stderr


def ended(path: str, peak: int = 1 << 20, ok: bool = True) -> StageEnd:
    return StageEnd(path, ok, peak, 0, peak, 0.001)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_long_log_stays_a_screenful_whatever_the_call_count():
    """100,000 calls of one function over an hour, as a log shows them."""
    out, clock = io.StringIO(), Clock()
    lines = StageLines(Console(file=out, width=200), clock=clock)
    assert not lines.live
    for i in range(100_000):
        clock.now = i * 0.036
        lines.stage_ended(ended(f"layer#{i // 1000 + 1}/step#{i + 1}", peak=(1 << 20) + (i == 500)))
        if i % 1000 == 999:
            lines.stage_ended(ended(f"layer#{i // 1000 + 1}"))
    lines.close()
    printed = out.getvalue().splitlines()
    assert len(printed) <= 30, printed
    assert printed[0].startswith("auditor: ok layer/step  rss 1.0 MiB".replace("layer/step", "layer#1/step#1"))
    assert any("(so far)" in line for line in printed)  # it showed it was alive
    assert printed[-2] == ("auditor: ok layer/step  100,000 calls, peak 1.0 MiB (#501), rss 1.0 MiB at the "
                           "last, 100.00 s in all")
    assert printed[-1].startswith("auditor: ok layer  100 calls")


def test_distinct_stages_each_get_a_line_up_to_a_screenful():
    out = io.StringIO()
    lines = StageLines(Console(file=out, width=200), clock=Clock())
    for i in range(100):  # 100 distinct names, each called twice
        lines.stage_ended(ended(f"block{i}"))
        lines.stage_ended(ended(f"block{i}#2", ok=i != 7))
    lines.close()
    printed = out.getvalue().splitlines()
    assert len(printed) <= 2 * MAX_STAGE_LINES + 2, printed  # a first call's line, a fold line, a failure
    assert [line for line in printed if "block7" in line] == [  # its first call, its failed call, the fold
        "auditor: ok block7  rss 1.0 MiB (+0.0 MiB), peak 1.0 MiB, 0.00 s",
        "auditor: FAILED block7#2  rss 1.0 MiB (+0.0 MiB), peak 1.0 MiB, 0.00 s",
        "auditor: 1 FAILED block7  2 calls, peak 1.0 MiB (#1), rss 1.0 MiB at the last, 0.00 s in all"]
    more = 100 - MAX_STAGE_LINES
    assert printed[-1].startswith(f"auditor: {more} more stages, {2 * more} calls")


def test_a_terminal_redraws_the_lines_in_place_and_seldom():
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, width=120, height=30, force_terminal=True, color_system=None)
    lines = StageLines(console, clock=clock)
    assert lines.live
    for i in range(5000):  # 5 s of calls: the fold line redrawn about 25 times, not 5,000
        clock.now = i * 0.001
        lines.stage_ended(ended("prune/add_batch" + (f"#{i + 1}" if i else "")))
    lines.stage_ended(ended("prune"))
    lines.close()
    text = out.getvalue()
    assert text.count("add_batch") <= 40, text.count("add_batch")
    assert "\x1b[1A" not in text  # never a cursor up: only the bottom line is redrawn
    assert re.search(r"auditor: ok prune/add_batch  [234],\d{3} calls", text)  # a redraw, seconds in
    screen = text.rsplit("\x1b[2K", 1)[-1]  # what stays after the last redraw
    assert screen.replace("\x1b[?25h", "").strip() == ("auditor: ok prune/add_batch  5,000 calls, peak 1.0 MiB (#1), "
                                                       "rss 1.0 MiB at the last, 5.00 s in all")
    assert "auditor: ok prune  rss 1.0 MiB" in text and "auditor: ok prune/add_batch  rss 1.0 MiB" in text


def row(name: str, depth: int, peak: int) -> SummaryRow:
    return SummaryRow(name, depth, 1, 0, "ok", peak, 0, peak, 0.0, 1, None)


def test_the_stage_table_keeps_the_highest_peaks_with_their_parents():
    rows = [row("main", 0, 5)]
    for layer in range(50):
        rows.append(row(f"layer{layer}", 1, 3))
        rows.append(row("add_batch", 2, 100 if layer == 42 else 4))
    shown = shown_rows(rows)
    assert len(shown) == MAX_ROWS
    names = [r.name for r in shown]
    assert names[0] == "main" and "layer42" in names
    at = names.index("layer42")
    assert shown[at + 1].rss_peak == 100  # the run's highest peak, under its parent
    assert all(r.depth <= 1 or shown[i - 1].depth >= r.depth - 1 for i, r in enumerate(shown))
    assert shown_rows(rows[:MAX_ROWS]) == rows[:MAX_ROWS]


def log_events(path, *events):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for kind, stage, parent in events:
            f.write(json.dumps({"event": kind, "stage": {"path": stage, "parent": parent}}) + "\n")


def test_a_childs_progress_is_read_from_its_event_logs(tmp_path):
    read = stage_reader(tmp_path, top_level=True)
    assert read() == Reading(0, "")  # nothing written yet
    log_events(tmp_path / "events.jsonl", ("stage_started", "step", None), ("stage_started", "step/layer", "step"),
               ("stage_finished", "step/layer", "step"), ("stage_finished", "step", None),
               ("stage_started", "step#2", None))
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write('{"event": "stage_finished", "stage": {"pa')  # a line still being written: not read yet
    assert read() == Reading(1, "step#2")
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write('th": "step#2", "parent": null}}\n')
    assert read() == Reading(2, "step#2")
    log_events(tmp_path / "lower-bound" / "events.jsonl", ("stage_started", "step", None))
    assert read() == Reading(0, "lower-bound: step")  # the second pass, counted on its own
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "compact.json").write_text("{}")
    assert run_reader(tmp_path, "compact.json")() == Reading(1, "lower-bound: step")


def test_a_long_childs_progress_prints_a_dozen_lines_in_a_log():
    out, clock = io.StringIO(), Clock()
    done = Reading()
    progress = ChildProgress(Console(file=out, width=200), "tracing", lambda: done, expected=3600,
                             unit="top-level stages", clock=clock)
    progress._follow = lambda: None  # the test reads it, at its own clock
    with progress:
        for second in range(3600):
            clock.now, done = second, Reading(second, f"step#{second}")
            progress._update()
    printed = out.getvalue().splitlines()
    assert 5 <= len(printed) <= 20, printed
    assert printed[1] == ("auditor: tracing: 30 of 3,600 top-level stages, 30 s, about 59 min 30 s left, "
                          "in step#30")
    assert printed[-1] == "auditor: tracing: 3,599 of 3,600 top-level stages, 59 min 59 s"


def test_a_jobs_status_line_folds_its_stages_and_prints_failures(capsys):
    """The gradprobe job's stage ends: none printed in a log but its first failed call each."""
    def entry(path, status="ok"):
        return {"path": path, "status": status, "rss": {"start": 0, "end": 1 << 20, "peak": 1 << 20},
                "start_s": 0.0, "end_s": 0.5}
    with StatusLine() as advance:
        advance("auditing the real run")
        for i in range(1000):
            advance.stage_ended(entry(f"prune/step#{i + 1}", "failed" if i in (3, 4) else "ok"))
        with advance.follow(lambda: Reading(2, "x"), 2, unit="runs"):
            pass
    assert capsys.readouterr().err.splitlines() == [
        "auditor: auditing the real run",
        "auditor: FAILED prune/step#4  rss 1.0 MiB (+1.0 MiB), peak 1.0 MiB, 0.50 s",
        "auditor: auditing the real run: 2 of 2 runs, 0 s"]
