"""Issue 32's fault suite, limits and endings: a script under an address-space limit
(RLIMIT_AS), a run killed while memray traces it, a program with its own memray Tracker, the
exit statuses python gives (sys.exit(263), a raised KeyboardInterrupt), and
`python -m gradprobe.streaming prune` on a full disk.

Each script ends under `auditor run` with the status, output and traceback it has alone; what
the auditor could not do is said in the record in plain words, never by a crash (memray's
reader crashed with SIGSEGV under an address-space limit and took the program's status with
it: 139 instead of the MemoryError's 1).
"""
from __future__ import annotations

import json
import resource
import signal
import sys
from pathlib import Path

import pytest
from fault_cases import Held
from test_faults import (
    Injected,
    assert_no_auditor_traceback,
    audited,
    default_signals,
    on_a_small_disk,
    plain,
    run,
    shell_status,
    write_script,
)

import auditor

MiB = 1 << 20

# numpy only: the auditor must not bring torch into it (--live-tensors once imported torch:
# +200 MiB of RSS, ~1 GB of address space)
OUT_OF_ADDRESS_SPACE = """
    import numpy as np
    import auditor
    with auditor.stage("load"):
        a = np.ones(1_000_000)
    with auditor.stage("big"):
        b = np.ones(400_000_000)  # 3 GiB: more than the limit allows
    print("never reached")
"""

FITS_ALONE = """
    import numpy as np
    import auditor
    with auditor.stage("load"):
        a = np.ones(25_000_000)  # 200 MB
    with auditor.stage("sum"):
        print("total", int(a.sum()), flush=True)
"""

OWN_TRACKER = """
    import os, sys
    import memray
    import auditor
    with auditor.stage("before"):
        data = bytearray(8_000_000)
    with memray.Tracker(sys.argv[1]):
        with auditor.stage("traced by the program"):
            more = bytearray(4_000_000)
    print("its own trace written:", os.path.getsize(sys.argv[1]) > 0, flush=True)
"""

EXITS_263 = """
    import sys
    import auditor
    with auditor.stage("work"):
        data = bytearray(1_000_000)
    print("exiting", flush=True)
    sys.exit(263)
"""

RAISES_KEYBOARD_INTERRUPT = """
    import auditor
    def stop():
        raise KeyboardInterrupt
    with auditor.stage("work"):
        data = bytearray(1_000_000)
    print("stopping", flush=True)
    stop()
"""

KILLED_WHILE_TRACED = """
    import os, signal
    import auditor
    with auditor.stage("load"):
        data = bytearray(8_000_000)
    with auditor.stage("killed"):
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer sends
"""


def address_space(limit: int):
    def limited() -> None:
        default_signals()
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limited


def traceback_of(stderr: str) -> list[str]:
    """The lines of the (first) traceback python printed, up to its exception's line."""
    lines = stderr.splitlines()
    if "Traceback (most recent call last):" not in lines:
        return []
    start = lines.index("Traceback (most recent call last):")
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines) - 1)
    return lines[start:end + 1]


def both(tmp_path: Path, text: str, *options: str, args: tuple = (), preexec_fn=default_signals,
         run_args: tuple | None = None) -> Injected:
    """`text` alone and under `auditor run OPTIONS`, each a real process."""
    script = write_script(tmp_path, text)
    alone = run(plain(script, *args), tmp_path, preexec_fn=preexec_fn)
    result = run(audited(*options, "--out", tmp_path / "run", script, *(run_args if run_args is not None else args)),
                 tmp_path, preexec_fn=preexec_fn)
    return Injected(shell_status(alone.returncode), shell_status(result.returncode), result, tmp_path / "run",
                    [], alone.stderr), alone


def out_of_address_space(tmp_path: Path):
    pytest.importorskip("memray")
    # 1000 MiB: python and numpy fit, the 3 GiB array does not; memray's reader, in the audited
    # process with torch loaded, crashed here with SIGSEGV (exit 139)
    fault, alone = both(tmp_path, OUT_OF_ADDRESS_SPACE, "--memray", "--live-tensors",
                        preexec_fn=address_space(1000 * MiB))
    fault.finished = [("load", "ok")]
    return fault, alone


def fits_alone(tmp_path: Path):
    fault, alone = both(tmp_path, FITS_ALONE, "--live-tensors", preexec_fn=address_space(600 * MiB))
    fault.finished = [("load", "ok"), ("sum", "ok")]
    return fault, alone


def own_tracker(tmp_path: Path):
    pytest.importorskip("memray")
    fault, alone = both(tmp_path, OWN_TRACKER, "--memray", args=(tmp_path / "alone.bin",),
                        run_args=(tmp_path / "audited.bin",))
    fault.finished = [("before", "ok"), ("traced by the program", "ok")]
    return fault, alone


def exits_263(tmp_path: Path):
    fault, alone = both(tmp_path, EXITS_263)
    fault.finished = [("work", "ok")]
    return fault, alone


def raises_keyboard_interrupt(tmp_path: Path):
    fault, alone = both(tmp_path, RAISES_KEYBOARD_INTERRUPT)
    fault.finished = [("work", "ok")]
    return fault, alone


def memray_said_what_it_did(fault: Injected, alone) -> None:
    record = auditor.load(fault.folder)
    memray = record.probes["memray"]
    # read back, or failed in its own process with the reason: never the program's crash
    assert record.memray is not None or (memray.state == "failed" and memray.reason), memray
    never_torch(fault, alone)


def never_torch(fault: Injected, alone) -> None:
    live = auditor.load(fault.folder).probes["live_tensors"]
    assert live.state == "absent" and "never imported torch" in live.reason, live


def trace_ended_early(fault: Injected, alone) -> None:
    assert "its own trace written: True" in fault.result.stdout, fault.result.stderr
    record = auditor.load(fault.folder)
    memray = record.probes["memray"]
    assert memray.state == "on" and "ended early" in memray.reason and "its own memray Tracker" in memray.reason
    assert record.memray is not None and record.memray.sites  # what it traced before: the 8 MB bytearray
    assert "auditor: warning: memray: the audit's trace ended early" in fault.result.stderr
    assert any("ended early" in warning for warning in record.warnings)


def low_byte(fault: Injected, alone) -> None:
    assert fault.result.returncode == alone.returncode == 7
    assert auditor.load(fault.folder).exit.to_json() == {"status": "failed", "code": 7, "error": "SystemExit: 263"}


def ended_by_sigint(fault: Injected, alone) -> None:
    # python ends a KeyboardInterrupt by SIGINT, after its exit handlers: so does the auditor
    assert fault.result.returncode == alone.returncode == -signal.SIGINT
    assert traceback_of(fault.result.stderr)[-2:] == ["    raise KeyboardInterrupt", "KeyboardInterrupt"]
    assert auditor.load(fault.folder).exit.to_json() == {"status": "interrupted", "code": 130,
                                                         "error": "KeyboardInterrupt"}


RUNS = {
    "MemoryError under a 1000 MiB address-space limit, --memray --live-tensors":
        (out_of_address_space, memray_said_what_it_did),
    "a numpy script that fits 600 MiB of address space alone, --live-tensors": (fits_alone, never_torch),
    "the program's own memray.Tracker under --memray": (own_tracker, trace_ended_early),
    "sys.exit(263)": (exits_263, low_byte),
    "raise KeyboardInterrupt in the script": (raises_keyboard_interrupt, ended_by_sigint),
}
FAULTS = {name: (lambda tmp_path, make=make: [make(tmp_path)[0]]) for name, (make, _) in RUNS.items()}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_script_ends_as_it_does_alone(name, tmp_path):
    make, check = RUNS[name]
    fault, alone = make(tmp_path)
    result = fault.result
    assert fault.status == fault.alone, (fault.alone_stderr, result.stderr)
    assert result.stdout.startswith(alone.stdout), (alone.stdout, result.stdout)  # the summary follows it
    assert traceback_of(result.stderr) == traceback_of(alone.stderr), (alone.stderr, result.stderr)
    assert "Memray" not in result.stderr, result.stderr  # memray's own log lines stay off the program's stderr
    assert_no_auditor_traceback(result.stderr)
    record = auditor.load(fault.folder)
    stages = [(s.path, s.status) for s in record.stages]
    assert all(stage in stages for stage in fault.finished), stages
    assert record.exit.code == fault.alone, record.exit  # what the shell sees
    check(fault, alone)


# -- cases that are not a script's run alone and audited ----------------------------------

def killed_while_traced(tmp_path: Path) -> Held:
    """A run memray traces, killed by SIGKILL (as by the OOM killer): memray.bin stays empty;
    `auditor report` on the folder says so in words, not an empty memray section."""
    pytest.importorskip("memray")
    script = write_script(tmp_path, KILLED_WHILE_TRACED)
    result = run(audited("--memray", "--out", tmp_path / "run", script), tmp_path)
    trace = tmp_path / "run" / "memray.bin"
    report = run([sys.executable, "-m", "auditor", "report", tmp_path / "run"], tmp_path)
    text = (tmp_path / "run" / "report.md").read_text() if report.returncode == 0 else ""
    said = "the process was killed before the audit ended" in text and "memray.bin is empty" in text
    held = shell_status(result.returncode) == 137 and trace.exists() and trace.stat().st_size == 0 and said
    words = "says the trace is empty because the process was killed" if said else "says nothing of it"
    return Held(held, f"killed: status {shell_status(result.returncode)}, memray.bin "
                      f"{trace.stat().st_size if trace.exists() else 'missing'} bytes; auditor report exit "
                      f"{report.returncode}, {words}")


PRUNE_ON_DISK = ('exec "$0" -m gradprobe.streaming prune --weights "$WEIGHTS" --output-dir "$1/pruned" '
                 "--sparsity 0.1 --batches 2 --seq-len 16 --batch-size 1 --threads 1")


def prune_on_a_full_disk(tmp_path: Path) -> Held:
    """`python -m gradprobe.streaming prune` whose output fills a 700 KiB disk (the output
    needs 1.2 MiB): one line on stderr, exit 1, the partial output removed."""
    pytest.importorskip("safetensors")
    import os

    from conftest import TINY_GPT_NEO

    from architectures import build_model
    from gradprobe.streaming.writing import save_model
    weights = tmp_path / "weights"
    save_model(build_model("tinystories-33m", seed=0, **TINY_GPT_NEO), str(weights))
    os.environ["WEIGHTS"] = str(weights)  # on_a_small_disk passes the environment on
    try:
        status, result, disk = on_a_small_disk(tmp_path, "700k", "keep", "sh", "-c", PRUNE_ON_DISK, sys.executable)
    finally:
        del os.environ["WEIGHTS"]
    lines = result.stderr.strip().splitlines()
    plain_line = len(lines) == 1 and lines[0].startswith("python -m gradprobe.streaming: error: the disk is full")
    held = status == 1 and plain_line and not (disk / "pruned").exists()
    return Held(held, f"exit {status}; stderr: {lines[-1] if lines else '(nothing)'} "
                      f"({len(lines)} line(s)); output folder {'left' if (disk / 'pruned').exists() else 'removed'}")


CASES = {
    "memray trace of a run killed by SIGKILL (an OOM kill)": killed_while_traced,
    "gradprobe streaming prune on a full disk": prune_on_a_full_disk,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_holds(name, tmp_path):
    held = CASES[name](tmp_path)
    assert held.held, held.seen


MODEL_OUTSIDE_EVERY_STAGE = """
import torch
weights = torch.ones(4 * 2**20 // 4)  # 4 MiB made right after the import, no stage open
print("made", flush=True)
"""


def test_the_meter_that_waits_for_torch_starts_at_the_programs_import(tmp_path):
    """`--live-tensors` on a program that imports torch after the audit began: the meter starts
    inside that import, so a tensor made before any stage (a run with no stage at all here) is
    counted at the run's peak, and the record says when the meter started."""
    from auditor.capture.probe_set import LIVE_AT_IMPORT
    script = tmp_path / "job.py"
    script.write_text(MODEL_OUTSIDE_EVERY_STAGE)
    done = run(audited("--live-tensors", "--run-dir", tmp_path / "run", script), tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("made"), done.stderr
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["probes"]["live_tensors"]["reason"] == LIVE_AT_IMPORT
    [unstaged] = record["unstaged"]
    assert unstaged["live_tensors"]["peak"] == 4 * 2**20
    assert [row["op"] for row in unstaged["live_tensors"]["at_peak"]["rows"]] == ["aten::ones"]
