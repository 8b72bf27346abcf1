"""The terminal summary of `auditor run`, made again from a committed record alone."""
from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

import auditor
from auditor.renderers import terminal
from auditor.report_models.terminal import run_summary

RUN = Path(__file__).parents[1] / "reports" / "example-hessian-pruner-runs" / "run"


def shown(summary) -> str:
    out = io.StringIO()
    terminal.run_summary(Console(file=out, width=120, highlight=False), summary)
    return out.getvalue()


def test_repeated_calls_fold_into_one_row_naming_the_highest_call():
    record = auditor.load(RUN)
    summary = run_summary(record, RUN, RUN / "run.json")
    folded = [row for row in summary.rows if row.calls > 1]
    assert folded and sum(row.calls for row in summary.rows) == len(record.stages)
    text = shown(summary)
    assert f"({len(record.stages)} stages in {len(summary.rows)} rows: repeated calls folded" in text
    row = folded[0]
    which = f"#{row.highest_call.index}" if row.highest_call else f"{row.highest} of {row.calls}"
    assert which in text
    assert f"run record: {RUN / 'run.json'}" in text


def test_a_record_not_written_points_at_its_event_log_and_unwritten_files_are_not_named(tmp_path):
    record = auditor.load(RUN)
    (tmp_path / "events.jsonl").write_text("")
    text = shown(run_summary(record, tmp_path, None))
    assert "flamegraph not written" in text  # the flamegraph is not in tmp_path
    assert f"run record: not written (see the warning above); {tmp_path / 'events.jsonl'} holds" in text
    assert f"`auditor rebuild {tmp_path}`" in text
