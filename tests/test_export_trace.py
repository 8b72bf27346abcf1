"""`auditor export --format chrome-trace`: real runs (nested stages, a stage in a second thread,
marks, live tensors, memray, a failed stage, a SIGKILLed run) exported through the CLI, and
every event checked against the record it came from."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from conftest import one_error_line

import auditor
from auditor.cli import main
from auditor.record.schema import RunRecord
from auditor.renderers.chrome_trace import render
from auditor.report_models.trace import RunTrace, run_trace

FLOATS = 1_000_000  # 4 MB float32 tensors: clear of noise, quick to allocate
NS = 1e-3  # in microseconds: the record keeps 1 us, so ns is rounding only


def us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def export(run, out) -> dict:
    assert main(["export", str(run), "-o", str(out)]) == 0
    return json.loads(out.read_text(encoding="utf-8"))


# -- the runs ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """Nested stages, a transient spike, a second thread with its own nested stages open at
    the same time as a main-thread stage, marks in both threads, a failed stage; live tensors
    and the Python heap measured beside RSS."""
    folder = tmp_path_factory.mktemp("finished") / "run"
    opened, release = threading.Event(), threading.Event()

    def prefetch():
        with auditor.stage("prefetch"):
            auditor.mark("prefetch begun")
            with auditor.stage("decode"):
                decoded = torch.ones(FLOATS)
            opened.set()
            release.wait(10)
        del decoded

    with auditor.Audit(folder, name="export", live_tensors=True, tracemalloc=True) as audit:
        auditor.mark("begin")
        with auditor.stage("load"):
            weights = torch.ones(2 * FLOATS)
            with auditor.stage("spike"):
                float(torch.ones(5 * FLOATS)[-1])  # freed on return: the peak is inside the stage
            auditor.mark("loaded")
        worker = threading.Thread(target=prefetch, name="prefetcher")
        worker.start()
        opened.wait(10)
        with auditor.stage("compute"):  # while "prefetch" is open in the other thread
            float((weights * 2)[-1])
        release.set()
        worker.join()
        try:
            with auditor.stage("fails"):
                raise ValueError("bad shape")
        except ValueError:
            pass
    out = folder.parent / "trace.json"
    return audit.record, export(folder, out)


@pytest.fixture(scope="module")
def with_memray(tmp_path_factory):
    """memray's top sites. A run of its own: memray with the live-tensor meter in a fresh
    process costs tens of seconds (first dispatch-mode calls traced with native stacks)."""
    pytest.importorskip("memray")
    folder = tmp_path_factory.mktemp("memray") / "run"
    with auditor.Audit(folder, name="memray", memray=True) as audit, auditor.stage("outer"), auditor.stage("spike"):
        float(torch.ones(5 * FLOATS)[-1])
    if audit.record["memray"] is None:
        pytest.skip("memray absent: " + audit.record["probes"]["memray"].get("reason", ""))
    return audit.record, export(folder, folder.parent / "trace.json")


KILLED_SCRIPT = """
    import os, threading, time
    import auditor

    entered = threading.Event()

    def prefetch():
        with auditor.stage("prefetch"):
            entered.set()
            time.sleep(60)

    with auditor.stage("load"):
        data = bytearray(20_000_000)
    auditor.mark("loaded")
    threading.Thread(target=prefetch, name="prefetcher", daemon=True).start()
    entered.wait()
    with auditor.stage("train"):
        with auditor.stage("doomed"):
            os.kill(os.getpid(), 9)
"""


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A run SIGKILLed inside nested stages, with a stage open in a second thread."""
    base = tmp_path_factory.mktemp("killed")
    script, folder = base / "killed.py", base / "run"
    script.write_text(textwrap.dedent(KILLED_SCRIPT))
    result = subprocess.run([sys.executable, "-m", "auditor", "run", "--out", str(folder), str(script)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == -9, result.stderr
    assert not (folder / "run.json").exists()
    trace = export(folder, base / "trace.json")
    assert not (folder / "run.json").exists()  # exporting rebuilt the record without writing it
    return auditor.rebuild(folder, write=False), trace


@pytest.fixture(params=["finished", "with_memray", "killed"])
def exported(request):
    return request.getfixturevalue(request.param)


# -- reading a trace back ----------------------------------------------------------------

def exported_from(trace: RunTrace) -> dict:
    """The trace the renderer writes, read back."""
    return json.loads(render(trace))


def events(trace, ph) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


def thread_names(trace) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in events(trace, "M") if e["name"] == "thread_name"}


def spans(trace) -> dict[int, dict]:
    found = {e["args"]["id"]: e for e in events(trace, "X")}
    assert len(found) == len(events(trace, "X"))
    return found


def end(span) -> float:
    return span["ts"] + span["dur"]


def run_end(record) -> float:
    """The run's end: its duration, or for a killed run the last time the record holds."""
    if record.get("duration_s") is not None:
        return record["duration_s"]
    return max([t for s in record["stages"] for t in (s["start_s"], s["end_s"]) if t is not None]
               + [m["t_s"] for m in record["marks"]])


def parent_of(record, entry) -> dict:
    """The stage that was open on the same thread, with the parent's path, when `entry` began."""
    candidates = [s for s in record["stages"] if s["path"] == entry["parent"]
                  and s["thread"] == entry["thread"] and s["start_s"] <= entry["start_s"]]
    return candidates[-1]


def record_readings(record) -> list[tuple]:
    """(counter, ts, bytes) for every value the record keeps with a time."""
    points = [("RSS", 0.0, record["process"]["rss_at_start"])]
    if record.get("duration_s") is not None:
        points.append(("RSS", record["duration_s"], record["process"]["rss_at_end"]))
    for s in record["stages"]:
        for when, t in (("start", s["start_s"]), ("end", s["end_s"])):
            if t is None:
                continue
            points.append(("RSS", t, s["rss"][when]))
            if s.get("live_tensors"):
                points.append(("live tensors", t, s["live_tensors"][when]))
            if s.get("py_heap"):
                points.append(("Python heap", t, s["py_heap"][when]))
            if s.get("cuda"):
                points.append(("CUDA allocated", t, s["cuda"][f"allocated_{when}"]))
    for m in record["marks"]:
        points.append(("RSS", m["t_s"], m["rss"]))
        if m.get("py_heap") is not None:
            points.append(("Python heap", m["t_s"], m["py_heap"]))
        if m.get("cuda"):
            points.append(("CUDA allocated", m["t_s"], m["cuda"]["allocated"]))
    return sorted((name, us(t), value) for name, t, value in points)


def counter_points(trace) -> list[tuple]:
    return sorted((e["name"], e["ts"], e["args"]["bytes"]) for e in events(trace, "C"))


# -- the format --------------------------------------------------------------------------

def test_the_trace_is_trace_event_json(exported):
    record, trace = exported
    assert set(trace) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert trace["displayTimeUnit"] == "ms"
    for event in trace["traceEvents"]:
        assert event["ph"] in {"X", "C", "i", "M"}, event
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int), event
        assert isinstance(event["name"], str) and isinstance(event.get("args", {}), dict), event
        if event["ph"] != "M":
            assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0, event
        if event["ph"] == "X":
            assert event["dur"] >= 0, event
        if event["ph"] == "i":
            assert event["s"] in {"t", "p", "g"}, event
        if event["ph"] == "C":
            assert set(event["args"]) == {"bytes"} and isinstance(event["args"]["bytes"], int), event
    assert {e["pid"] for e in trace["traceEvents"]} == {record["process"]["pid"]}


def test_rendering_leaves_the_record_alone(finished):
    record, trace = finished
    typed = RunRecord.from_json(record)
    before = copy.deepcopy(typed)
    assert exported_from(run_trace(typed, source="elsewhere"))["traceEvents"] == trace["traceEvents"]
    assert typed == before and typed.to_json() == record


def test_every_thread_has_a_stable_tid_and_a_name(exported):
    record, trace = exported
    names = thread_names(trace)
    assert sorted(names.values()) == sorted({s["thread"] for s in record["stages"]})
    assert names[1] == "MainThread" and 0 not in names  # 0: the process's own events
    assert exported_from(run_trace(RunRecord.from_json(record)))["traceEvents"][:len(names) * 2 + 1] \
        == trace["traceEvents"][:len(names) * 2 + 1]


# -- stages ------------------------------------------------------------------------------

def test_every_stage_is_a_span_with_its_times_on_its_thread(exported):
    record, trace = exported
    found, names = spans(trace), thread_names(trace)
    assert len(found) == len(record["stages"])
    for entry in record["stages"]:
        span = found[entry["id"]]
        assert (span["name"], span["args"]["path"], span["args"]["status"]) == (
            entry["name"], entry["path"], entry["status"])
        assert names[span["tid"]] == entry["thread"]
        assert span["ts"] == pytest.approx(us(entry["start_s"]), abs=NS)
        finish = entry["end_s"] if entry["end_s"] is not None else run_end(record)
        assert end(span) == pytest.approx(us(finish), abs=NS)
        for key in ("rss", "live_tensors", "py_heap", "cuda", "error"):
            assert span["args"].get(key) == entry.get(key)


def test_spans_nest_like_the_stages(exported):
    record, trace = exported
    found = spans(trace)
    for entry in record["stages"]:
        if entry["parent"] is None:
            continue
        child, parent = found[entry["id"]], found[parent_of(record, entry)["id"]]
        assert child["tid"] == parent["tid"]
        assert parent["ts"] - NS <= child["ts"] and end(child) <= end(parent) + NS
    # The viewers stack one thread's spans by time: any two must be apart or one inside the other.
    for a in found.values():
        for b in found.values():
            if a is not b and a["tid"] == b["tid"] and a["ts"] <= b["ts"]:
                assert b["ts"] >= end(a) - NS or end(b) <= end(a) + NS, (a["name"], b["name"])


def test_the_finished_run_has_the_expected_shape(finished):
    record, trace = finished
    by_path = {s["path"]: s for s in record["stages"]}
    assert set(by_path) == {"load", "load/spike", "prefetch", "prefetch/decode", "compute", "fails"}
    assert by_path["prefetch/decode"]["thread"] == "prefetcher"
    found = spans(trace)
    prefetch, compute = found[by_path["prefetch"]["id"]], found[by_path["compute"]["id"]]
    assert prefetch["tid"] != compute["tid"]
    assert prefetch["ts"] < compute["ts"] < end(prefetch)  # overlapping, on separate threads
    assert {name for name, _, _ in counter_points(trace)} == {"RSS", "live tensors", "Python heap"}
    failed = found[by_path["fails"]["id"]]["args"]
    assert (failed["status"], failed["error"]) == ("failed", "ValueError: bad shape")


# -- counters and peaks ------------------------------------------------------------------

def test_counters_are_exactly_the_readings_the_record_keeps(exported):
    record, trace = exported
    assert counter_points(trace) == record_readings(record)


def test_a_stage_peak_is_an_instant_at_its_end_never_a_counter_point(exported):
    record, trace = exported
    peaks = [e for e in events(trace, "i") if e["name"] == "stage peak"]
    found, names = spans(trace), thread_names(trace)
    finished_stages = [s for s in record["stages"] if s["end_s"] is not None]
    assert sorted(e["args"]["stage"] for e in peaks) == sorted(s["path"] for s in finished_stages)
    for entry in finished_stages:
        (event,) = [e for e in peaks if e["args"]["stage"] == entry["path"]
                    and e["ts"] == pytest.approx(us(entry["end_s"]), abs=NS)]
        assert event["s"] == "t" and names[event["tid"]] == entry["thread"]
        assert event["tid"] == found[entry["id"]]["tid"]
        assert event["args"]["peak_rss"] == entry["rss"]["peak"]
        assert event["args"].get("peak_live_tensors") == (entry.get("live_tensors") or {}).get("peak")
        assert "not the instant" in event["args"]["time"]


def test_a_transient_peak_stays_out_of_the_counter_series(finished):
    record, trace = finished
    spike = next(s for s in record["stages"] if s["path"] == "load/spike")
    live = spike["live_tensors"]
    assert live["peak"] - max(live["start"], live["end"]) >= 19_000_000  # the 20 MB tensor
    assert live["peak"] not in [e["args"]["bytes"] for e in events(trace, "C") if e["name"] == "live tensors"]


def test_the_run_peak_is_a_global_instant_at_the_end_of_its_stage(exported):
    record, trace = exported
    (peak,) = [e for e in events(trace, "i") if e["name"] == "peak RSS"]
    holder = next((s for s in record["stages"] if s["id"] == record["peak"]["stage_id"]), None)
    if holder is None and record["peak"].get("stage") is not None:  # an older record: by path
        holder = next((s for s in record["stages"] if s["path"] == record["peak"]["stage"]), None)
    assert peak["s"] == "g" and peak["args"]["rss"] == record["peak"]["rss"]
    if holder is not None:
        assert peak["ts"] == pytest.approx(us(holder["end_s"]), abs=NS)
        assert peak["args"]["stage"] == record["peak"]["stage"] and "not the instant" in peak["args"]["time"]
    else:  # the peak fell in time no stage covers (RSS can peak while the audit ends)
        assert peak["ts"] == pytest.approx(us(run_end(record)), abs=NS)
        assert "in no finished stage" in peak["args"]["time"]
    assert ("memray" in peak["args"]) == bool(record.get("memray"))


def test_the_run_peak_carries_memrays_top_sites(with_memray):
    record, trace = with_memray
    (peak,) = [e for e in events(trace, "i") if e["name"] == "peak RSS"]
    fields = ("location", "function", "bytes", "allocations")
    sites = peak["args"]["memray"]["sites"]
    assert sites and [{k: s[k] for k in fields} for s in sites] == [
        {k: s[k] for k in fields} for s in record["memray"]["sites"]]
    assert peak["args"]["memray"]["peak_memory"] == record["memray"]["peak_memory"]
    assert sites[0]["bytes"] >= 19_000_000  # the 20 MB spike, alive at memray's high-water mark


def test_marks_are_instants_on_their_thread(exported):
    record, trace = exported
    names = thread_names(trace)
    marks = [e for e in events(trace, "i") if e["cat"] == "mark"]
    assert len(marks) == len(record["marks"])
    for mark, event in zip(record["marks"], marks, strict=False):
        assert (event["name"], event["s"], names[event["tid"]]) == (mark["name"], "t", mark["thread"])
        assert event["ts"] == pytest.approx(us(mark["t_s"]), abs=NS)
        assert (event["args"]["rss"], event["args"].get("stage")) == (mark["rss"], mark["stage"])


def test_other_data_names_the_run(exported):
    record, trace = exported
    other = trace["otherData"]
    for key in ("name", "command", "device", "schema", "exit"):
        assert other[key] == record[key]
    assert other["sizes"] == "bytes"


def test_cuda_readings_become_a_counter(finished):
    """No GPU here: the record's CUDA fields are filled in, as a CUDA run writes them."""
    record = copy.deepcopy(finished[0])
    for n, entry in enumerate(record["stages"]):
        entry["cuda"] = {"allocated_start": 1000 * n, "allocated_end": 1000 * n + 7,
                         "reserved_end": 4096, "peak_allocated": 1000 * n + 999}
    for n, mark in enumerate(record["marks"]):
        mark["cuda"] = {"allocated": 5 + n, "reserved": 4096}
    trace = exported_from(run_trace(RunRecord.from_json(record)))
    assert counter_points(trace) == record_readings(record)
    assert any(name == "CUDA allocated" for name, _, _ in counter_points(trace))
    peaks = {e["args"]["stage"]: e["args"] for e in events(trace, "i") if e["name"] == "stage peak"}
    assert all(peaks[s["path"]]["peak_cuda_allocated"] == s["cuda"]["peak_allocated"] for s in record["stages"])
    assert 999 not in [p for _, _, p in counter_points(trace)]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_run_exports_its_cuda_counter(tmp_path):
    with auditor.Audit(tmp_path / "run") as audit, auditor.stage("on gpu"):
        kept = torch.ones(FLOATS, device="cuda")
    trace = export(tmp_path / "run", tmp_path / "trace.json")
    assert counter_points(trace) == record_readings(audit.record)
    assert any(name == "CUDA allocated" for name, _, _ in counter_points(trace))
    del kept


# -- a killed run ------------------------------------------------------------------------

def test_a_killed_run_exports_its_open_stages_to_its_last_known_time(killed):
    record, trace = killed
    assert [(s["path"], s["status"]) for s in record["stages"]] == [
        ("load", "ok"), ("prefetch", "open"), ("train", "open"), ("train/doomed", "open")]
    found, names = spans(trace), thread_names(trace)
    last = us(run_end(record))
    for entry in record["stages"][1:]:
        span = found[entry["id"]]
        assert end(span) == pytest.approx(last, abs=NS)
        assert span["args"]["status"] == "open" and "never finished" in span["args"]["end"]
    assert names[found[record["stages"][1]["id"]]["tid"]] == "prefetcher"
    assert "did not finish" in trace["otherData"]["unfinished"]
    assert trace["otherData"]["exit"]["status"] == "unfinished"
    (peak,) = [e for e in events(trace, "i") if e["name"] == "peak RSS"]
    assert peak["args"]["stage"] == "load"


def test_an_unfinished_run_json_and_its_folder_both_export(killed, tmp_path):
    record, _ = killed
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps(record))  # what rebuild(write=True) leaves
    trace = export(folder / "run.json", tmp_path / "trace.json")
    assert "did not finish" in trace["otherData"]["unfinished"]


def test_the_default_output_is_trace_json_in_the_run_folder(finished, tmp_path, capsys):
    record, _ = finished
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps(record))
    assert main(["export", str(folder / "run.json")]) == 0
    assert capsys.readouterr().out.strip() == str(folder / "trace.json")
    assert spans(json.loads((folder / "trace.json").read_text())).keys() == {s["id"] for s in record["stages"]}


def test_help_shows_the_defaults_and_an_example(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["export", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "default: chrome-trace" in text and "default: trace.json in the run folder" in text
    assert "examples:" in text and "auditor export runs/" in text and "ui.perfetto.dev" in text


# -- bad input ---------------------------------------------------------------------------

def snapshot(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in root.rglob("*")}


@pytest.mark.parametrize("case, message", [
    ("missing record", "no run record"),
    ("truncated record", "truncated"),
    ("output is a folder", "is a folder"),
    ("output is its run.json", "run record"),
    ("output is another run's events.jsonl", "run record"),
    ("output is the record read", "run record"),
    ("output folder missing", "does not exist"),
    ("output under a file", "does not exist"),
    ("unknown format", "invalid choice"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(finished, tmp_path, capsys, case, message):
    record, _ = finished
    run, other = tmp_path / "run", tmp_path / "other"
    for folder in (run, other):
        folder.mkdir()
        (folder / "run.json").write_text(json.dumps(record))
        (folder / "events.jsonl").write_text("{}\n")
    (tmp_path / "record.json").write_text(json.dumps(record))
    (tmp_path / "file").write_text("x")
    argv = {
        "missing record": [str(tmp_path / "nowhere"), "-o", str(tmp_path / "t.json")],
        "truncated record": [str(tmp_path / "record.json"), "-o", str(tmp_path / "t.json")],
        "output is a folder": [str(run), "-o", str(other)],
        "output is its run.json": [str(run), "-o", str(run / "run.json")],
        "output is another run's events.jsonl": [str(run), "-o", str(other / "events.jsonl")],
        "output is the record read": [str(tmp_path / "record.json"), "-o", str(tmp_path / "record.json")],
        "output folder missing": [str(run), "-o", str(tmp_path / "nope" / "t.json")],
        "output under a file": [str(run), "-o", str(tmp_path / "file" / "t.json")],
        "unknown format": [str(run), "--format", "speedscope", "-o", str(tmp_path / "t.json")],
    }[case]
    if case == "truncated record":  # cut at a line end, as a killed writer would leave it
        good = json.dumps(record, indent=1)
        (tmp_path / "record.json").write_text(good[: good.index("\n", len(good) // 2)])
    before = snapshot(tmp_path)
    assert main(["export", *argv]) == 2
    assert message in one_error_line(capsys)
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_output_folder_is_refused(finished, tmp_path, capsys):
    record, _ = finished
    (tmp_path / "run.json").write_text(json.dumps(record))
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        assert main(["export", str(tmp_path / "run.json"), "-o", str(locked / "t.json")]) == 2
        assert "not writable" in one_error_line(capsys)
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


def test_a_malformed_event_log_is_one_line(tmp_path, capsys):
    (tmp_path / "events.jsonl").write_text('{"event": "run_started", "schema": "auditor.run/1"}\n'
                                           '{"event": "stage_started"}\n')
    before = snapshot(tmp_path)
    assert main(["export", str(tmp_path), "-o", str(tmp_path / "t.json")]) == 2
    assert "event log" in one_error_line(capsys)
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs sysfs")
def test_a_write_the_system_refuses_is_one_line(finished, tmp_path, capsys):
    """sysfs refuses new files even to root: the write itself fails, after every check passed."""
    record, _ = finished
    (tmp_path / "run.json").write_text(json.dumps(record))
    assert main(["export", str(tmp_path / "run.json"), "-o", "/sys/kernel/trace.json"]) == 2
    assert "cannot write" in one_error_line(capsys)
    assert not os.path.exists("/sys/kernel/trace.json.tmp")
