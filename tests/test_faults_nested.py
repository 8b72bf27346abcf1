"""Issue 32's fault suite, audits inside audits: a program that uses the auditor itself runs
under `auditor run` as it runs alone. A second Audit entered while one is active is joined to
it (auditor.capture.nested_audit), never an error: a script that audits itself, an Audit nested
in another in a plain script, and `auditor run -m pytest` over memory_budget tests (one within
its budget, one over it, one test that audits its own code) end with the same exit status,
stdout, outcomes and traceback as alone; each nested audit's record reads as alone, and the
outer run holds it as a stage named after it with its stages inside.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_faults import Injected, assert_no_auditor_traceback, audited, plain, run, write_script

import auditor

SELF_AUDITING = """
    import sys
    import auditor
    out, ending = sys.argv[1], sys.argv[2]
    print("start", flush=True)
    with auditor.Audit(out=out, name="mine", tracemalloc=True) as audit:
        with auditor.stage("load"):
            data = bytearray(20_000_000)
            with auditor.stage("parse"):
                part = bytearray(5_000_000)
        auditor.mark("loaded")
        with auditor.stage("work"):
            more = bytearray(3_000_000)
            if ending == "fail":
                raise ValueError("the program's own error")
    record = audit.record
    print([s["path"] for s in record["stages"]], record["exit"]["status"], record["peak"]["rss"] > 20_000_000)
    print("its own line on stderr", file=sys.stderr)
"""
SELF_STAGES = ["load", "load/parse", "work"]

NESTED = """
    import sys
    import auditor
    base = sys.argv[1]
    with auditor.Audit(out=base + "/outer", name="outer") as outer:
        with auditor.stage("prepare"):
            data = bytearray(10_000_000)
        with auditor.Audit(out=base + "/inner", name="inner") as inner:
            with auditor.stage("step"):
                more = bytearray(5_000_000)
    print([s["path"] for s in outer.record["stages"]])
    print([s["path"] for s in inner.record["stages"]])
"""

BUDGETS = """
    import pytest
    import auditor

    @pytest.mark.memory_budget(peak_rss="4GiB")
    def test_within_budget():
        with auditor.stage("load"):
            data = bytearray(20_000_000)

    @pytest.mark.memory_budget(peak_rss="1MiB", stage="load")
    def test_over_budget():
        with auditor.stage("load"):
            data = bytearray(20_000_000)

    def test_fixture_reads_its_stages_so_far(memory_audit):
        with auditor.stage("step"):
            data = bytearray(1_000_000)
        record = auditor.rebuild(memory_audit.folder, write=False)
        assert [(s["path"], s["status"]) for s in record["stages"]] == [("test body", "open"), ("test body/step", "ok")]

    def test_audits_its_own_code(tmp_path):
        with auditor.Audit(out=tmp_path / "own", name="own") as audit:
            with auditor.stage("step"):
                pass
        assert [s["path"] for s in audit.record["stages"]] == ["step"]
"""
PYTEST = ["-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "test_budgets.py"]


def stages(folder: Path) -> list[tuple[str, str]]:
    return [(s.path, s.status) for s in auditor.load(folder, from_events=True).stages]


def program_stderr(stderr: str) -> list[str]:
    """stderr without the auditor's own lines (its warnings, stage lines and closing summary)."""
    return [line for line in stderr.splitlines()
            if not line.startswith(("auditor:", "peak RSS", "run record:")) and line[:1] not in "┏┃┡│└"]


def self_auditing(tmp_path: Path, ending: str) -> tuple[Injected, subprocess.CompletedProcess]:
    script = write_script(tmp_path, SELF_AUDITING, f"self_{ending}.py")
    alone = run(plain(script, tmp_path / f"alone-{ending}", ending), tmp_path)
    result = run(audited("--run-dir", tmp_path / f"run-{ending}", script, tmp_path / f"own-{ending}", ending),
                 tmp_path)
    status = "ok" if ending == "ok" else "failed"
    return Injected(alone.returncode, result.returncode, result, tmp_path / f"run-{ending}",
                    [("mine/load/parse", "ok"), ("mine/load", "ok"), ("mine/work", status), ("mine", status)],
                    alone_stderr=alone.stderr, ran=4), alone


def nested_in_a_plain_script(tmp_path: Path) -> tuple[Injected, subprocess.CompletedProcess]:
    script = write_script(tmp_path, NESTED, "nested.py")
    alone = run(plain(script, tmp_path / "alone"), tmp_path)
    result = run(audited("--run-dir", tmp_path / "run", script, tmp_path / "audited"), tmp_path)
    return Injected(alone.returncode, result.returncode, result, tmp_path / "run",
                    [("outer/prepare", "ok"), ("outer/inner/step", "ok"), ("outer/inner", "ok"), ("outer", "ok")],
                    alone_stderr=alone.stderr, ran=4), alone


def pytest_with_budgets(tmp_path: Path) -> tuple[Injected, subprocess.CompletedProcess]:
    write_script(tmp_path, BUDGETS, "test_budgets.py")
    alone = run([sys.executable, *PYTEST], tmp_path)
    result = run(audited("--run-dir", tmp_path / "run", *PYTEST), tmp_path)
    finished = [(f"{test}/test body/load", "ok") for test in ("test_within_budget", "test_over_budget")]
    finished += [("test_fixture_reads_its_stages_so_far/test body/step", "ok"), ("own/step", "ok"), ("own", "ok")]
    return Injected(alone.returncode, result.returncode, result, tmp_path / "run", finished,
                    alone_stderr=alone.stderr), alone


def failure_text(output: str) -> str:
    """The over-budget test's failure message, its sizes, times and paths masked."""
    start = output.index("memory budget exceeded in test_over_budget")
    text = output[start:output.index("run record:", start)]
    return re.sub(r"[\d.,]+ (?:[KMG]iB|B|ms|s)\b", "N", text)


# -- what each case must show beyond its status and stages (the same runs) ------------------

def self_auditing_as_alone(tmp_path: Path, fault: Injected, alone_run, ending: str) -> None:
    assert fault.alone == (0 if ending == "ok" else 1)
    assert fault.result.stdout == alone_run.stdout  # its own prints, from its own record, the same
    assert program_stderr(fault.result.stderr) == fault.alone_stderr.splitlines()  # its traceback included
    assert ("ValueError: the program's own error" in fault.result.stderr) == (ending == "fail")
    own, alone = auditor.load(tmp_path / f"own-{ending}"), auditor.load(tmp_path / f"alone-{ending}")
    assert [s.path for s in own.stages] == [s.path for s in alone.stages] == SELF_STAGES
    assert own.exit.to_json() == alone.exit.to_json()
    assert [m.stage for m in own.marks] == [None] and own.unstaged  # its own gaps, at its top
    assert all(s.py_heap is not None for s in own.stages)  # tracemalloc lent for its block
    assert own.peak.rss >= 25_000_000 and own.peak.where is not None
    assert own.annotations["nested_in"]["stage"] == "mine"
    outer = auditor.load(tmp_path / f"run-{ending}")
    assert [s.path for s in outer.stages] == ["mine", *(f"mine/{p}" for p in SELF_STAGES)]
    assert outer.stages[0].rss.peak == own.peak.rss  # its peak is its stage's


def nested_as_alone(tmp_path: Path, fault: Injected, alone) -> None:
    assert fault.result.stdout == alone.stdout == "['prepare', 'inner', 'inner/step']\n['step']\n"
    for folder in ("alone", "audited"):
        assert [s.path for s in auditor.load(tmp_path / folder / "outer").stages] == ["prepare", "inner", "inner/step"]
        assert [s.path for s in auditor.load(tmp_path / folder / "inner").stages] == ["step"]


def budgets_as_alone(tmp_path: Path, fault: Injected, alone_run) -> None:
    outcomes = re.compile(r"^(PASSED|FAILED) test_budgets\.py::(\w+)", re.M)
    alone = outcomes.findall(alone_run.stdout)
    assert sorted(alone) == [("FAILED", "test_over_budget"), ("PASSED", "test_audits_its_own_code"),
                             ("PASSED", "test_fixture_reads_its_stages_so_far"), ("PASSED", "test_within_budget")]
    assert outcomes.findall(fault.result.stdout) == alone
    assert fault.alone == 1
    assert failure_text(fault.result.stdout) == failure_text(alone_run.stdout)
    assert "peak RSS N in stage `load` > budget N" in failure_text(fault.result.stdout)


RUNS = {  # name -> (both runs, what they must show)
    "a script that audits itself, ending well":
        (lambda tmp_path: self_auditing(tmp_path, "ok"),
         lambda tmp_path, fault, alone: self_auditing_as_alone(tmp_path, fault, alone, "ok")),
    "a script that audits itself, raising inside its audit":
        (lambda tmp_path: self_auditing(tmp_path, "fail"),
         lambda tmp_path, fault, alone: self_auditing_as_alone(tmp_path, fault, alone, "fail")),
    "an Audit nested in another in a plain script": (nested_in_a_plain_script, nested_as_alone),
    "auditor run -m pytest: memory_budget within, over, and a test's own Audit":
        (pytest_with_budgets, budgets_as_alone),
}
FAULTS = {name: (lambda tmp_path, both=both: [both(tmp_path)[0]]) for name, (both, _) in RUNS.items()}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_program_runs_as_alone(name, tmp_path):
    both, as_alone = RUNS[name]
    fault, alone = both(tmp_path)
    result = fault.result
    assert fault.status == fault.alone, (fault.alone_stderr, result.stderr)
    assert_no_auditor_traceback(result.stderr)
    assert "already active" not in result.stdout + result.stderr
    present = stages(fault.folder)
    assert [stage for stage in fault.finished if stage not in present] == [], present
    as_alone(tmp_path, fault, alone)


def test_a_nested_audit_lends_the_live_tensor_meter_and_says_what_it_cannot_honour(tmp_path):
    torch = pytest.importorskip("torch")
    with auditor.Audit(tmp_path / "outer", name="outer"):
        with auditor.stage("before"):
            kept = torch.ones(1 << 20)
        inner = auditor.Audit(tmp_path / "inner", name="inner", live_tensors=True, census=True)
        with pytest.warns(auditor.AuditorWarning, match="census=True is not honoured"), inner:
            with auditor.stage("grow"):
                big = torch.ones(4 << 20)  # 16 MiB
            del big
        with auditor.stage("after"):
            kept = torch.ones(1 << 20)
    assert kept.numel()
    own = auditor.load(tmp_path / "inner")
    (grow,) = own.stages
    assert grow.live_tensors.peak - grow.live_tensors.start >= 16 << 20
    assert own.probes["census"].state == "off" and "nested" in own.probes["census"].reason
    assert any("census=True is not honoured" in w for w in own.warnings)
    outer = auditor.load(tmp_path / "outer")
    live = {s.path: s.live_tensors is not None for s in outer.stages}
    assert live == {"before": False, "inner": True, "inner/grow": True, "after": False}
    assert "nested audits only" in outer.probes["live_tensors"].reason
    assert torch._C._len_torch_dispatch_stack() == 0  # the lent meter's mode left with it
    with (auditor.Audit(tmp_path / "outer-live", live_tensors=True),  # its own meter serves the nested one
          auditor.Audit(tmp_path / "inner-live", name="inner", live_tensors=True), auditor.stage("grow")):
        big = torch.ones(4 << 20)
        del big
    assert auditor.load(tmp_path / "inner-live").stages[0].live_tensors.peak >= 16 << 20
    assert auditor.load(tmp_path / "outer-live").probes["live_tensors"].reason is None
    assert torch._C._len_torch_dispatch_stack() == 0
