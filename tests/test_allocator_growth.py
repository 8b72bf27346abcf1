"""The allocator's retention growth in projections: the live-tensor meter follows glibc's dynamic
mmap threshold, and projections add a measured factor x threads x its growth to the RSS beyond
tensors."""
from __future__ import annotations

import os

import torch

from auditor.analysis.projection.traced import project_traced
from auditor.capture.probes.live_tensors import LiveTensorMeter
from auditor.facts.allocator_retention import FACTOR, MMAP_THRESHOLD_START, RANGE, malloc_settings, threshold_fixed
from auditor.record.schema import RunRecord

MiB = 2**20


def test_the_meter_follows_the_largest_block_freed_up_to_32_mib():
    meter = LiveTensorMeter()
    with meter:
        assert meter.mmap_threshold == MMAP_THRESHOLD_START
        block = torch.empty(4 * MiB, dtype=torch.uint8)
        del block
        assert meter.mmap_threshold == 4 * MiB
        small = torch.empty(MiB, dtype=torch.uint8)
        huge = torch.empty(64 * MiB, dtype=torch.uint8)
        del small, huge  # below the threshold, and above glibc's 32 MiB cap: no change
        assert meter.mmap_threshold == 4 * MiB


def test_a_threshold_set_in_the_environment_stays_fixed(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(MiB))
    meter = LiveTensorMeter()
    with meter:
        block = torch.empty(8 * MiB, dtype=torch.uint8)
        del block
    assert meter.mmap_threshold == MiB


def test_glibc_tunables_fix_the_threshold_as_the_variables_do(monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", f"glibc.rtld.nns=2:glibc.malloc.mmap_threshold={MiB}")
    assert malloc_settings(os.environ) == {"mmap_threshold": str(MiB)}
    meter = LiveTensorMeter()
    with meter:
        block = torch.empty(8 * MiB, dtype=torch.uint8)
        del block
    assert meter.mmap_threshold == MiB


def test_malloc_settings_name_what_fixes_the_threshold():
    assert malloc_settings({"MALLOC_ARENA_MAX": "2", "MALLOCX": "1", "PATH": "/bin"}) == {"arena_max": "2"}
    assert not threshold_fixed({"arena_max": "2"}) and not threshold_fixed({})
    # glibc turns its dynamic threshold off when any of these four is set
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"):
        assert threshold_fixed(malloc_settings({name: "0"})), name


def test_the_run_record_keeps_the_malloc_settings(tmp_path):
    import subprocess
    import sys
    program = ("import sys, auditor\n"
               "with auditor.Audit(out=sys.argv[1], name='m'):\n"
               "    with auditor.stage('s'):\n        pass\n")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_ARENA_MAX": "2"}
    done = subprocess.run([sys.executable, "-c", program, str(tmp_path / "run")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    from auditor.record.run_folder import load
    record = load(tmp_path / "run")
    assert record.environment.malloc == {"mmap_threshold": "131072", "arena_max": "2"}
    from auditor.renderers.markdown import malloc_setting
    from auditor.report_models.run import environment
    env = environment(record)
    assert env.malloc_threshold_fixed
    assert malloc_setting(record.environment.malloc, env.malloc_threshold_fixed) == (
        "arena_max=2, mmap_threshold=131072: the mmap threshold stays fixed")
    assert malloc_setting({}, False).startswith("glibc defaults: the mmap threshold follows the largest block freed")


def _record(threshold: int, rss: int, tensors: int, threads: int = 2) -> dict:
    stage = {"name": "prune", "path": "prune", "parent": None, "status": "ok", "start_s": 0.0, "end_s": 1.0,
             "components": {}, "rss": {"start": rss, "end": rss, "peak": rss},
             "live_tensors": {"peak": tensors, "allocator_threshold": threshold}}
    return {"schema": "auditor.run/1", "name": "x", "command": "x", "started_at": "t", "device": "cpu",
            "process": {}, "stages": [stage], "peak": {"rss": rss}, "environment": {"threads": threads},
            "workload": {"architecture": "llama-2-7b"}}


def project(real: dict, traced: dict) -> dict:
    """project_traced on the hand-made records, read as the auditor reads records."""
    return project_traced(RunRecord.from_json(real), RunRecord.from_json(traced))


def test_the_traced_projection_adds_the_retention_the_target_threshold_allows():
    real = _record(threshold=2 * MiB, rss=400 * MiB, tensors=30 * MiB)
    traced = _record(threshold=16 * MiB, rss=0, tensors=270 * MiB)
    (stage,) = project(real, traced)["stages"]
    assert stage["beyond_measured"] == 370 * MiB
    growth = round(FACTOR * 2 * (16 - 2) * MiB)  # the factor x threads x the threshold's growth
    assert stage["allocator_growth"] == growth
    assert stage["allocator_growth_range"] == [round(growth * r / FACTOR) for r in RANGE]
    assert stage["rss_peak"] == 270 * MiB + 370 * MiB + growth


def test_calls_the_real_run_did_not_make_take_their_stage_s_most():
    real = _record(threshold=MiB, rss=400 * MiB, tensors=30 * MiB)
    real["stages"] = [dict(real["stages"][0], path=f"prune/step#{n}" if n > 1 else "prune/step",
                           rss={"start": (390 + n) * MiB, "end": (390 + n) * MiB, "peak": (390 + n) * MiB})
                      for n in (1, 2)]
    traced = _record(threshold=MiB, rss=0, tensors=50 * MiB)
    traced["stages"] = [dict(traced["stages"][0], path="prune/step#7")]
    (stage,) = project(real, traced)["stages"]
    assert stage["beyond_from"] == "the most of its stage's calls"
    assert stage["beyond_measured"] == (392 - 30) * MiB and stage["allocator_growth"] == 0


_FREES_A_BLOCK = """
import sys, torch, auditor
with auditor.Audit(out=sys.argv[1], name="frees", live_tensors=True):
    with auditor.stage("load"):
        block = torch.ones(6 * 2**20, dtype=torch.uint8)
        del block  # glibc's default: its mmap threshold rises to this block's size
    with auditor.stage("work"):  # 2 MiB blocks now come from the heap; every other one is freed
        blocks = [torch.ones(2 * 2**20, dtype=torch.uint8) for _ in range(80)]
        kept = blocks[::2]
        del blocks
"""


def _finding(tmp_path, name: str, env: dict):
    import subprocess
    import sys

    from auditor.analysis.findings.rules import findings
    from auditor.record.run_folder import load
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}, **env}
    done = subprocess.run([sys.executable, "-c", _FREES_A_BLOCK, str(tmp_path / name)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return next(f for f in findings(load(tmp_path / name)) if f.rule == "rss-above-live-tensors")


def test_the_rss_finding_names_a_risen_mmap_threshold_and_how_to_keep_it(tmp_path):
    risen = _finding(tmp_path, "default", {})
    assert risen.evidence["mmap_threshold"] == 6 * MiB
    assert risen.evidence["grown_since"] > 60 * MiB  # the 40 freed blocks' holes, kept in the heap
    assert "its mmap threshold rose to 6.0 MiB in `load`" in risen.statement
    assert "MALLOC_MMAP_THRESHOLD_=131072" in risen.remedy
    # with the threshold fixed there is nothing about it to say: the rule's own remedy
    fixed = _finding(tmp_path, "fixed", {"MALLOC_MMAP_THRESHOLD_": "131072"})
    assert "mmap_threshold" not in fixed.evidence and "glibc" not in fixed.statement
    from auditor.analysis.findings.rules import REMEDIES
    assert fixed.remedy == REMEDIES["rss-above-live-tensors"]


def test_the_meter_keeps_the_high_water_of_cpu_storages_glibc_s_heap_serves():
    meter = LiveTensorMeter()
    with meter:
        small = torch.empty(64 * 1024, dtype=torch.uint8)  # below the 128 KiB starting threshold: the heap
        big = torch.empty(4 * MiB, dtype=torch.uint8)  # above it: mmapped, not counted
        assert meter.heap_high_water == 64 * 1024
        del big  # the threshold follows it to 4 MiB: a 1 MiB block now comes from the heap
        blocks = [torch.empty(MiB, dtype=torch.uint8) for _ in range(3)]
        assert meter.heap_live == meter.heap_high_water == 64 * 1024 + 3 * MiB
        del blocks, small
        assert meter.heap_live == 0 and meter.heap_high_water == 64 * 1024 + 3 * MiB  # a high water stays
        on_meta = torch.empty(MiB, dtype=torch.uint8, device="meta")  # no memory, no heap
        del on_meta
    assert meter.heap_high_water == 64 * 1024 + 3 * MiB


def test_what_the_heap_may_keep_grows_with_its_high_water():
    from auditor.facts.allocator_retention import HEAP_KEEPS_AT_MOST, heap_may_keep
    assert heap_may_keep(10 * MiB, 110 * MiB) == round(HEAP_KEEPS_AT_MOST * 100 * MiB)
    assert heap_may_keep(10 * MiB, 5 * MiB) == 0  # the target's heap served less: nothing more to keep
