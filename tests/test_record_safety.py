"""Records are never overwritten nor misread: report outputs that would land on a record, a
killed run's folder rendered from its event log, `auditor rebuild`, field types checked
before anything is rendered, links and chart labels that survive odd names."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import one_error_line

import auditor
from auditor.cli import main
from auditor.record.run_folder import RunRecordError


@pytest.fixture
def run_folder(tmp_path) -> Path:
    """A finished run of three stages (no torch), in a folder of its own."""
    folder = tmp_path / "run"
    with auditor.Audit(folder, name="three stages"):
        for name in ("load", "work", "save"):
            with auditor.stage(name):
                _kept = bytearray(b"x" * 2_000_000)
    return folder


def killed_in(folder: Path, stage: str) -> Path:
    """The folder as a kill inside `stage` leaves it: the event log up to that stage's start."""
    lines = (folder / "events.jsonl").read_text().splitlines()
    opened = next(i for i, line in enumerate(lines)
                  if '"stage_started"' in line and f'"path":"{stage}"' in line)
    (folder / "events.jsonl").write_text("\n".join(lines[:opened + 1]) + "\n")
    (folder / "run.json").unlink()
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# -- outputs never land on a record -----------------------------------------------------------

@pytest.mark.parametrize("name, message", [
    ("run.json", "has the name of a run record's own file"),
    ("events.jsonl", "has the name of a run record's own file"),
    ("memray.bin", "has the name of a run record's own file"),
    ("report.png", "is not a .md file"),
    ("report", "is not a .md file"),
])
def test_a_report_output_that_would_replace_a_record_is_refused(run_folder, capsys, name, message):
    before = snapshot(run_folder)
    assert main(["report", str(run_folder), "-o", str(run_folder / name)]) == 2
    line = one_error_line(capsys)
    assert message in line and "report.md" in line, line  # says what would be right
    assert snapshot(run_folder) == before  # nothing written, nothing changed


# -- a killed run renders, and rebuilds -------------------------------------------------------

def test_a_killed_runs_folder_renders_from_its_event_log(run_folder, tmp_path, capsys):
    killed_in(run_folder, "save")
    before = snapshot(run_folder)
    out = tmp_path / "killed.md"
    assert main(["report", str(run_folder), "-o", str(out)]) == 0
    text = out.read_text()
    top = text.split("## Summary")[0]
    assert "This run did not finish" in top
    assert "2 of 3 stages finished, the last `work`; open when it stopped: `save`" in top
    assert "**open** (never finished)" in text  # the stage table marks it too
    assert snapshot(run_folder) == before  # no run.json written into the run folder
    assert out.with_name("killed-timeline.png").exists()


def test_a_finished_run_whose_run_json_failed_is_not_called_unfinished(run_folder):
    (run_folder / "run.json").unlink()  # the disk filled as run.json was written
    with pytest.raises(RunRecordError) as caught:
        auditor.load(run_folder)
    message = str(caught.value)
    assert "could not be written" in message and "auditor rebuild" in message
    assert "did not finish" not in message
    assert auditor.load(run_folder, from_events=True).exit.status == "ok"


def test_a_log_that_ends_early_says_the_run_did_not_finish(run_folder):
    killed_in(run_folder, "work")
    with pytest.raises(RunRecordError, match="the run did not finish .killed or interrupted"):
        auditor.load(run_folder)


def test_rebuild_writes_run_json_and_keeps_an_existing_one_unless_forced(run_folder, capsys):
    killed_in(run_folder, "save")
    assert main(["rebuild", str(run_folder)]) == 0
    assert "2 finished stages, 1 open; exit unfinished" in capsys.readouterr().out
    record = auditor.load(run_folder)
    assert [(s.path, s.status) for s in record.stages] == [("load", "ok"), ("work", "ok"), ("save", "open")]
    written = (run_folder / "run.json").read_bytes()

    assert main(["rebuild", str(run_folder)]) == 2
    assert "exists already; add --force" in one_error_line(capsys)
    assert (run_folder / "run.json").read_bytes() == written
    assert main(["rebuild", "--force", str(run_folder)]) == 0
    assert auditor.load(run_folder).to_json() == record.to_json()  # all of it, annotations too


@pytest.mark.parametrize("case, message", [
    ("missing", "does not exist"),
    ("a file", "is not a folder"),
    ("no log", "has no events.jsonl"),
    ("garbage log", "line 1 is not JSON"),
    ("not a run log", "does not begin with a run_started event"),
])
def test_rebuild_errors_are_one_line_and_write_nothing(tmp_path, capsys, case, message):
    target = tmp_path / "target"
    if case == "a file":
        target.write_text("x")
    elif case != "missing":
        target.mkdir()
    if case == "garbage log":
        (target / "events.jsonl").write_text("not json\n{}\n")
    elif case == "not a run log":
        (target / "events.jsonl").write_text('{"event": "stage_started"}\n')
    assert main(["rebuild", str(target)]) == 2
    assert message in one_error_line(capsys)
    assert not (target / "run.json").exists() if target.is_dir() else True


# -- field types checked before anything is rendered --------------------------------------------

@pytest.mark.parametrize("change, message", [
    (lambda r: r["stages"][0]["rss"].update(peak="12"),
     "stages[0].rss.peak should be a whole number of bytes, found str \"12\""),
    (lambda r: r["stages"][1].update(start_s=None), "stages[1].start_s should be a number of seconds, found null"),
    (lambda r: r["stages"][2].update(end_s=None), "stages[2].end_s should be a number of seconds, found null"),
    (lambda r: r["stages"][0].update(status="done"), "stages[0].status should be one of ok, failed, open"),
    (lambda r: r["peak"].update(rss=True), "peak.rss should be a whole number of bytes, found bool"),
    (lambda r: r.update(name=["x"]), "name should be text, found list"),
    (lambda r: r["stages"][0].update(py_heap=3), "stages[0].py_heap should be a JSON object"),
])
def test_a_record_with_a_wrong_field_type_is_one_line_and_renders_nothing(run_folder, tmp_path, capsys,
                                                                         change, message):
    record = json.loads((run_folder / "run.json").read_text())
    change(record)
    (run_folder / "run.json").write_text(json.dumps(record))
    out = tmp_path / "out" / "report.md"
    out.parent.mkdir()
    assert main(["report", str(run_folder), "-o", str(out)]) == 2
    assert message in one_error_line(capsys)
    assert list(out.parent.iterdir()) == []  # no PNG left behind


# -- links and labels survive odd names ---------------------------------------------------------

def test_image_links_work_for_report_names_with_spaces(run_folder, tmp_path):
    out = tmp_path / "my reports" / "memory (run 1).md"
    out.parent.mkdir()
    assert main(["report", str(run_folder), "-o", str(out)]) == 0
    link = re.search(r"!\[RSS over time\]\(([^)]*)\)", out.read_text()).group(1)
    assert link == "memory%20%28run%201%29-timeline.png"
    assert (out.parent / "memory (run 1)-timeline.png").exists()


@pytest.mark.parametrize("name", ["x" * 300, "W" * 200, " ".join(["MMMMMMMMMM"] * 30)])
def test_the_timeline_title_and_labels_stay_inside_the_figure(run_folder, name):
    from auditor.renderers.timeline_plot import draw
    from auditor.report_models.run import run_report
    record = auditor.load(run_folder)
    record.name = name
    figure = draw(run_report(record))
    figure.canvas.draw()
    renderer, box = figure.canvas.get_renderer(), figure.bbox
    axes = figure.axes[0]
    texts = [axes.title, axes.xaxis.label, axes.yaxis.label] + [t for t in axes.texts if not t.get_clip_on()]
    for text in texts:
        extent = text.get_window_extent(renderer)
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and box.y0 <= extent.y0 and extent.y1 <= box.y1, \
            (text.get_text()[:40], extent.extents, box.extents)
