"""Reliability under bad input and injected faults, measured: every bad-input row and every
fault the test suite defines, run for real and counted rather than asserted.

    .venv/bin/python benchmarks/reliability.py -o reports/reliability.md   # and reports/reliability.json
    .venv/bin/python benchmarks/reliability.py --from reports/reliability.json -o reports/reliability.md

1. Bad input: every row of every parametrized table in tests/test_bad_input.py (the tables and
   the command line each row makes are the test module's own: each test function runs with its
   row, and its `check_refused` is swapped for one that records instead of asserting). Each row
   is a real process started in a folder prepared by the tests' `prepared_workspace` (a sentinel,
   a finished run, a committed report, broken checkpoints, an unwritable folder). Counted per
   command: inputs tried, exit status 2, one line on stderr (`PROGRAM: error: ...`, nothing on
   stdout), the expected words in it, tracebacks (any "Traceback" on stderr or stdout), files
   written or changed in the folder, and the time to the error.
2. Faults: every entry of tests/test_faults.py's FAULTS (signals mid-stage, MemoryError under an
   address-space limit, an OOM kill in a memory cgroup, a full disk, runs started together). Each
   injects its fault into the same script alone and under `auditor run`; counted per fault: the
   two exit statuses (as a shell shows them), the stages that finished before the fault against
   those present in the record (run.json, or the event log where there is none), tracebacks from
   the auditor (its own frames, or more tracebacks than the script prints alone), and whether
   `auditor report DIR` renders the folder afterwards without writing into it. A fault the machine
   does not permit is reported as skipped with the reason, never as passed.

Targets: 0 finished stages lost, 0 tracebacks on bad input, the audited program's exit status
preserved in 100% of the fault runs. Exit status 1 when one is missed (or a fault could not be
injected for another reason than the machine's), so the script is also a check.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import itertools
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import benchmark_record  # noqa: E402  (beside this script)
import pytest  # noqa: E402  (the test modules' skips are pytest's exceptions)
import test_bad_input as bad_input  # noqa: E402
import test_faults as faults  # noqa: E402
from fault_cases import Held  # noqa: E402

import auditor  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/reliability.py -o reports/reliability.md"


def fault_suites() -> list:
    """tests/test_faults.py and every tests/test_faults_*.py: each may define FAULTS (injected
    into a script alone and under `auditor run`) and CASES (tests/fault_cases.py's `Held`)."""
    names = ["test_faults"] + sorted(p.stem for p in (ROOT / "tests").glob("test_faults_*.py"))
    return [importlib.import_module(name) for name in names]


# -- 1. bad input ---------------------------------------------------------------------------

@dataclass
class Row:
    table: str  # the test function holding the row
    command: str  # "auditor report", "gradprobe", ...
    args: list[str]
    says: str
    attempt: bad_input.Attempt | None = None
    skipped: str | None = None
    program: str = ""
    folder_name: str = ""  # its temporary folder, taken out of what the report shows

    @property
    def lines(self) -> list[str]:
        return self.attempt.stderr.strip().splitlines()

    @property
    def one_line(self) -> bool:
        return (len(self.lines) == 1 and self.lines[0].startswith(f"{self.program}: error: ")
                and self.attempt.stdout == "")

    @property
    def traceback(self) -> bool:
        return "Traceback" in self.attempt.stderr or "Traceback" in self.attempt.stdout

    @property
    def passed(self) -> bool:
        """Everything the test asserts."""
        a = self.attempt
        return (a.returncode == 2 and not self.traceback and self.one_line and self.says in self.lines[0]
                and not a.written and not a.changed and a.elapsed_s < bad_input.LIMIT_S)


def tables(module) -> list[tuple[str, object, list[dict]]]:
    """Every test function of `module` that takes the `workspace` fixture, with its parametrized
    rows as keyword arguments (stacked parametrize marks: every combination)."""
    found = []
    for name, function in vars(module).items():
        if not name.startswith("test_") or not callable(function):
            continue
        if "workspace" not in inspect.signature(function).parameters:
            continue
        marks = [m for m in getattr(function, "pytestmark", []) if m.name == "parametrize"]
        if not marks:
            continue
        per_mark = []
        for mark in marks:
            names, values = mark.args[0], mark.args[1]
            names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
            rows = [getattr(v, "values", v) for v in values]  # pytest.param(...) or a plain tuple
            rows = [row if len(names) > 1 else (row,) for row in rows]
            per_mark.append([dict(zip(names, row, strict=False)) for row in rows])
        found.append((name, function, [dict(kv for part in combo for kv in part.items())
                                       for combo in itertools.product(*per_mark)]))
    return found


def run_row(function, kwargs: dict, finished_run: Path) -> list[Row]:
    """The test function with its row in a freshly prepared folder, its `check_refused` recording."""
    rows = []

    def record(program, args, says, workspace):
        folder, unwritable = workspace
        command = f"{program} {args[0]}" if program == "auditor" and args else program
        row = Row(function.__name__, command, list(args), says, program=program)
        if bad_input.needs_unwritable(args) and not unwritable:
            row.skipped = "no folder can be made unwritable here"
        else:
            row.attempt = bad_input.attempt(program, args, folder)
        rows.append(row)

    original = bad_input.check_refused
    folder = Path(tempfile.mkdtemp(prefix="reliability-row-"))
    bad_input.check_refused = record
    try:
        with bad_input.prepared_workspace(folder, finished_run) as workspace:
            function(**kwargs, workspace=workspace)
    finally:
        bad_input.check_refused = original
        shutil.rmtree(folder, ignore_errors=True)
    for row in rows:
        row.folder_name = str(folder)
    return rows


def bad_input_rows() -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="reliability-finished-") as base:
        finished_run = bad_input.make_finished_run(Path(base))
        for name, function, kwargs_list in tables(bad_input):
            began = time.perf_counter()
            for kwargs in kwargs_list:
                rows.extend(run_row(function, kwargs, finished_run))
            mine = [r for r in rows if r.table == name]
            failed = sum(1 for r in mine if r.attempt and not r.passed)
            print(f"  {name:<60} {len(mine):>3} rows  {time.perf_counter() - began:6.1f} s"
                  f"  {failed} not as the test expects", flush=True)
    return rows


def bad_input_table(rows: list[Row]) -> tuple[str, dict]:
    by_command: dict[str, list[Row]] = {}
    for row in rows:
        by_command.setdefault(row.command, []).append(row)
    header = ["command", "inputs tried", "exit 2", "one line", "expected words", "tracebacks",
              "written or changed", "median s", "max s", "skipped"]
    lines = [header]
    total = dict(tried=0, exit2=0, one=0, says=0, tb=0, touched=0, skipped=0, times=[])
    for command in sorted(by_command):
        group = by_command[command]
        ran = [r for r in group if r.attempt]
        times = [r.attempt.elapsed_s for r in ran]
        counts = dict(tried=len(ran), exit2=sum(r.attempt.returncode == 2 for r in ran),
                      one=sum(r.one_line for r in ran),
                      says=sum(r.one_line and r.says in r.lines[0] for r in ran),
                      tb=sum(r.traceback for r in ran),
                      touched=sum(bool(r.attempt.written or r.attempt.changed) for r in ran),
                      skipped=len(group) - len(ran))
        for key, value in counts.items():
            total[key] += value
        total["times"] += times
        lines.append([f"`{command}`", str(counts["tried"]), str(counts["exit2"]), str(counts["one"]),
                      str(counts["says"]), str(counts["tb"]), str(counts["touched"]),
                      f"{statistics.median(times):.2f}" if times else "-",
                      f"{max(times):.2f}" if times else "-", str(counts["skipped"])])
    times = total["times"]
    lines.append(["**all**", f"**{total['tried']}**", str(total["exit2"]), str(total["one"]),
                  str(total["says"]), f"**{total['tb']}**", str(total["touched"]),
                  f"{statistics.median(times):.2f}" if times else "-",
                  f"{max(times):.2f}" if times else "-", str(total["skipped"])])
    return markdown_table(lines, left=1), total


# -- 2. faults --------------------------------------------------------------------------------

@dataclass
class FaultRun:
    alone: int
    status: int
    expected: int
    present: int
    lost: list
    after: str  # stages finished after the fault, in the record / in all ("-": the script ends at the fault)
    auditor_traceback: bool
    record: str  # where the record came from and how it says the run ended
    renders: bool
    output: str  # the auditor's stderr tail, for failures


@dataclass
class Fault:
    name: str
    suite: str = "test_faults"  # the test module that defines it
    runs: list[FaultRun] = field(default_factory=list)
    skipped: str | None = None
    error: str | None = None
    seconds: float = 0.0


def auditor_traceback(injected) -> bool:
    """A traceback the auditor adds: a frame of its package, an `auditor: error` line, or more
    tracebacks than the script prints alone (the script's own, e.g. a MemoryError, are its)."""
    err = injected.result.stderr
    return (f'File "{faults.AUDITOR_PACKAGE}' in err or "auditor: error" in err
            or err.count("Traceback") > injected.alone_stderr.count("Traceback"))


def measure(injected, scratch: Path, index: int) -> FaultRun:
    folder = injected.folder
    present: set = set()
    record_says = "no run folder"
    renders = False
    if folder is not None and folder.is_dir():
        source = "run.json" if (folder / "run.json").exists() else "events.jsonl"
        try:
            record = auditor.load(folder, from_events=True)
            present = {(s.path, s.status) for s in record.stages if s.finished}
            record_says = f"{source}, exit {record.exit.status if record.exit else 'unfinished'}"
        except auditor.RunRecordError as error:
            record_says = f"{source}, unreadable: {error}"
        before = sorted((p.relative_to(folder), p.stat().st_size) for p in folder.rglob("*"))
        out = scratch / f"report-{index}.md"
        done = faults.run([sys.executable, "-m", "auditor", "report", str(folder), "-o", str(out)], scratch)
        after = sorted((p.relative_to(folder), p.stat().st_size) for p in folder.rglob("*"))
        renders = done.returncode == 0 and out.is_file() and before == after and "Traceback" not in done.stderr
    lost = [stage for stage in injected.finished if stage not in present]
    after = ("-" if injected.ran in (None, len(injected.finished))
             else f"{len(present) - len(injected.finished) + len(lost)} of {injected.ran - len(injected.finished)}")
    return FaultRun(injected.alone, injected.status, len(injected.finished), len(injected.finished) - len(lost),
                    lost, after, auditor_traceback(injected), record_says, renders,
                    clean(injected.result.stderr[-1500:], scratch))


def inject_all(suites: list) -> list[Fault]:
    results = []
    for suite in suites:
        for name, inject in getattr(suite, "FAULTS", {}).items():
            results.append(inject_one(suite.__name__, name, inject))
    return results


def inject_one(suite: str, name: str, inject) -> Fault:
    fault = Fault(name, suite)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="reliability-fault-") as scratch:
        scratch = Path(scratch)
        (scratch / "case").mkdir()
        try:
            injected = inject(scratch / "case")
            fault.runs = [measure(one, scratch, i) for i, one in enumerate(injected)]
        except pytest.skip.Exception as skip:
            fault.skipped = clean(str(skip.msg), scratch)
        except Exception as error:  # noqa: BLE001  (reported as not measured, and fails the check)
            fault.error = clean(f"{type(error).__name__}: {error}", scratch)[:500]
    fault.seconds = time.perf_counter() - began
    state = (f"skipped: {fault.skipped}" if fault.skipped else f"ERROR: {fault.error}" if fault.error else
             f"{sum(r.alone == r.status for r in fault.runs)}/{len(fault.runs)} exit preserved, "
             f"{sum(len(r.lost) for r in fault.runs)} stages lost")
    print(f"  {name:<56} {fault.seconds:5.1f} s  {state}", flush=True)
    return fault


# -- 3. cases that are not a script's run ------------------------------------------------------

@dataclass
class Case:
    name: str
    suite: str
    held: bool = False
    seen: str = ""
    skipped: str | None = None
    error: str | None = None
    seconds: float = 0.0


def try_cases(suites: list) -> list[Case]:
    results = []
    for suite in suites:
        for name, check in getattr(suite, "CASES", {}).items():
            case = Case(name, suite.__name__)
            began = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="reliability-case-") as scratch:
                try:
                    held = check(Path(scratch))
                    assert isinstance(held, Held), f"{name} returned {type(held).__name__}, not Held"
                    case.held, case.seen = held.held, clean(held.seen, scratch)
                except pytest.skip.Exception as skip:
                    case.skipped = clean(str(skip.msg), scratch)
                except Exception as error:  # noqa: BLE001  (reported as not measured, and fails the check)
                    case.error = clean(f"{type(error).__name__}: {error}", scratch)[:500]
            case.seconds = time.perf_counter() - began
            state = (f"skipped: {case.skipped}" if case.skipped else f"ERROR: {case.error}" if case.error
                     else "held" if case.held else f"NOT HELD: {case.seen}")
            print(f"  {name:<56} {case.seconds:5.1f} s  {state}", flush=True)
            results.append(case)
    return results


def case_table(cases: list[Case]) -> str:
    lines = [["case", "suite", "held", "what happened", "s"]]
    for case in cases:
        held = ("skipped" if case.skipped else "not measured" if case.error else "yes" if case.held else "**no**")
        lines.append([case.name, f"`tests/{case.suite}.py`", held,
                      case.skipped or case.error or case.seen, f"{case.seconds:.1f}"])
    return markdown_table(lines, left=4)


def fault_table(results: list[Fault]) -> str:
    lines = [["fault", "suite", "exit alone", "exit under the auditor", "preserved", "finished stages: expected",
              "present", "lost", "finished after the fault: in the record", "auditor tracebacks",
              "record (source, exit)", "`auditor report` renders"]]
    for fault in results:
        if fault.skipped or fault.error:
            what = f"skipped: {fault.skipped}" if fault.skipped else f"not measured: {fault.error}"
            lines.append([fault.name, f"`tests/{fault.suite}.py`", what] + [""] * 9)
            continue
        runs = fault.runs
        both = lambda values: ", ".join(sorted({str(v) for v in values}))  # noqa: E731
        lines.append([fault.name, f"`tests/{fault.suite}.py`", both(r.alone for r in runs),
                      both(r.status for r in runs),
                      f"{sum(r.alone == r.status for r in runs)}/{len(runs)}",
                      str(sum(r.expected for r in runs)), str(sum(r.present for r in runs)),
                      str(sum(len(r.lost) for r in runs)), both(r.after for r in runs),
                      str(sum(r.auditor_traceback for r in runs)),
                      "; ".join(sorted({r.record for r in runs})),
                      f"{sum(r.renders for r in runs)}/{len(runs)}"])
    return markdown_table(lines, left=2)


# -- the report -------------------------------------------------------------------------------

def markdown_table(rows: list[list[str]], left: int = 1) -> str:
    out = ["| " + " | ".join(rows[0]) + " |",
           "|" + "|".join("---" if i < left else "---:" for i in range(len(rows[0]))) + "|"]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows[1:]]
    return "\n".join(out)


def clean(text: str, *folders) -> str:
    """No machine paths in what is shown: temporary folders, the checkout, the auditor package."""
    for folder in folders:
        text = text.replace(str(folder), "$TMP")
    text = text.replace(faults.AUDITOR_PACKAGE, "auditor").replace(str(ROOT), ".")
    text = text.replace(tempfile.gettempdir(), "$TMPDIR")
    return text.replace(sys.executable, "python")


def machine() -> str:
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = "not installed"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    user = "root" if os.geteuid() == 0 else "a user"
    return (f"{cores} CPU cores, Linux {platform.release()}, Python {platform.python_version()}, "
            f"torch {torch}, run as {user}")


def revision() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown revision"
    return f"commit {head}" + (" with uncommitted changes in the working tree" if dirty else "")


def failures_section(rows: list[Row], results: list[Fault], cases: list[Case]) -> list[str]:
    out = [f"- case `{case.name}`: " + (f"not measured: {case.error}" if case.error else case.seen)
           for case in cases if not case.skipped and not (case.held and not case.error)]
    for row in rows:
        if row.attempt and not row.passed:
            a = row.attempt
            why = [w for w, bad in [(f"exit {a.returncode:d}", a.returncode != 2), ("traceback", row.traceback),
                                    (f"{len(row.lines)} lines on stderr", len(row.lines) != 1),
                                    ("stdout not empty", a.stdout != ""),
                                    (f"expected words {row.says!r} missing",
                                     row.one_line and row.says not in row.lines[0]),
                                    (f"wrote {a.written}", bool(a.written)), (f"changed {a.changed}", bool(a.changed)),
                                    (f"{a.elapsed_s:.2f} s (limit {bad_input.LIMIT_S} s)",
                                     a.elapsed_s >= bad_input.LIMIT_S)] if bad]
            shown = clean("\n".join(row.lines[-6:]), row.folder_name)
            out.append(f"- bad input, `{row.program} {' '.join(row.args)}`: {'; '.join(why)}\n\n"
                       f"  ```\n  " + shown.replace("\n", "\n  ") + "\n  ```")
    for fault in results:
        if fault.error:
            out.append(f"- fault `{fault.name}`: not measured: {fault.error}")
        for run in fault.runs:
            why = [w for w, bad in [(f"exit {run.status} under the auditor, {run.alone} alone",
                                     run.alone != run.status),
                                    (f"lost {run.lost}", bool(run.lost)),
                                    ("auditor traceback", run.auditor_traceback),
                                    ("`auditor report` did not render the folder", not run.renders)] if bad]
            if why:
                out.append(f"- fault `{fault.name}`: {'; '.join(why)}\n\n  ```\n  "
                           + clean(run.output.strip()).replace("\n", "\n  ") + "\n  ```")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", help="write the markdown report here, and its record beside it "
                                               "(REPORT.json; default: terminal only)")
    parser.add_argument("--from", dest="record", metavar="RECORD",
                        help="make the report again from a record this script wrote, measuring nothing")
    args = parser.parse_args()
    if args.output and not Path(args.output).resolve().parent.is_dir():
        parser.error(f"-o {args.output}: its folder does not exist")
    record = benchmark_record.read(args.record) if args.record else measure_everything()
    rows, results, cases = rows_of(record), faults_of(record), cases_of(record)
    bad_table, bad_total = bad_input_table(rows)
    totals, also = summary(results, cases, bad_total)
    print("\nTotals:")
    for what, value, target, met in totals:
        print(f"  {what:<46} {value:<28} target {target:<5} {'met' if met else 'MISSED'}")
    for line in also:
        print(f"  {line}")
    failures = failures_section(rows, results, cases)
    if failures:
        print("\nNot as expected:\n" + "\n".join(failures))
    print(f"wall time {record['wall_s']:.0f} s")
    if args.output:
        Path(args.output).write_text(report(bad_table, results, cases, totals, also, failures, record))
        if not args.record:
            benchmark_record.write(benchmark_record.beside(args.output), record)
        print(f"wrote {args.output}")
    return 0 if all(met for *_, met in totals) else 1


def measure_everything() -> dict:
    """Both parts run for real: the record the report is made from (machine paths cleaned out)."""
    began = time.perf_counter()
    load_before = os.getloadavg()
    print(f"{machine()}; {revision()}; load average {load_before[0]:.2f}", flush=True)
    print("1. Bad input (tests/test_bad_input.py), one real process per row:", flush=True)
    rows = bad_input_rows()
    suites = fault_suites()
    print("2. Faults (FAULTS of tests/test_faults*.py), alone and under `auditor run`:", flush=True)
    results = inject_all(suites)
    print("3. Cases (CASES of tests/test_faults*.py):", flush=True)
    cases = try_cases(suites)
    for row in rows:
        if row.attempt:
            row.attempt.stdout = clean(row.attempt.stdout, row.folder_name)
            row.attempt.stderr = clean(row.attempt.stderr, row.folder_name)
        row.folder_name = ""
    return {"command": COMMAND, "machine": machine(), "revision": revision(),
            "load_average": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            "wall_s": time.perf_counter() - began,
            "bad_input": [asdict(row) for row in rows], "faults": [asdict(fault) for fault in results],
            "cases": [asdict(case) for case in cases]}


def rows_of(record: dict) -> list[Row]:
    rows = []
    for row in record["bad_input"]:
        attempt = bad_input.Attempt(**row["attempt"]) if row["attempt"] else None
        rows.append(Row(**{**row, "attempt": attempt}))
    return rows


def faults_of(record: dict) -> list[Fault]:
    return [Fault(**{**fault, "runs": [FaultRun(**run) for run in fault["runs"]]}) for fault in record["faults"]]


def cases_of(record: dict) -> list[Case]:
    return [Case(**case) for case in record.get("cases", [])]


def summary(results: list[Fault], cases: list[Case], bad_total: dict) -> tuple[list, list[str]]:
    """The targets, measured, and the other counts printed under them."""
    measured = [f for f in results if not (f.skipped or f.error)]
    runs = [r for f in measured for r in f.runs]
    expected = sum(r.expected for r in runs)
    lost = sum(len(r.lost) for r in runs)
    preserved = sum(r.alone == r.status for r in runs)
    errors = [f for f in results if f.error]
    totals = [
        ("finished stages lost", f"{lost} of {expected}", "0", lost == 0 and not errors),
        ("tracebacks on bad input", f"{bad_total['tb']} in {bad_total['tried']} inputs", "0", bad_total["tb"] == 0),
        ("the audited program's exit status preserved",
         f"{preserved}/{len(runs)} runs ({100 * preserved / len(runs) if runs else 0:.0f}%)", "100%",
         preserved == len(runs) and not errors),
    ]
    tried = [c for c in cases if not c.skipped]
    held = sum(c.held and not c.error for c in tried)
    if cases:
        totals.append(("cases held (symlinks, records, job commands, ...)", f"{held}/{len(tried)} cases",
                       "100%", held == len(tried)))
    skipped = [f for f in results if f.skipped]
    also = [f"bad input: exit 2 in {bad_total['exit2']}/{bad_total['tried']}, one line in "
            f"{bad_total['one']}/{bad_total['tried']}, written or changed in {bad_total['touched']}, "
            f"slowest {max(bad_total['times']):.2f} s (limit {bad_input.LIMIT_S} s), "
            f"{bad_total['skipped']} rows skipped",
            f"faults: {len(results)} defined, {len(measured)} injected ({len(runs)} audited runs), "
            f"{len(skipped)} skipped, {len(errors)} not measured; auditor tracebacks "
            f"{sum(r.auditor_traceback for r in runs)}; "
            f"`auditor report` rendered {sum(r.renders for r in runs)}/{len(runs)} folders",
            f"cases: {len(cases)} defined, {len(tried)} tried, {len(cases) - len(tried)} skipped, "
            f"{sum(bool(c.error) for c in cases)} not measured"]
    return totals, also


def report(bad_table: str, results: list[Fault], cases: list[Case], totals, also, failures, record: dict) -> str:
    load_before, load_after = record["load_average"]
    tables_used = ", ".join(f"`{name}`" for name, _, _ in tables(bad_input))
    total_lines = [f"| {what} | {value} | {target} | {'met' if met else '**missed**'} |"
                   for what, value, target, met in totals]
    parts = [
        "# Reliability: bad input and injected faults",
        "",
        "Does the auditor ever break the program it audits, lose a finished stage, or answer a "
        "mistake with a traceback? Every bad-input row and every fault the test suite defines, run "
        "as real processes and counted (the tests assert the same cases; this report measures them).",
        "",
        "## Command",
        "",
        "```",
        COMMAND,
        "```",
        "",
        f"Machine: {record['machine']}. {record['revision'].capitalize()}. Load average {load_before:.2f} "
        f"before, {load_after:.2f} after; the script took {record['wall_s']:.0f} s.",
        "",
        "## Totals",
        "",
        "| target | measured | target | |",
        "|---|---|---|---|",
        *total_lines,
        "",
        *[f"- {line}" for line in also],
        "",
        "## 1. Bad input, per command",
        "",
        "Every row of the parametrized tables in `tests/test_bad_input.py` "
        f"({tables_used}), each a real process (`python -m PROGRAM ...`) in a folder holding a "
        "sentinel, a finished run, a committed report, broken checkpoints and an unwritable folder. "
        "*exit 2*: rows that ended with status 2; *one line*: exactly one line on stderr starting "
        "`PROGRAM: error:`, nothing on stdout; *expected words*: that line says what the table "
        "expects; *tracebacks*: \"Traceback\" anywhere in the output; *written or changed*: rows "
        "after which the folder held a new path or a changed or missing file. Times run from "
        "starting the process to its end (Python start-up included). A row that needs an "
        "unwritable folder is skipped where none can be made (root without chattr).",
        "",
        bad_table,
        "",
        "## 2. Faults",
        "",
        "Every fault in the `FAULTS` of `tests/test_faults.py` and `tests/test_faults_*.py`, injected "
        "into the same script run alone "
        "(plain `python`) and under `auditor run`. Exit statuses as a shell shows them (a signal "
        "ends a process with 128 + its number). *Finished stages: expected* are the stages that "
        "ended before the fault (for a disk kept full to the end, those that ended before it "
        "filled plus the stage that filled it; for a disk with room again by the end, every "
        "stage); *present* counts those in the record with the same status, read from run.json or, "
        "where there is none, the event log; *lost* = expected - present. *Finished after the "
        "fault*: where the script goes on after it, the later stages the record holds of those it "
        "finished (a disk kept full to the end has no room for them: they are in the terminal's "
        "stage table only, and not counted as lost). *Auditor "
        "tracebacks*: a frame of the auditor's package or an `auditor: error` line on stderr, or more "
        "tracebacks than the script prints alone. *`auditor report` renders*: `auditor report DIR "
        "-o OTHER.md` exits 0, writes the report, and leaves the run folder as it was.",
        "",
        fault_table(results),
        "",
        "## 3. Cases that are not a script's run",
        "",
        "Every entry of the `CASES` of `tests/test_faults*.py` (planted symlinks, damaged records, job "
        "commands signalled, unrelated folders named as ranks, ...): each runs in an empty folder and "
        "says whether the auditor held and what happened. A case the machine does not permit is "
        "skipped with the reason.",
        "",
        case_table(cases) if cases else "No case is defined.",
        "",
        "Other fault suites not counted here (their cases are asserted in the tests): "
        "`tests/test_capture_faults.py` (event-log write failures, failing probes, the auditor's own "
        "callables staged, closed and reused descriptors, fork, a closed stderr), "
        "`tests/test_job_commands_faults.py` and `tests/test_fresh_process.py` (children killed, "
        "Ctrl-C on train-step and gradprobe, folder reuse), `tests/test_record_safety.py`, "
        "`tests/test_compare.py` (noise rule, duplicates, output safety).",
        "",
        "## Not as expected",
        "",
        *(failures or ["Nothing: every bad-input row did what its test asserts and every fault run "
                       "kept its exit status, its finished stages and a renderable folder."]),
        "",
    ]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
