"""`auditor report` and the markdown memory report, on real run records (built by
test_findings.records: real audits of small torch workloads)."""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import one_error_line
from test_findings import TINY_GPT_NEO, records

from auditor.analysis.findings.rules import RULES, evaluate, findings
from auditor.analysis.run.attribution import BEYOND_CENSUS, UNSEEN_TENSORS, attribute, run_weights
from auditor.analysis.run.source_paths import code_root, shown_command
from auditor.analysis.run.stages import census_before, final_stage, peak_at_start, peak_stage
from auditor.analysis.run.timeline import timeline
from auditor.cli import main
from auditor.facts import units
from auditor.record.schema import CudaReadings, RunRecord
from auditor.renderers.markdown import render
from auditor.report_models.run import run_report

SECTIONS = ["## What was alive at the peak", "## Fixes", "## Summary", "## Stages", "## Timeline",
            "## Theoretical minimum and gap", "## Details", "## Top allocation sites at the peak", "## Findings",
            "## Environment"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return records(tmp_path_factory)


@pytest.fixture(scope="module")
def reports(built, tmp_path_factory):
    """Each record's report, written by the CLI into a folder apart from the run folder."""
    out = tmp_path_factory.mktemp("reports")
    written = {}
    for name, (_, folder) in built.items():
        target = out / name / "report.md"
        target.parent.mkdir()
        assert main(["report", str(folder), "-o", str(target)]) == 0
        written[name] = target
    return written


def text_of(reports, name) -> str:
    return reports[name].read_text(encoding="utf-8")


def tables(markdown: str) -> list[list[list[str]]]:
    """Every table: a list of rows, each a list of cells (split on unescaped pipes)."""
    found, current = [], []
    for line in markdown.splitlines() + [""]:
        if line.startswith("|"):
            current.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif current:
            found.append(current)
            current = []
    return found


def table_after(markdown: str, heading: str) -> list[list[str]]:
    return tables(markdown[markdown.index(heading):])[0]


def row(table, first_cell_contains: str) -> list[str]:
    """The one row whose first cell is, or else contains, the text."""
    matches = ([r for r in table if first_cell_contains == r[0].strip("*")]  # a failed stage is bold
               or [r for r in table if first_cell_contains in r[0]])
    assert len(matches) == 1, (first_cell_contains, [r[0] for r in table])
    return matches[0]


# -- the whole report ---------------------------------------------------------------------

def test_report_has_every_section_in_order(reports, built, capsys):
    for name in built:
        text = text_of(reports, name)
        assert text.startswith(f"# Memory report: {name}: peak ")
        positions = [text.index(heading + "\n") for heading in SECTIONS]
        assert positions == sorted(positions), name


def test_every_table_is_valid_github_markdown(reports, built):
    for name in built:
        found = tables(text_of(reports, name))
        assert len(found) >= 4, name
        for table in found:
            header, separator, *body = table
            assert len(separator) == len(header) and all(re.fullmatch(r":?-{3,}:?", c) for c in separator)
            assert all(len(r) == len(header) for r in body), (name, header)


def test_default_output_is_report_md_in_the_run_folder(built, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(built["failed"][1], folder)
    assert main(["report", str(folder / "run.json")]) == 0
    assert capsys.readouterr().out.strip() == str(folder / "report.md")
    assert (folder / "report.md").read_text().startswith("# Memory report: failed")
    assert (folder / "report-timeline.png").read_bytes().startswith(PNG_SIGNATURE)


def test_report_renders_from_the_record_alone_without_torch(built, tmp_path):
    """Another machine: only run.json, and no torch needed to read it."""
    (tmp_path / "copy").mkdir()
    shutil.copy(built["pattern"][1] / "run.json", tmp_path / "copy" / "run.json")
    code = ("import sys; from auditor.cli import main; rc = main(sys.argv[1:]); "
            "print('torch' in sys.modules, 'transformers' in sys.modules); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, "report", str(tmp_path / "copy")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "False False"
    assert "## Findings" in (tmp_path / "copy" / "report.md").read_text()


# -- summary ------------------------------------------------------------------------------

def test_summary(reports, built):
    record = built["pattern"][0]
    summary = table_after(text_of(reports, "pattern"), "## Summary")
    peak = record.peak
    assert row(summary, "peak RSS")[1] == f"**{units.size(peak.rss)}** in stage `{peak.stage}`"
    weights = run_weights(record)
    assert weights == peak_stage(record).components["model.parameters"].bytes
    assert row(summary, "peak / weights")[1].startswith(f"**{units.ratio(peak.rss, weights)}** the weights")
    live = max(s.live_tensors.peak for s in record.stages)
    assert row(summary, "peak live tensors")[1].startswith(units.size(live))
    counts = {s: sum(1 for f in findings(record) if f.severity == s) for s in ("high", "medium", "low")}
    assert row(summary, "findings")[1].startswith(
        f"{counts['high']} high, {counts['medium']} medium, {counts['low']} low")
    failed = table_after(text_of(reports, "failed"), "## Summary")
    assert row(failed, "peak live tensors")[1].startswith("not measured")
    assert row(failed, "peak / weights")[1].startswith("no census")


# -- stages -------------------------------------------------------------------------------

def test_stage_table(reports, built):
    record = built["pattern"][0]
    table = table_after(text_of(reports, "pattern"), "## Stages")
    header, _, *rows = table
    body = [r for r in rows if not r[0].startswith("*(unstaged)")]  # unstaged time has rows of its own
    assert header[:7] == ["stage", "status", "duration", "RSS end", "delta", "peak inside", "peak - start"]
    assert "live tensors peak" in header and "Python heap end" not in header and "CUDA allocated" not in header
    assert len(body) == len(record.stages)
    for cells, stage in zip(body, record.stages, strict=False):
        rss = stage.rss
        depth = stage.path.count("/")
        assert cells[0].startswith("&emsp;" * depth + ("**" if stage.path == record.peak.stage else stage.name[0]))
        assert not cells[0].startswith("&emsp;" * (depth + 1))
        assert cells[3] == units.size(rss.end)
        assert cells[4] == units.signed_size(rss.end - rss.start)
        assert cells[5] == units.size(rss.peak)
        assert cells[6] == units.signed_size(rss.peak - rss.start)
        assert cells[header.index("live tensors peak")] == units.size(stage.live_tensors.peak)
    assert row(table, "batch 1")[0] == "&emsp;batch 1"
    assert row(table, "spike")[0] == "**spike**"  # the stage holding the run's peak


LONG_RUN = """
import sys, torch, auditor
with auditor.Audit(sys.argv[1], name="long"):
    for index in range(int(sys.argv[2]) + 20):
        with auditor.stage(f"step {index}"):
            if index == 7:
                with auditor.stage("spike"):
                    float(torch.ones(25 * 10**6)[-1])  # 100 MB, freed at once
"""


def test_long_runs_show_the_highest_peaks_and_their_parents(tmp_path):
    from auditor.record.run_folder import load
    from auditor.renderers.markdown import MAX_STAGE_ROWS
    # a fresh process: in this one, earlier tests can leave a free block in the heap the spike would reuse
    done = subprocess.run([sys.executable, "-c", LONG_RUN, str(tmp_path / "run"), str(MAX_STAGE_ROWS)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert main(["report", str(tmp_path / "run")]) == 0
    text = (tmp_path / "run" / "report.md").read_text()
    table = table_after(text, "## Stages")
    assert len(table) - 2 <= MAX_STAGE_ROWS + 1
    assert row(table, "step 7")[0] == "step 7" and row(table, "spike")[0] == "&emsp;**spike**"
    assert f"are left out to keep the table to {MAX_STAGE_ROWS} rows; every stage is in the run record" in text
    assert load(tmp_path / "run").peak.stage == "step 7/spike"


def test_failed_stage_is_marked_and_heap_columns_appear(reports, built):
    table = table_after(text_of(reports, "failed"), "## Stages")
    header = table[0]
    assert "Python heap end" in header and "Python heap peak" in header
    assert row(table, "boom")[1] == "**FAILED**: ValueError: bad batch"
    assert row(table, "fine")[1] == "ok"
    fine = next(s for s in built["failed"][0].stages if s.name == "fine")
    assert row(table, "fine")[header.index("Python heap end")] == units.size(fine.py_heap.end)


def test_cuda_columns_when_the_record_has_cuda_readings(built):
    """A CUDA run's stage fields (the probe's format), on a copy of a real CPU record."""
    record = copy.deepcopy(built["failed"][0])
    for index, stage in enumerate(record.stages):
        stage.cuda = CudaReadings(allocated_start=0, allocated_end=(index + 1) * 2**30,
                                  reserved_end=(index + 2) * 2**30, peak_allocated=(index + 3) * 2**30)
    table = table_after(render(run_report(record)), "## Stages")
    header = table[0]
    assert header[-3:] == ["CUDA allocated", "CUDA reserved", "CUDA peak allocated"]
    assert row(table, "boom")[-3:] == [units.size(2 * 2**30), units.size(3 * 2**30), units.size(4 * 2**30)]
    assert "CUDA allocated" not in table_after(render(run_report(built["failed"][0])), "## Stages")[0]


# -- components -----------------------------------------------------------------------------

def test_component_table_sums(reports, built):
    record = built["pattern"][0]
    stage = peak_stage(record)
    a = attribute(stage)
    assert a.census == sum(c.bytes for c in stage.components.values()) == sum(r.bytes for r in a.rows)
    assert sum(total for _, total in a.categories) == a.census
    assert a.beyond_census == stage.rss.end - a.census
    assert a.unseen == stage.live_tensors.end - a.census
    assert a.unseen + a.beyond_live == a.beyond_census
    assert sum(r.share for r in a.rows) + a.share(a.beyond_census) == pytest.approx(1.0)

    text = text_of(reports, "pattern")  # the answer table: categories, their components, the rest of the peak
    table = table_after(text, "## What was alive at the peak")
    assert table[0][:3] == ["category / component", "bytes here", "x the weights"]
    for component in a.rows:
        assert row(table, f"`{component.name}`")[1:3] == [units.size(component.bytes),
                                                          units.ratio(component.bytes, a.weights)]
    for category, total in a.categories:
        assert row(table, f"**{category}**")[1] == f"**{units.size(total)}**"
    assert row(table, "**gradients**")[2] == "1.00x"  # .grad is exactly the parameters
    assert row(table, BEYOND_CENSUS)[1] == units.size(a.beyond_census)
    if a.unseen:
        assert row(table, UNSEEN_TENSORS)[1] == units.size(a.unseen)
    assert row(table, "risen inside the stage")[1] == units.size(stage.rss.peak - stage.rss.end)
    assert row(table, "**peak RSS**")[1:3] == [f"**{units.size(stage.rss.peak)}**",
                                               f"**{units.ratio(stage.rss.peak, a.weights)}**"]
    # the rows add up to the peak: categories, the rest of RSS at the end, what rose inside
    assert sum(t for _, t in a.categories) + a.beyond_census + stage.rss.peak - stage.rss.end == stage.rss.peak


def test_beyond_census_line_is_never_hidden(reports, built):
    for name in ("pattern", "clean"):
        text = text_of(reports, name)
        record = built[name][0]
        holder, last = peak_stage(record), final_stage(record)
        if "### What was alive at the run's peak" in text:  # between stages: the peak stage's census is a detail
            section = text[text.index(f"### Components at the peak stage: `{holder.path}`"):]
            assert row(tables(section)[0], BEYOND_CENSUS)[2] == units.size(attribute(holder).beyond_census)
        else:
            answer = table_after(text, "## What was alive at the peak")
            assert row(answer, BEYOND_CENSUS)[1] == units.size(attribute(holder).beyond_census)
        if last is not holder:  # the last stage's census is in the details
            section = text[text.index(f"### Components at the last stage: `{last.path}`"):]
            assert row(tables(section)[0], BEYOND_CENSUS)[2] == units.size(attribute(last).beyond_census)
    clean = text_of(reports, "clean")  # peak and last stage differ: both tables
    assert "## What was alive at the peak" in clean and "### Components at the last stage" in clean
    assert "No tensor census in this record" in text_of(reports, "failed")


def test_the_tensor_that_made_the_peak_is_shown(reports, built):
    """clean: `release` frees at its start what `hold` built; whichever stage holds the peak,
    a component table shows `work.big` at the peak."""
    record = built["clean"][0]
    holder = peak_stage(record)
    assert holder.path in ("hold", "release")
    text = text_of(reports, "clean")
    title, column = (("## What was alive at the peak", 1) if holder.path == "hold"
                     else ("### Components just before the peak stage: `hold`", 2))
    if holder.path == "hold" and "### What was alive at the run's peak" in text:  # the run's peak between stages
        title, column = "### Components at the peak stage: `hold`", 2
    if holder.path == "release":
        assert census_before(record, holder).path == "hold" and peak_at_start(holder)
    hold = next(s for s in record.stages if s.path == "hold")
    big = hold.components["work.big"].bytes
    assert row(table_after(text, title), "`work.big`")[column] == units.size(big)
    assert not peak_at_start(peak_stage(built["pattern"][0]))  # a transient inside: no extra table
    assert "just before the peak stage" not in text_of(reports, "pattern")


def test_projection_columns_scaled_and_traced_side_by_side(built, tmp_path):
    from auditor.analysis.projection.scaled import project
    from auditor.analysis.projection.traced import project_traced
    record = copy.deepcopy(built["pattern"][0])
    record.annotations["workload"] = {"architecture": "tinystories-33m", "overrides": TINY_GPT_NEO, "tokens": 32}
    scaled = project(record, "gpt-neo-125m")
    traced_run = built["pattern"][0].to_json()  # stands in for a traced run of the target (its JSON)
    traced_run["workload"] = {"architecture": "gpt-neo-125m"}
    traced = project_traced(record, RunRecord.from_json(traced_run))
    record.annotations["projections"] = [traced, scaled]
    text = render(run_report(record))
    stage = peak_stage(record).path
    table = table_after(text, "## What was alive at the peak")  # one table, each method a column
    assert table[0][3].startswith("at gpt-neo-125m (scaled") and table[0][4] == "at gpt-neo-125m (traced)"
    projected = next(s for s in scaled["stages"] if s["path"] == stage)
    # the stand-in traced run is the audited size, not the target's: the scaled figures differ from
    # it beyond the validation matrix's targets, so the scaled column is withheld, said in its peak row
    for name in projected["components"]:
        assert row(table, f"`{name}`")[3] == "-"
        assert row(table, f"`{name}`")[4] == units.size(stage_bytes(RunRecord.from_json(traced_run), stage, name))
    assert row(table, "**peak RSS**")[3].startswith("not shown: differs from the traced projection by +")
    if attribute(peak_stage(record)).unseen:
        assert row(table, UNSEEN_TENSORS)[3] == "-"
    assert text.count("### Projection to gpt-neo-125m") == 1  # not one copy of the tables a method
    summary = table_after(text, "## Summary")
    assert row(summary, "projected (scaled: gpt-neo-125m)")[1].startswith(
        "not shown: differs from the traced projection")
    traced_peak = traced["peak"]
    assert traced_peak is not None and traced_peak["rss"] is not None
    assert units.size(traced_peak["rss"]) in row(summary, "projected (traced: gpt-neo-125m)")[1]
    assert "projections | none" not in text


def test_an_uncalibrated_scaled_projection_says_so(built):
    """Without calibration runs the scaled figures rest on assumed drivers: the summary and
    every saving at the target say so; fitted on calibration runs, they do not."""
    from auditor.analysis.projection.scaled import project
    from auditor.analysis.projection.standing import UNCALIBRATED
    from auditor.analysis.projection.views import UNCHECKED
    record = copy.deepcopy(built["pattern"][0])
    record.annotations["workload"] = {"architecture": "tinystories-33m", "overrides": TINY_GPT_NEO, "tokens": 32}
    record.annotations["projections"] = [project(record, "gpt-neo-125m", calibration=[])]
    text = render(run_report(record))
    assert UNCALIBRATED in row(table_after(text, "## Summary"), "projected (scaled: gpt-neo-125m)")[1]
    assert f"at gpt-neo-125m (scaled, uncalibrated, {UNCHECKED})" in text and "(scaled)" not in text
    calibration = built["pattern"][0].to_json()  # stands in for a calibration run (its JSON)
    calibration["workload"] = {"architecture": "tinystories-33m", "tokens": 32,
                               "overrides": {**TINY_GPT_NEO, "layers": 2 * TINY_GPT_NEO["layers"]}}
    record.annotations["projections"] = [project(record, "gpt-neo-125m", calibration=[calibration])]
    calibrated = render(run_report(record))
    assert UNCALIBRATED not in calibrated and "(scaled, uncalibrated)" not in calibrated


def stage_bytes(record: RunRecord, path: str, name: str) -> int:
    return next(s for s in record.stages if s.path == path).components[name].bytes


# -- timeline ----------------------------------------------------------------------------

def test_timeline_png_is_written_and_embedded(reports, built):
    for name in built:
        report = reports[name]
        link = re.search(r"!\[RSS over time\]\(([^)]+)\)", report.read_text()).group(1)
        png = (report.parent / link).read_bytes()
        assert png.startswith(PNG_SIGNATURE)
        width, height = struct.unpack(">II", png[16:24])  # IHDR
        assert width > 600 and height > 300


def test_timeline_places_each_peak_inside_its_stage(built):
    record = built["pattern"][0]
    line = timeline(record)
    stages = {s.path: s for s in record.stages}
    assert line.peaks, "the spike stage's peak is above both its boundaries"
    for peak in line.peaks:
        stage = stages[peak.stage]
        assert stage.start_s <= peak.t <= stage.end_s
        assert peak.value == stage.rss.peak
    assert line.run_peak.stage == record.peak.stage and line.run_peak.value == record.peak.rss
    assert [s.label for s in line.spans] == ["save", "gradients", "spike"]
    assert [t for t, _ in line.rss] == sorted(t for t, _ in line.rss)
    assert max(v for _, v in line.live_tensors) == max(s.live_tensors.peak for s in record.stages)
    assert [m[1] for m in line.marks] == ["saved"]


# -- allocation sites, findings, minimum, environment ---------------------------------------

def test_allocation_sites_and_flamegraph_link(reports, built):
    if "traced" not in built:
        pytest.skip("memray is not installed")
    record, folder = built["traced"]
    text = text_of(reports, "traced")
    table = table_after(text, "## Top allocation sites at the peak")
    top = record.memray.sites[0]
    first = table[2]
    assert first[0] == "1" and "test_findings.py:" in first[1] and first[2] == "`_make_spike`"
    assert first[3] == units.size(top.bytes) and first[4] == f"{top.allocations:,}"
    assert first[5].startswith("_make_spike (")
    assert top.location not in text  # no machine folder anywhere: table, stacks, findings' evidence
    link = re.search(r"\[memray-flamegraph\.html\]\(([^)]+)\)", text).group(1)
    assert not os.path.isabs(link)
    assert (reports["traced"].parent / link).resolve() == (folder / "memray-flamegraph.html").resolve()
    assert "No memray trace: memray was off for this run" in text_of(reports, "pattern")


def test_a_flamegraph_git_ignores_is_named_not_linked(built, tmp_path):
    """A committed report must not link a file git keeps out of the repository."""
    if "traced" not in built:
        pytest.skip("memray is not installed")
    import shutil
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("runs/**/memray-flamegraph.html\n")
    folder = tmp_path / "runs" / "r"
    shutil.copytree(built["traced"][1], folder)
    out = tmp_path / "reports" / "r.md"
    out.parent.mkdir()
    assert main(["report", str(folder), "-o", str(out)]) == 0
    text = out.read_text()
    assert "](../runs/r/memray-flamegraph.html)" not in text
    assert ("Flamegraph: `memray-flamegraph.html` in the run folder `../runs/r`, where the command wrote it; "
            "git ignores it") in text
    (tmp_path / ".gitignore").write_text("")  # not ignored: linked
    assert main(["report", str(folder), "-o", str(out)]) == 0
    assert "[memray-flamegraph.html](../runs/r/memray-flamegraph.html)" in out.read_text()


def test_findings_section_shows_every_finding_and_every_rule(reports, built):
    for name, (record, _) in built.items():
        text = text_of(reports, name)
        section = text[text.index("## Findings"):text.index("## Environment")]
        joined = re.sub(r"\n {2,}(?!- )", " ", section)  # long lines are wrapped
        for finding in findings(record):
            assert f"- **{finding.severity}** ({finding.rule}): {finding.statement}" in joined
        rules = tables(section)[0]
        assert [r[0] for r in rules[2:]] == [f"`{rule.id}`" for rule in RULES]
        for outcome in evaluate(record):
            result = row(rules, f"`{outcome.rule.id}`")[3]
            if outcome.not_checked:
                assert result.startswith("not checked: ")
            else:
                assert result == (f"fired ({len(outcome.findings)})" if outcome.findings else "silent")


def test_theoretical_minimum_and_gap(built):
    record = copy.deepcopy(built["pattern"][0])
    assert "No minimum was declared for this run" in render(run_report(record))
    weights = run_weights(record)
    record.annotations["minimum"] = {"items": [{"name": "weights", "bytes": weights, "why": "the model itself"},
                                               {"name": "one gradient", "bytes": weights, "why": "one backward"}],
                                     "total": 2 * weights, "note": "streaming: nothing else need be resident"}
    text = render(run_report(record))
    section = text[text.index("## Theoretical minimum and gap"):]
    items, gaps = tables(section)[:2]
    assert row(items, "one gradient")[1:] == [units.size(weights), "one backward"]
    assert row(items, "total")[1] == f"**{units.size(2 * weights)}**"
    assert "streaming: nothing else need be resident" in section
    peak = record.peak.rss
    assert row(gaps, "peak RSS")[1:] == [units.size(peak), units.signed_size(peak - 2 * weights),
                                         units.ratio(peak, 2 * weights)]
    live = max(s.live_tensors.peak for s in record.stages)
    assert row(gaps, "peak live tensors")[2] == units.signed_size(live - 2 * weights)


def test_environment(reports, built):
    record = built["pattern"][0]
    section = text_of(reports, "pattern").split("## Environment", 1)[1]
    settings, probes = tables(section)[:2]
    env = record.environment
    assert row(settings, "python")[1] == env.python and row(settings, "torch")[1] == env.torch
    assert row(settings, "threads")[1] == str(env.threads)
    # the command as run, without the machine's folders (auditor.analysis.run.source_paths)
    shown = shown_command(record.command, code_root(record))
    assert row(settings, "command")[1] == f"`{shown}`" and not shown.startswith("/")
    assert row(settings, "started at")[1] == record.started_at
    assert row(probes, "census")[1] == "on"
    cuda = record.probes["cuda"]
    assert row(probes, "cuda")[1:] == [cuda.state, cuda.reason or cuda.method]
    assert row(probes, "memray")[1] == "off"
    assert "Warnings: none." in section
    assert row(tables(text_of(reports, "failed").split("## Environment", 1)[1])[1], "live_tensors")[1] == "off"


# -- bad input ----------------------------------------------------------------------------



@pytest.mark.parametrize("case, expected", [
    ("missing", "no run record at"),
    ("truncated", "is truncated"),
    ("not json", "not valid JSON"),
    ("empty", "is empty"),
    ("unknown schema", "unknown schema 'auditor.run/99'"),
    ("events only", "events.jsonl': the event log does not begin with a run_started event"),
])
def test_bad_records_are_one_line_and_exit_2(built, tmp_path, capsys, case, expected):
    good = (built["failed"][1] / "run.json").read_text()
    target = tmp_path / "run.json"
    if case == "truncated":
        target.write_text(good[: good.index("\n", len(good) // 2)])  # cut as a killed writer would
    elif case == "not json":
        target.write_text("schema: auditor.run/1\n")
    elif case == "empty":
        target.write_text("")
    elif case == "unknown schema":
        target.write_text(json.dumps({**json.loads(good), "schema": "auditor.run/99"}))
    elif case == "events only":
        (tmp_path / "events.jsonl").write_text("{}\n")
        target = tmp_path
    assert main(["report", str(target), "-o", str(tmp_path / "out.md")]) == 2
    assert expected in one_error_line(capsys)
    assert not (tmp_path / "out.md").exists()


@pytest.mark.parametrize("case", ["folder", "missing folder", "parent is a file", "unwritable"])
def test_unwritable_output_is_one_line_and_exit_2(built, tmp_path, capsys, case):
    run = built["failed"][1]
    (tmp_path / "file").write_text("x")
    out = {"folder": tmp_path, "missing folder": tmp_path / "nope" / "report.md",
           "parent is a file": tmp_path / "file" / "report.md",
           "unwritable": Path("/proc/auditor-report.md")}[case]
    assert main(["report", str(run), "-o", str(out)]) == 2
    assert "auditor: error: " in one_error_line(capsys)
    assert not list(tmp_path.glob("*.md")) and not list(tmp_path.glob("*.png"))
    assert not (tmp_path.parent / f"{tmp_path.name}-timeline.png").exists()  # nothing half-written


def test_names_with_markdown_characters_keep_tables_valid(built):
    record = copy.deepcopy(built["pattern"][0])
    odd = "load | <b>*x*</b> [y]"
    for stage in record.stages:
        if stage.path == "save":
            stage.name = stage.path = odd
            stage.components["pruner.saved|copy"] = stage.components.pop("pruner.saved")
    text = render(run_report(record))
    for table in tables(text):
        assert all(len(r) == len(table[0]) for r in table)
    assert "load \\| &lt;b&gt;\\*x\\*&lt;/b&gt; \\[y\\]" in text


def test_report_without_arguments_is_a_usage_error(capsys):
    assert main(["report"]) == 2
    assert "RUN" in one_error_line(capsys)
