"""The report for code this project did not write: a per-layer pruner staged from outside.

Records built by hand (every field the run-record contract adds, with known answers) and one
real audit of a small per-layer loop written here (a Hessian per linear, made in a staged
method and freed later; a temporary made in the pruner's own time, between staged calls):
repeated calls folded into one row with the call holding each maximum, components followed
over the run with their exact bytes and instances, the peak located in unstaged time with
what was alive then, memray's stage and what it left out, and older records still rendering.
"""
from __future__ import annotations

import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_report import row, table_after, tables

import auditor
from auditor.analysis.run import stage_groups, unstaged
from auditor.analysis.run.component_history import fold_component, history, instance_label
from auditor.cli import main
from auditor.facts import units
from auditor.record.schema import Call, Memray, PeakPlace, Readings, RunRecord, Stage
from auditor.renderers.markdown import render
from auditor.report_models.run import run_report

MiB = 2**20
WEIGHTS = 64 * MiB
H_BYTES = 4 * MiB                 # one Hessian, cols x cols fp32 with cols = 1024
INPS = 32 * MiB                   # the calibration buffer
LINEARS = ("model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj")
CALLS_PER_LINEAR = 3
BASE = 500 * MiB


# -- a record by hand ------------------------------------------------------------------------

def _stage(id_, path, start, end, rss, live=None, components=None, call=None, status="ok"):
    name = path.rpartition("/")[2]
    entry = {"id": id_, "name": name, "path": path, "parent": path.rpartition("/")[0] or None,
             "status": status, "start_s": start, "end_s": end,
             "rss": dict(zip(("start", "end", "peak"), rss, strict=False)), "py_heap": None, "cuda": None,
             "components": components, "thread": "MainThread", "error": None}
    if live is not None:
        entry["live_tensors"] = live
    if call is not None:
        entry["call"] = call
    return entry


def _at_peak(rows):
    return {"bytes": sum(r["bytes"] for r in rows), "rows": rows, "rows_left_out": 0, "bytes_left_out": 0}


def _row(owner, category, created_in, op, size, kept=True, tensors=1):
    return {"owner": owner, "category": category, "created_in": created_in, "op": op,
            "bytes": size, "tensors": tensors, "alive_at_end": kept}


def sparsegpt_record() -> dict:
    """`prune_fn` (staged) makes the calibration buffer, then per linear a `SparseGPT` helper
    whose `add_batch` (staged) is called 3 times; the run's peak falls between the 2nd and the
    3rd call on the second linear, in prune_fn's own time. Call 5 has the highest RSS peak,
    call 2 the highest live-tensor peak."""
    weights = {"model.parameters": {"category": "weights", "bytes": WEIGHTS}}
    stages = [_stage(1, "load", 0.0, 1.0, (BASE, BASE + WEIGHTS, BASE + WEIGHTS),
                     components=dict(weights))]
    stages.append(_stage(2, "prune_fn", 1.0, 9.0, (BASE + WEIGHTS, BASE + WEIGHTS + INPS, BASE + 400 * MiB),
                         call={"target": "prune_fn", "index": 1, "label": "model"},
                         components={**weights, "unowned": {"category": "activations and temporaries", "bytes": INPS}}))
    t, index, id_ = 1.5, 0, 3
    for linear_number, linear in enumerate(LINEARS):
        for _ in range(CALLS_PER_LINEAR):
            index += 1
            rss_now = BASE + WEIGHTS + INPS + H_BYTES
            peak = rss_now + (50 * MiB if index == 5 else MiB * index)
            live_peak = WEIGHTS + INPS + H_BYTES + (20 * MiB if index == 2 else MiB)
            live = {"start": WEIGHTS + INPS + H_BYTES, "end": WEIGHTS + INPS + H_BYTES, "peak": live_peak,
                    "at_peak": _at_peak([
                        _row("model.parameters", "weights", None, None, WEIGHTS, tensors=4),
                        _row(None, "activations and temporaries", "prune_fn", "aten::zeros", INPS),
                        _row(f"SparseGPT[{linear}].H", "other", stage_path(linear_number * CALLS_PER_LINEAR + 1),
                             "aten::zeros", H_BYTES),
                        _row(None, "activations and temporaries", stage_path(index), "aten::mm",
                             live_peak - WEIGHTS - INPS - H_BYTES, kept=False)])}
            components = {**weights, f"SparseGPT[{linear}].H": {"category": "other", "bytes": H_BYTES},
                          "unowned": {"category": "activations and temporaries", "bytes": INPS}}
            stages.append(_stage(id_, stage_path(index), t, t + 0.25, (rss_now, rss_now, peak), live=live,
                                 components=components,
                                 call={"target": "SparseGPT.add_batch", "index": index, "label": linear}))
            t += 1.0
            id_ += 1
    peak_rss = BASE + 400 * MiB
    gap = {"id": 7, "parent": "prune_fn", "parent_id": 2, "after": stage_path(5), "before": stage_path(6),
           "thread": "MainThread", "start_s": 5.75, "end_s": 6.5,
           "rss": {"start": BASE + WEIGHTS + INPS + H_BYTES, "end": BASE + WEIGHTS + INPS + H_BYTES,
                   "peak": peak_rss},
           "py_heap": None, "cuda": None,
           "live_tensors": {"start": WEIGHTS + INPS + H_BYTES, "end": WEIGHTS + INPS + H_BYTES,
                            "peak": WEIGHTS + INPS + H_BYTES + 256 * MiB,
                            "at_peak": _at_peak([
                                _row(None, "activations and temporaries", "prune_fn", "aten::cat", 256 * MiB,
                                     kept=False),
                                _row("model.parameters", "weights", None, None, WEIGHTS, tensors=4),
                                _row(None, "activations and temporaries", "prune_fn", "aten::zeros", INPS),
                                _row(f"SparseGPT[{LINEARS[1]}].H", "other", stage_path(4), "aten::zeros",
                                     H_BYTES)])}}
    quiet = {"id": 8, "parent": "prune_fn", "parent_id": 2, "after": stage_path(1), "before": stage_path(2),
             "thread": "MainThread", "start_s": 1.75, "end_s": 2.0,
             "rss": {"start": BASE + WEIGHTS + INPS, "end": BASE + WEIGHTS + INPS, "peak": BASE + WEIGHTS + INPS},
             "py_heap": None, "cuda": None, "live_tensors": None}
    return {"schema": "auditor.run/1", "name": "sparsegpt-by-hand", "command": "auditor run prune.py",
            "started_at": "2026-01-01T00:00:00+00:00", "device": "cpu",
            "environment": {"python": "3.11", "torch": "2", "transformers": None, "threads": 2},
            "process": {"rss_at_start": BASE, "rss_at_end": BASE + WEIGHTS},
            "probes": {"census": {"state": "on"}, "live_tensors": {"state": "on"}},
            "stages": stages, "unstaged": [quiet, gap], "marks": [], "warnings": [], "duration_s": 10.0,
            "peak": {"rss": peak_rss, "stage": "prune_fn", "stage_id": 2,
                     "where": {"kind": "unstaged", "parent": "prune_fn", "after": stage_path(5),
                               "before": stage_path(6)}},
            "exit": {"status": "ok"}}


def stage_path(index: int) -> str:
    return "prune_fn/SparseGPT.add_batch" + (f"#{index}" if index > 1 else "")


@pytest.fixture
def by_hand() -> RunRecord:
    return RunRecord.from_json(sparsegpt_record(), "sparsegpt_record()")


# -- stages: repeated calls folded ----------------------------------------------------------

def test_repeated_calls_fold_into_one_row_with_the_call_holding_each_maximum(by_hand):
    rows = stage_groups.stage_rows(by_hand)
    folded = next(r for r in rows if r.kind == "folded")
    assert folded.key == "prune_fn/SparseGPT.add_batch" and folded.depth == 1
    assert folded.count == len(LINEARS) * CALLS_PER_LINEAR == 6
    assert folded.duration == pytest.approx(6 * 0.25)
    peak, at = folded.highest("rss")
    assert at.path == stage_path(5) and peak == BASE + WEIGHTS + INPS + H_BYTES + 50 * MiB
    live, live_at = folded.highest("live_tensors")
    assert live_at.path == stage_path(2) and live == WEIGHTS + INPS + H_BYTES + 20 * MiB
    assert stage_groups.call_name(at) == f"{LINEARS[1]} (call 5)"
    assert [r.label for r in rows if r.kind == "stage"] == ["load", "prune_fn"]  # single calls stay plain

    table = table_after(render(run_report(by_hand)), "## Stages")
    header = table[0]
    cells = row(table, "SparseGPT.add_batch × 6")
    assert cells[0] == "&emsp;SparseGPT.add_batch × 6"
    assert cells[header.index("duration")] == units.seconds(1.5)
    assert cells[header.index("peak inside")] == units.size(peak)
    assert cells[header.index("live tensors peak")] == units.size(live)
    assert cells[-1] == f"`{LINEARS[1]} (call 5)`; `{LINEARS[0]} (call 2)` ({units.size(live)})"
    assert row(table, "load")[0] == "load" and row(table, "prune_fn")[1] == "ok"


def test_fold_key_is_the_target_else_the_name_without_its_call_number():
    assert stage_groups.fold_key(_named("SparseGPT.add_batch#113", Call(target="mod.add_batch"))) == "mod.add_batch"
    assert stage_groups.fold_key(_named("step#12")) == "step"
    assert stage_groups.fold_key(_named("step 12")) == "step 12"
    assert stage_groups.call_name(_named("f#3", Call(target="f", index=3, label=None))) == "f#3"


def _named(name: str, call: Call | None = None) -> Stage:
    return Stage(name=name, path=name, parent=None, status="ok", start_s=0.0, end_s=1.0,
                 rss=Readings(start=0, end=0, peak=0), call=call)


def test_calls_nested_in_repeated_calls_fold_under_the_folded_parent():
    stages, id_ = [], 0
    for layer in range(1, 4):
        id_ += 1
        layer_path = "prune_layer" + (f"#{layer}" if layer > 1 else "")
        stages.append(_stage(id_, layer_path, layer * 10.0, layer * 10.0 + 5, (100, 100, 100 + layer)))
        for call in range(1, 3):
            id_ += 1
            index = (layer - 1) * 2 + call
            stages.append(_stage(id_, f"{layer_path}/add_batch" + (f"#{index}" if index > 1 else ""),
                                 layer * 10.0 + call, layer * 10.0 + call + 0.5, (100, 100, 100 + index)))
    rows = stage_groups.stage_rows(RunRecord.from_json({**sparsegpt_record(), "stages": stages, "unstaged": [],
                                                        "peak": {"rss": None}}))
    assert [(r.label, r.count, r.depth) for r in rows] == [("prune_layer", 3, 0), ("add_batch", 6, 1)]
    assert rows[1].highest("rss")[1].path == "prune_layer#3/add_batch#6"


# -- unstaged time ----------------------------------------------------------------------------

def test_the_peak_between_two_calls_is_located_with_what_was_alive(by_hand):
    place = unstaged.peak_place(by_hand)
    assert place.kind == "unstaged" and place.interval.id == 7
    assert place.phrase == f"between `{stage_path(5)}` and `{stage_path(6)}` (inside `prune_fn`)"
    text = render(run_report(by_hand))
    assert "outside every stage" not in text
    summary = table_after(text, "## Summary")
    assert row(summary, "peak RSS")[1] == (f"**{units.size(BASE + 400 * MiB)}** between `{stage_path(5)}` "
                                           f"and `{stage_path(6)}` (inside `prune_fn`)")
    assert row(summary, "unstaged time")[1].startswith(
        f"{units.seconds(1.0)} in 2 intervals no stage covers (10.0% of the run)")
    stages = table_after(text, "## Stages")
    bold = [r for r in stages if r[0].startswith("&emsp;**")]
    assert len(bold) == 1 and "(unstaged) between" in bold[0][0]  # the row holding the peak
    assert not any("`" + stage_path(1) + "` and" in r[0] for r in stages)  # a quiet interval: no row
    assert "Unstaged time in all: 1.00 s in 2 intervals, 10.0% of the run" in text
    section = text[text.index("### What was alive at the run's peak, between"):]
    alive = tables(section)[0]
    assert alive[2][:4] == ["-", "activations and temporaries", "`prune_fn`", "`aten::cat`"]
    assert alive[2][5] == units.size(256 * MiB) and alive[2][7] == "no, freed before it"
    assert row(alive, f"`SparseGPT[{LINEARS[1]}].H`")[5] == units.size(H_BYTES)


def test_unstaged_phrases_for_every_place():
    def describe(parent, after, before):
        return unstaged.describe(PeakPlace(kind="unstaged", parent=parent, after=after, before=before))
    assert describe(None, None, "a") == "before the first stage (`a`)"
    assert describe(None, "z", None) == "after the last stage (`z`)"
    assert describe(None, "a", "b") == "between `a` and `b`"
    assert describe("p", None, "p/a") == "inside `p` before its first child `p/a`"
    assert describe("p", "p/z", None) == "inside `p` after its last child `p/z`"


def test_without_a_live_composition_the_census_before_the_interval_stands_in(by_hand):
    by_hand.unstaged[1].live_tensors.at_peak = None
    text = render(run_report(by_hand))
    section = text[text.index("### What was alive at the run's peak"):]
    assert f"the census at the end of `{stage_path(5)}`, the last before it" in section
    assert row(tables(section)[0], f"`SparseGPT[{LINEARS[1]}].H`")[2] == units.size(H_BYTES)


# -- components over the run -----------------------------------------------------------------

def test_components_are_folded_over_instances_with_exact_bytes(by_hand):
    assert fold_component(f"SparseGPT[{LINEARS[0]}].H") == "SparseGPT.H"
    assert fold_component("SparseGPT#2.H") == "SparseGPT.H"
    assert fold_component("pruner.saved[0].x#2") == "pruner.saved[0].x#2"  # only the root part folds
    assert instance_label(f"SparseGPT[{LINEARS[0]}].H") == LINEARS[0]
    items = {h.name: h for h in history(by_hand)}
    h = items["SparseGPT.H"]
    assert [i.name for i in h.instances] == [f"SparseGPT[{linear}].H" for linear in LINEARS]
    assert h.sizes == [(H_BYTES, 2)] and h.most_at_once == H_BYTES and h.most_instances_at_once == 1
    assert (h.first_stage, h.last_stage) == (stage_path(1), stage_path(6))
    assert (h.instances[1].first_stage, h.instances[1].last_stage) == (stage_path(4), stage_path(6))
    assert items["model.parameters"].most_at_once == WEIGHTS
    assert items["unowned"].first_stage == "prune_fn/SparseGPT.add_batch"

    text = render(run_report(by_hand), components_plot="x-components.png")
    over = table_after(text, "### Over the run")
    assert row(over, "`SparseGPT.H`")[1:6] == [
        "other", "2", f"{units.size(H_BYTES)} ({H_BYTES:,} B) × 2",
        f"{units.size(H_BYTES)} (1 instance) at the end of `{stage_path(1)}`", f"`{stage_path(1)}`"]
    details = text[text.index("<details><summary>Each instance (4)</summary>"):text.index("</details>")]
    [instance] = [r for r in tables(details)[0] if r[1] == f"`SparseGPT[{LINEARS[1]}].H`"]
    assert instance == ["`SparseGPT.H`", f"`SparseGPT[{LINEARS[1]}].H`", f"{H_BYTES:,}", f"`{stage_path(4)}`",
                        f"`{stage_path(6)}`"]
    assert "![components at each stage end](x-components.png)" in text


def test_live_tensor_highs_are_shown_for_the_top_stages(by_hand):
    text = render(run_report(by_hand))
    heading = f"### Alive at the live-tensor high of `{stage_path(2)}` ({LINEARS[0]} (call 2)), a top live-tensor peak"
    alive = table_after(text, heading)
    assert row(alive, "`model.parameters`")[2] == "before the audit or unstaged"
    temporaries = [r for r in alive if r[3] == "`aten::mm`"]
    assert temporaries[0][5] == units.size(20 * MiB) and temporaries[0][7] == "no, freed before it"


def test_write_report_writes_both_pngs(by_hand, tmp_path):
    from auditor.renderers.markdown import write
    out = write(run_report(by_hand), tmp_path / "r.md")
    for png in ("r-timeline.png", "r-components.png"):
        data = (tmp_path / png).read_bytes()
        assert data.startswith(b"\x89PNG") and struct.unpack(">II", data[16:24])[0] > 600
    assert "](r-components.png)" in out.read_text()


# -- memray and older records -----------------------------------------------------------------

def test_memray_section_names_its_own_stage_and_basis(by_hand):
    by_hand.memray = Memray(peak_memory=300 * MiB, total_allocations=10, stage=stage_path(5),
                            stage_basis="time of memray's high-water mark, from its ~10 ms memory snapshots",
                            at_s=6.1, auditor_bytes=3 * MiB, sites=[])
    text = render(run_report(by_hand))
    section = text[text.index("## Top allocation sites"):text.index("## Findings")]
    assert (f"(in stage `{stage_path(5)}`, about 6.10 s into the audit; stage found by: time of "
            "memray's high-water mark, from its ~10 ms memory snapshots)") in section
    assert f"({units.size(3 * MiB)} allocated by the auditor itself and alive then are left out.)" in section


def test_an_older_record_without_the_new_fields_still_renders():
    old = sparsegpt_record()  # as its JSON: the fields are absent, not null
    del old["unstaged"], old["peak"]["where"]
    for stage in old["stages"]:
        stage.pop("call", None)
        (stage.get("live_tensors") or {}).pop("at_peak", None)
    text = render(run_report(RunRecord.from_json(old)))
    assert "in stage `prune_fn`" in table_after(text, "## Summary")[3][1]
    assert "unstaged time" not in text and "Alive at the live-tensor high" not in text
    assert row(table_after(text, "## Stages"), "SparseGPT.add_batch × 6")  # folded by name
    old["peak"]["stage"] = old["peak"]["stage_id"] = None
    text = render(run_report(RunRecord.from_json(old)))
    assert "(outside every stage: this record does not locate it further)" in text


# -- a real run: a per-layer pruner written here, staged from outside --------------------------

HIDDEN = 128
SAMPLES = 8
SPIKE = 25 * 10**6  # floats: 100 MB made and freed in the pruner's own time


class HessianPruner:
    """One per linear, as a SparseGPT-style helper: its Hessian is made by the first
    `add_batch` (staged) and freed by `prune` (not staged)."""

    def __init__(self, layer):
        self.layer = layer
        self.H = None

    def add_batch(self, x):
        if self.H is None:
            self.H = torch.zeros(self.layer.in_features, self.layer.in_features)
        self.H += x.T @ x

    def prune(self):
        weight = self.layer.weight.data
        weight[weight.abs() < 1e-3] = 0
        self.H = None


def prune_layers(model, samples):
    inps = torch.stack(samples)
    for layer in model:
        helper = HessianPruner(layer)
        for x in inps:
            helper.add_batch(x)
        helper.prune()
        with torch.no_grad():
            inps = layer(inps)
    spike = torch.ones(SPIKE)  # the run's peak, after the last staged call
    float(spike[-1])
    del spike


def audit_real_run(folder: str) -> None:
    """The audited run itself; in a fresh process (see real_run), so that the spike shows in RSS
    (in the suite's own process, freed memory from earlier tests can absorb it)."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(3)])
    samples = [torch.randn(4, HIDDEN) for _ in range(SAMPLES)]
    with auditor.Audit(folder, name="per-layer", census=True, live_tensors=True,
                       stage_targets=[f"{__name__}:prune_layers", f"{__name__}:HessianPruner.add_batch"]):
        auditor.track("model", model)
        prune_layers(model, samples)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("any-algorithm") / "run"
    here = Path(__file__).resolve()
    code = (f"import sys; sys.path.insert(0, {str(here.parent)!r}); import {here.stem} as m; "
            f"m.audit_real_run({str(folder)!r})")
    done = subprocess.run([sys.executable, "-c", code], cwd=here.parents[1], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    record = auditor.load(folder)
    assert record.exit.status == "ok"
    return record, folder


def test_real_run_folds_calls_and_follows_each_hessian(real_run):
    record, _ = real_run
    rows = stage_groups.stage_rows(record)
    folded = next(r for r in rows if r.kind == "folded")
    assert folded.key == "prune_layers/HessianPruner.add_batch" and folded.count == 3 * SAMPLES
    items = {h.name: h for h in history(record)}
    h = items["HessianPruner.H"]
    assert len(h.instances) == 3 and h.sizes == [(HIDDEN * HIDDEN * 4, 3)]
    assert h.most_at_once == HIDDEN * HIDDEN * 4 and h.most_instances_at_once == 1  # freed per layer
    assert h.first_stage == "prune_layers/HessianPruner.add_batch"
    assert h.instances[2].last_stage == f"prune_layers/HessianPruner.add_batch#{3 * SAMPLES}"
    assert "HessianPruner.H" not in {n for n in (record.stages[0].components or {})}  # gone at the end


def test_real_run_report_locates_the_unstaged_peak(real_run, tmp_path, capsys):
    record, folder = real_run
    last_call = f"prune_layers/HessianPruner.add_batch#{3 * SAMPLES}"
    assert record.peak.where.to_json() == {"kind": "unstaged", "parent": "prune_layers", "after": last_call,
                                           "before": None}
    out = tmp_path / "report.md"
    assert main(["report", str(folder), "-o", str(out)]) == 0
    text = out.read_text()
    phrase = f"inside `prune_layers` after its last child `{last_call}`"
    assert phrase in row(table_after(text, "## Summary"), "peak RSS")[1]
    assert row(table_after(text, "## Stages"), "HessianPruner.add_batch ×")[0].endswith(f"× {3 * SAMPLES}")
    alive = table_after(text, f"### What was alive at the run's peak, {phrase}")
    # (found by what made it: tensors earlier tests left alive are listed too, as before the audit)
    spike = next(r for r in alive[2:] if r[2:4] == ["`prune_layers`", "`aten::ones`"])
    assert spike[7] == "no, freed before it"
    assert spike[5] == units.size(SPIKE * 4)
    over = table_after(text, "### Over the run")
    assert row(over, "`HessianPruner.H`")[2:4] == ["3", f"64.0 KiB ({HIDDEN * HIDDEN * 4:,} B) × 3"]
    assert (tmp_path / "report-components.png").read_bytes().startswith(b"\x89PNG")
    [spike_finding] = [line for line in text.splitlines() if "(transient-spike)" in line]
    assert re.search(r"in stage `prune_layers`, in its own time after its last child", spike_finding)
    spike_line = next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                      if "torch.ones(SPIKE)" in line)
    assert re.search(rf"`allocated at \S*test_report_any_algorithm.py:{spike_line} prune_layers`", spike_finding)
    assert "model.parameters" not in spike_finding
