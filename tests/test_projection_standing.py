"""No figure without its standing: a traced run that fails part-way fills no headline cell (the
report's title, its summary, the answer table's column, the fixes' column, the terminal's line);
each says "failed at stage X: reason" instead. A target model built as a stand-in says so where
the traced figure is shown."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap
import uuid

import pytest
from conftest import TINY_LLAMA_SCRIPT
from rich.console import Console

import auditor
from auditor.analysis.projection.standing import traced_failure
from auditor.renderers import terminal
from auditor.renderers.markdown import render
from auditor.report_models.run import run_report
from auditor.report_models.terminal import projection_summary

TARGET = ["--target", "llama-2-7b", "--target-layers", "2", "--target-hidden", "128",
          "--target-intermediate", "256", "--target-heads", "2", "--target-vocab", "256"]

# A program whose second step dies only in the traced run, as one reading a value fake tensors
# lack (Wanda's `hf_device_map`) does: the real run finishes, the traced one stops in `score`.
ALGORITHM = "\nimport os" + TINY_LLAMA_SCRIPT + """

def copy_weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def score(model, copies):
    if os.environ.get("AUDITOR_TRACED"):
        raise RuntimeError("no device map on this model")
    scratch = torch.ones(4_000_000)  # the run's peak, inside the stage
    return {name: w.abs() * scratch[0] for name, w in copies.items()}
"""
SCRIPT = """
import sys
from {module} import copy_weights, get_llm, score

model = get_llm()
copies = copy_weights(model)
scores = score(model, copies)
print(len(scores))
"""
# every number a size prints as (units.size): none may stand for the failed traced run
SIZE = re.compile(r"\d[\d,.]* (?:B|KiB|MiB|GiB|TiB)\b")


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    """`auditor run` of the script, its traced projection failing in `score`, once for the
    module: (the run folder, what it said on the terminal)."""
    folder = tmp_path_factory.mktemp("failing")
    module = f"algo_{uuid.uuid4().hex[:8]}"
    (folder / f"{module}.py").write_text(textwrap.dedent(ALGORITHM))
    (folder / "prune.py").write_text(textwrap.dedent(SCRIPT.format(module=module)))
    # a fresh process, as a user runs it: a test worker's own RSS would hold the run's peak
    done = subprocess.run([sys.executable, "-m", "auditor", "run", "--run-dir", "out", "--model-from",
                           f"{module}:get_llm", "--stage", f"{module}:copy_weights", "--stage",
                           f"{module}:score", *TARGET, "prune.py"], cwd=folder, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "COLUMNS": "400"})
    # the real run finished: the projection's failure is no new status
    assert done.returncode == 0, done.stderr[-2000:]
    return folder / "out", done.stderr


def test_a_traced_run_that_fails_part_way_gives_no_headline_figure(failing):
    out, err = failing
    (projection,) = json.loads((out / "projections.json").read_text())
    assert "no device map on this model" in projection["incomplete"]
    assert [s["path"] for s in projection["stages"]] == ["copy_weights", "score"]  # score failed, finished
    # the terminal: where it failed and why, no figure
    (line,) = [line for line in err.splitlines() if line.startswith("traced projection to llama-2-7b")]
    assert "failed at stage score: RuntimeError: no device map on this model (exit status 1)" in line
    assert not SIZE.search(line) and "peak live tensors" not in line
    # the report: the title, the summary row and the answer table's traced column say so, no figure
    record = auditor.load(out)
    text = render(run_report(record))
    title = text.splitlines()[0]
    target_part = title.split("; at llama-2-7b", 1)[1]
    assert "(traced) failed at stage `score`: RuntimeError: no device map on this model" in target_part
    assert not SIZE.search(target_part)
    (summary_row,) = [line for line in text.splitlines() if line.startswith("| projected (traced: llama-2-7b")]
    assert "failed at stage `score`" in summary_row and not SIZE.search(summary_row)
    table = _answer_table(text)
    traced_column = table[0].index("at llama-2-7b (layers 2, hidden 128, vocab 256, heads 2, intermediate 256) "
                                   "(traced)")
    cells = [row[traced_column] for row in table[2:]]
    assert cells[-1].startswith("failed at stage `score`: RuntimeError: no device map")
    assert set(cells[:-1]) == {"-"}
    # the details still hold what it finished, said to stop there
    assert "the stages after it are not projected" in text


def test_the_failed_stage_is_exact_with_the_traced_runs_own_record(failing):
    out, _ = failing
    (projection,) = json.loads((out / "projections.json").read_text())
    traced = auditor.load(out / projection["run_folder"], from_events=True)
    failure = traced_failure(projection, traced)
    assert failure is not None and (failure.stage, failure.where) == ("score", "at")
    # the projection names the stage itself (failed_stage): exact from the record alone too
    assert projection["failed_stage"] == "score"
    assert traced_failure(projection) is not None and traced_failure(projection).where == "at"
    assert traced_failure({**projection, "incomplete": None}) is None
    # a projection that names the stage needs no record; one that does not (an older one) says
    # "at or after" its last projected stage
    assert traced_failure({**projection, "failed_stage": "score"}).phrase.startswith(
        "failed at stage `score`: RuntimeError: no device map")
    older = {k: v for k, v in projection.items() if k != "failed_stage"}
    assert traced_failure(older).where == "at or after"


def test_a_stand_in_target_model_is_said_where_the_traced_figure_is_shown(failing):
    record = auditor.load(failing[0])
    (projection,) = record.annotations["projections"]
    projection.pop("incomplete")  # the same figures from a run that finished, its model a stand-in
    says = "The program's model is not a transformers model, so the target is a stand-in Llama"
    projection["target_built"] = {"by": "stand-in", "says": says}
    text = render(run_report(record))
    header = _answer_table(text)[0]
    (column,) = [h for h in header if h.startswith("at llama-2-7b")]
    assert column.endswith("(traced)¹")
    assert f"\n\n¹ {says}.\n" in text
    assert SIZE.search(_answer_table(text)[-1][-1])  # the figure is shown, its footnote beside
    projection["target_built"] = {"by": "program", "says": "built by get_llm"}
    assert "(traced)¹" not in render(run_report(record))


def _answer_table(text: str) -> list[list[str]]:
    section = text.split("## What was alive at the peak", 1)[1].split("\n\n")
    table = next(block for block in section if block.startswith("| category / component"))
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table.splitlines()]


def test_the_terminal_gives_a_finished_traced_runs_figure_with_its_stand_in_line(failing):
    out, _ = failing
    (projection,) = json.loads((out / "projections.json").read_text())
    finished = {k: v for k, v in projection.items() if k != "incomplete"}
    said = io.StringIO()
    terminal.projection_summary(Console(file=said, width=400), projection_summary(finished, out))
    assert "peak live tensors" in said.getvalue() and "target model:" not in said.getvalue()
    finished["target_built"] = {"by": "stand-in", "says": "A stand-in Llama was built."}
    said = io.StringIO()
    terminal.projection_summary(Console(file=said, width=400), projection_summary(finished, out))
    lines = said.getvalue().splitlines()
    assert SIZE.search(lines[0]) and lines[1] == "  target model: A stand-in Llama was built"
