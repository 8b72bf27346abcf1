"""Issue 32's fault suite, stage bookkeeping: what a program does with its stages never breaks it.

Each case runs a small program alone and under `auditor run` (test_faults.Injected): deep and
endless recursion of a staged function, a stage opened near python's recursion limit, a
thousand nested stages, names that are not text or hold control characters, stages in eight
threads, stages closed out of order or from another thread, a staged module reloaded. For
each: the same exit status and stdout as alone, the same traceback where the program has one,
no traceback of the auditor's, a record `auditor report` reads, and what the auditor could not
follow said in a warning (the record's and stderr's) rather than raised into the program.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_faults import Injected, assert_no_auditor_traceback, audited, plain, run, shell_status, write_script

import auditor
from auditor.analysis.run.timeline import timeline
from auditor.renderers.markdown import render as render_markdown
from auditor.report_models.run import run_report


def _both(tmp_path: Path, text: str, *options: str, args: tuple[str, ...] = (), name: str = "job.py",
          finished: list[tuple[str, str]] | None = None) -> Injected:
    """`text` run alone, then under `auditor run OPTIONS`, in `tmp_path`."""
    script = write_script(tmp_path, text, name)
    alone = run(plain(script, *args), tmp_path)
    result = run(audited("--out", tmp_path / "run", *options, script, *args), tmp_path)
    injected = Injected(shell_status(alone.returncode), shell_status(result.returncode), result, tmp_path / "run",
                        finished or [], alone.stderr)
    injected.alone_stdout = alone.stdout  # type: ignore[attr-defined]  # the program's own output, to compare
    return injected


RECURSION = """
    import sys
    def f(n):
        return 0 if n == 0 else 1 + f(n - 1)
    print(f(int(sys.argv[1])))
"""

DECORATED = """
    import auditor
    @auditor.stage("walk")
    def walk(n):
        return 0 if n == 0 else 1 + walk(n - 1)
    print(walk(300))
    deepest = 0
    for n in range(400, 1000, 1):  # as deep as it goes alone: the same under the auditor
        try:
            walk(n)
            deepest = n
        except RecursionError:
            break
    print("deepest", deepest)
"""

ENDLESS = """
    def f(n):
        return f(n + 1)
    print("start", flush=True)
    f(0)
"""

DEEP_STAGE = """
    import sys
    import auditor
    def depth():
        frame, n = sys._getframe(1), 0
        while frame is not None:
            frame, n = frame.f_back, n + 1
        return n
    def down(n):
        if n == 0:
            at = depth()
            with auditor.stage("deep"):
                data = bytearray(1_000_000)
            return at
        return down(n - 1)
    print("opened at depth", down(int(sys.argv[1])), file=sys.stderr)  # the runner's frames differ
    print("opened deep")
"""

NESTED = """
    import contextlib
    import auditor
    with contextlib.ExitStack() as stack:
        for i in range(1000):
            stack.enter_context(auditor.stage(f"level{i}"))
        data = bytearray(2_000_000)
    print("nested 1000")
"""

NAMES = """
    import auditor
    for name in (b"x", 123, None, 1.5, b"\\xff", "load\\nstep\\x1b[31m red"):
        with auditor.stage(name):
            pass
    auditor.mark(b"m")
    print("named")
"""

THREADS = """
    import threading, time
    import auditor
    def work(i):
        with auditor.stage(f"worker{i}"):
            with auditor.stage("alloc"):
                data = bytearray(2_000_000 * (i + 1))
                time.sleep(0.02)
            del data
            time.sleep(0.01)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    print("threads done")
"""

OUT_OF_ORDER = """
    import threading
    import auditor
    outer, inner = auditor.stage("outer"), auditor.stage("inner")
    outer.__enter__(); inner.__enter__()
    outer.__exit__(None, None, None)  # the outer one first
    inner.__exit__(None, None, None)
    crossed = auditor.stage("crossed")
    opener = threading.Thread(target=crossed.__enter__)
    opener.start(); opener.join()
    crossed.__exit__(None, None, None)  # on the main thread
    with auditor.stage("after"):
        pass
    print("closed")
"""

STAGED_MODULE = """
    def grow(n):
        return bytearray(n)
"""

RELOADS = """
    import importlib
    import lib
    lib.grow(10)
    importlib.reload(lib)
    lib.grow(20)
    lib.grow = lambda n: n  # the program's own binding: kept, said
    print("reloaded", lib.grow(5))
"""


def staged_recursion(tmp_path: Path) -> Injected:
    return _both(tmp_path, RECURSION, "--stage", "job:f", args=("500",), finished=[("f", "ok")])


def endless_recursion(tmp_path: Path) -> Injected:
    return _both(tmp_path, ENDLESS, "--stage", "job:f")


def deep_stage(tmp_path: Path) -> Injected:
    return _both(tmp_path, DEEP_STAGE, args=("983",), finished=[("deep", "ok")])


def reloaded(tmp_path: Path) -> Injected:
    write_script(tmp_path, STAGED_MODULE, "lib.py")
    return _both(tmp_path, RELOADS, "--stage", "lib:grow", finished=[("grow", "ok"), ("grow#2", "ok")])


FAULTS = {
    "staged recursion 500 deep": lambda tmp_path: [staged_recursion(tmp_path)],
    "staged recursion without end: RecursionError": lambda tmp_path: [endless_recursion(tmp_path)],
    "@auditor.stage on a recursive function, to python's limit": lambda tmp_path: [
        _both(tmp_path, DECORATED, finished=[("walk", "ok")])],
    "a stage opened 985 frames deep": lambda tmp_path: [deep_stage(tmp_path)],
    "1,000 nested auditor.stage": lambda tmp_path: [_both(tmp_path, NESTED, finished=[("level0", "ok")])],
    "stage(b'x'), stage(123), None, 1.5, a name with \\n and ESC": lambda tmp_path: [
        _both(tmp_path, NAMES, finished=[("x", "ok"), ("123", "ok"), ("None", "ok"), ("1.5", "ok")])],
    "stages in 8 threads": lambda tmp_path: [_both(tmp_path, THREADS, finished=[("worker0", "ok")])],
    "an outer stage closed before its inner one, a stage closed on another thread": lambda tmp_path: [
        _both(tmp_path, OUT_OF_ORDER, finished=[("outer", "ok"), ("outer/inner", "ok"), ("crossed", "ok"),
                                                ("after", "ok")])],
    "importlib.reload of a staged module": lambda tmp_path: [reloaded(tmp_path)],
}


def _traceback(stderr: str) -> str:
    """The program's traceback in `stderr`, from its first line to the exception's."""
    found = re.search(r"^Traceback \(most recent call last\):\n(?:[ \[].*\n)*\S.*$", stderr, re.M)
    return found.group(0) if found else ""


def _report(folder: Path) -> str:
    return render_markdown(run_report(auditor.load(folder)))


# What each case must show beyond the rules every case keeps (`test_the_program_runs_as_alone`).
def _recursion(fault: Injected, record) -> None:
    (stage,) = record.stages
    assert stage.call is not None and stage.call.recursed == 501, stage.to_json()


def _decorated(fault: Injected, record) -> None:
    first = record.stages[0]
    assert first.path == "walk" and first.call is not None and first.call.recursed == 301, first.to_json()
    assert {s.path for s in record.stages} == {"walk"}  # each call one stage, its recursion inside it


def _endless(fault: Injected, record) -> None:
    assert fault.alone == fault.status == 1
    alone = _traceback(fault.alone_stderr)
    assert "RecursionError" in alone and alone == _traceback(fault.result.stderr)
    assert [(s.path, s.status) for s in record.stages] == [("f", "failed")]


def _nested(fault: Injected, record) -> None:
    assert len(record.stages) == 100 and record.stages[-1].path.count("/") == 99
    assert any("nested more than 100 deep" in w for w in record.warnings)
    assert "nested more than 100 deep" in fault.result.stderr


def _names(fault: Injected, record) -> None:
    names = [s.name for s in record.stages]
    assert names == ["x", "123", "None", "1.5", "\\xff", "load\nstep\x1b[31m red"]  # kept as given
    assert [m.name for m in record.marks] == ["m"]
    assert "\x1b" not in fault.result.stderr and "load\\nstep\\x1b[31m red" in fault.result.stderr
    report = _report(fault.folder)
    assert "\x1b" not in report and "load\nstep" not in report


def _threads(fault: Injected, record) -> None:
    """The peak falls in a worker's `alloc` stage, or in the time after it inside its worker
    (the threads overlap: which, timing decides); peak.stage, peak.where, the timeline and the
    report say the same place either way."""
    peak = record.peak
    assert peak.where is not None and peak.where.kind in ("stage", "unstaged"), peak.to_json()
    in_stage = peak.where.kind == "stage"
    assert peak.stage == (peak.where.stage if in_stage else peak.where.parent), peak.to_json()
    holder = next(s for s in record.stages if s.id == peak.stage_id)
    assert holder.path == peak.stage
    line = timeline(record)
    assert line.run_peak is not None and line.run_peak.stage == peak.stage
    assert holder.start_s <= line.run_peak.t <= holder.end_s
    assert line.peaks == []  # no stage's process-wide peak drawn where another thread ran
    report = _report(fault.folder)
    if in_stage:
        assert f"in stage `{peak.stage}`" in report
    else:
        assert f"inside `{peak.where.parent}` after its last child `{peak.where.after}`" in report


def _out_of_order(fault: Injected, record) -> None:
    assert [(s.path, s.parent) for s in record.stages] == [("outer", None), ("outer/inner", "outer"),
                                                            ("crossed", None), ("after", None)]
    for says in (["'outer/inner'", "closed by its parent"], ["'crossed'", "closed on thread 'MainThread'"]):
        said = [w for w in record.warnings if all(words in w for words in says)]
        assert said and said[0] in fault.result.stderr, record.warnings


def _reloaded(fault: Injected, record) -> None:
    assert [s.call.index for s in record.stages if s.call] == [1, 2]  # staged again after the reload
    said = [w for w in record.warnings if "lib:grow was bound anew" in w]
    assert said and said[0] in fault.result.stderr


CHECKS = {
    "staged recursion 500 deep": _recursion,
    "staged recursion without end: RecursionError": _endless,
    "@auditor.stage on a recursive function, to python's limit": _decorated,
    "1,000 nested auditor.stage": _nested,
    "stage(b'x'), stage(123), None, 1.5, a name with \\n and ESC": _names,
    "stages in 8 threads": _threads,
    "an outer stage closed before its inner one, a stage closed on another thread": _out_of_order,
    "importlib.reload of a staged module": _reloaded,
}


def ran_as_alone(fault: Injected):
    """The audited run's status, stdout and tracebacks are the script's alone; its record reads,
    with every stage that finished. Returns the record."""
    result = fault.result
    assert fault.status == fault.alone, result.stderr
    assert result.stdout == fault.alone_stdout  # type: ignore[attr-defined]
    assert_no_auditor_traceback(result.stderr)
    assert result.stderr.count("Traceback") == fault.alone_stderr.count("Traceback"), result.stderr
    record = auditor.load(fault.folder)  # run.json, read
    present = {(s.path, s.status) for s in record.stages}
    assert set(fault.finished) <= present, present
    return record


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_the_program_runs_as_alone(tmp_path, name):
    (fault,) = FAULTS[name](tmp_path)
    record = ran_as_alone(fault)
    assert _report(fault.folder).startswith("# Memory report")
    check = CHECKS.get(name)
    if check is not None:
        check(fault, record)


def test_a_long_name_is_shown_by_its_head_and_kept_apart_from_its_neighbours():
    """A 100,000-character stage name keeps the terminal a screenful: its head, its length and a
    digest; two long names sharing a head are shown apart; a stage's shown path is still its
    parent's shown path, a slash and its shown name (the record keeps the names whole)."""
    from auditor.report_models.shown_names import LONGEST, escaped
    long_a, long_b = "x" * 100_000, "x" * 99_999 + "y"
    assert len(escaped(long_a)) < 2 * LONGEST and "100,000 characters" in escaped(long_a)
    assert escaped(long_a) != escaped(long_b)
    assert escaped(f"load/{long_a}") == f"load/{escaped(long_a)}"
    assert escaped("x" * LONGEST) == "x" * LONGEST and escaped("a\nb") == "a\\nb"
