"""The child-memory finding: a child process's own memory (USS), judged against the audited
process's peak and the weights, from real forked children under real `auditor run` and psutil.
A logger forked after the model is built, as upstream GradProbe's is, comes to own every page of
the weights the parent writes later (copy on write); forked before, it owns none of them."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import auditor
from auditor.analysis.findings.child_processes import FORKED_REMEDY, own_memory, projection_caveat
from auditor.analysis.findings.rules import findings

MiB = 1 << 20
WEIGHTS = 64 * MiB  # nn.Linear(4096, 4096) in fp32

# A logger forked with the fork start method; it reports its own USS (psutil) when told to, as
# the truth the auditor's reading is held to. FORK_AT says whether it starts before or after the
# model is built.
LOGGER = """
    import multiprocessing, sys
    import psutil, torch
    import auditor

    def logger(ready, measure, told):
        ready.set()
        measure.wait(60)
        told.put(psutil.Process().memory_full_info().uss)
        measure.clear()
        measure.wait(60)

    def start():
        context = multiprocessing.get_context("fork")
        ready, measure, told = context.Event(), context.Event(), context.Queue()
        context.Process(target=logger, args=(ready, measure, told), daemon=True).start()
        assert ready.wait(60)
        return measure, told

    if __name__ == "__main__":
        if sys.argv[2] == "before":
            measure, told = start()
        with auditor.stage("build"):
            model = torch.nn.Linear(4096, 4096, bias=False)
        if sys.argv[2] == "after":
            measure, told = start()
        with auditor.stage("train"):
            with torch.no_grad():
                model.weight.mul_(2)  # every page of the weights written after the fork
        measure.set()
        open(sys.argv[1], "w").write(str(told.get(timeout=60)))
"""


def audit(tmp_path: Path, text: str, *args: str, census: bool = True) -> auditor.RunRecord:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(text).lstrip())
    done = subprocess.run([sys.executable, "-m", "auditor", "run", *(["--census"] if census else []),
                           "--run-dir", str(tmp_path / "run"), str(script), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return auditor.load(tmp_path / "run")


def child_finding(record):
    found = [f for f in findings(record) if f.rule == "child-memory"]
    assert len(found) <= 1
    return found[0] if found else None


def test_a_logger_forked_after_the_model_is_built_is_found_with_its_own_memory(tmp_path):
    record = audit(tmp_path, LOGGER, str(tmp_path / "uss"), "after")
    truth = int((tmp_path / "uss").read_text())  # the child's own USS, read by itself after `train`
    finding = child_finding(record)
    assert finding is not None
    held = finding.evidence["bytes"]
    assert finding.evidence["basis"] == "uss"
    assert abs(held - truth) <= max(8 * MiB, 0.10 * truth), (held, truth)  # the auditor read what it held
    assert held >= WEIGHTS  # the weights' old pages, which the parent wrote after the fork
    assert finding.evidence["forked"] == 1 and finding.evidence["first_seen_stage"] == "train"
    assert finding.evidence["weights_before_fork"] == WEIGHTS == finding.evidence["weights"]
    assert finding.evidence["ratio_to_weights"] >= 1.0
    assert "forked after the model was built" in finding.statement
    assert "spawn" in finding.remedy and "before the model is built" in finding.remedy
    caveat = projection_caveat(record)
    assert caveat is not None and "fake tensors" in caveat and "left out" in caveat
    assert "no projection in this record counts it" not in finding.statement
    record.annotations["projections"] = [{"method": "scaled", "target": "a larger model", "stages": []}]
    projected = child_finding(record)
    assert projected is not None and "no projection in this record counts it" in projected.statement


def test_forked_before_the_model_the_logger_owns_none_of_it(tmp_path):
    """The remedy holds: the same logger forked before the model is built owns about the
    weights less (the interpreter's pages the parent writes later stay its own either way)."""
    (tmp_path / "after").mkdir(), (tmp_path / "before").mkdir()
    after = own_memory(audit(tmp_path / "after", LOGGER, str(tmp_path / "uss"), "after"))
    before_record = audit(tmp_path / "before", LOGGER, str(tmp_path / "uss"), "before")
    before = own_memory(before_record)
    assert after is not None and before is not None and before[1] == after[1] == "uss"
    assert after[0] - before[0] >= 0.9 * WEIGHTS, (after[0], before[0])
    finding = child_finding(before_record)
    assert finding is None or "forked after the model was built" not in finding.statement


def test_a_child_that_ended_between_readings_is_judged_by_its_peak_rss_and_says_so(tmp_path):
    record = audit(tmp_path, """
        import subprocess, sys
        import auditor
        with auditor.stage("child"):
            subprocess.run([sys.executable, "-c", "x = bytearray(300_000_000)"], check=True)
    """, census=False)
    finding = child_finding(record)
    assert finding is not None and finding.evidence["basis"] == "ended peak rss"
    assert finding.evidence["bytes"] >= 300_000_000
    assert "its own memory is not known" in finding.statement
    assert "weights' size is not known" in finding.statement  # no census: no weights to compare
    assert finding.remedy != FORKED_REMEDY  # not forked: the rule's own remedy


def test_a_run_without_children_has_no_child_finding(tmp_path):
    record = audit(tmp_path, """
        import auditor
        with auditor.stage("work"):
            data = bytearray(50_000_000)
    """, census=False)
    assert record.process.children is None
    assert child_finding(record) is None and projection_caveat(record) is None
