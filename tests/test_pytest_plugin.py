"""The pytest plugin (auditor.pytest_plugin), run as a user runs it: inner test files in a fresh
pytest process each (only one audit may run per process), loaded through its entry point.

Inner tests allocate whole 64 MiB tensors, so budgets sit far from the noise; a process's live
tensors are otherwise a few KiB.
"""
from __future__ import annotations

import re
from importlib.metadata import entry_points

import pytest

from auditor.pytest_plugin import Limit, parse_budget

pytest_plugins = ["pytester"]

HEADER = """
import pytest, torch, auditor

MiB = 2**20

def allocate(mib):
    return torch.ones(mib * MiB // 4)
"""


def run(pytester, body: str, *args: str):
    pytester.makepyfile(test_inner=HEADER + body)
    return pytester.runpytest_subprocess("-rA", "--strict-markers", "-p", "no:cacheprovider", *args)


def outcomes(result) -> dict[str, str]:
    """Each inner test's outcome, from the -rA summary: {"test_name": "PASSED" | "FAILED" | "ERROR"}."""
    found = re.findall(r"^(PASSED|FAILED|ERROR) test_inner\.py::(\w+)", result.stdout.str(), re.M)
    return {name: outcome for outcome, name in found}


def section(result, test: str) -> str:
    """The failure (or error) report of one inner test."""
    text = result.stdout.str()
    start = re.search(rf"^_+ (?:ERROR at setup of )?{test} _+$", text, re.M)
    assert start, text
    end = re.search(r"^(_{3,} |=+ )", text[start.end():], re.M)
    return text[start.end():start.end() + end.start()]


def test_the_plugin_is_installed_as_a_pytest11_entry_point():
    assert any(ep.value == "auditor.pytest_plugin" for ep in entry_points(group="pytest11"))


def test_budgets_pass_or_fail_and_show_where_the_memory_went(pytester):
    result = run(pytester, """
@pytest.mark.memory_budget(peak_rss="8GiB", live_tensors="96MiB")
def test_within():
    x = allocate(64)

@pytest.mark.memory_budget(live_tensors="32MiB", census=True)
def test_over_with_census():
    with auditor.stage("load"):
        big = allocate(64)
        auditor.track("big", big)

@pytest.mark.memory_budget(peak_rss="100MiB", memray=True)
def test_over_with_memray():
    x = allocate(64)

def test_plain_passes():
    assert auditor.active_audit() is None  # nothing runs for a test without the marker

def test_plain_fails():
    assert 1 == 2
""")
    assert outcomes(result) == {"test_within": "PASSED", "test_over_with_census": "FAILED",
                                "test_over_with_memray": "FAILED", "test_plain_passes": "PASSED",
                                "test_plain_fails": "FAILED"}
    census = section(result, "test_over_with_census")
    assert "live tensors peak above the body's start 64.0 MiB in stage `test body` > budget 32.0 MiB" in census
    assert re.search(r"stage +peak RSS +live tensors peak +duration", census)
    assert re.search(r"^ +load +[\d,.]+ MiB +64\.0 MiB", census, re.M)  # the stage table, nested
    assert "top components at the end of stage `load` (census):" in census
    assert re.search(r"64\.0 MiB +big \(other\)", census)
    folder = re.search(r"run record: (\S+)/run\.json", census).group(1)
    assert folder.startswith(str(pytester.path)) and "memory-test_over_with_census" in folder
    memray = section(result, "test_over_with_memray")
    assert re.search(r"peak RSS [\d,.]+ MiB in stage `test body` > budget 100\.0 MiB", memray)
    assert re.search(r"64\.0 MiB +\S*test_inner\.py:\d+ in allocate: return torch\.ones", memray)
    plain = section(result, "test_plain_fails")
    assert "assert 1 == 2" in plain and "budget" not in plain and "run record" not in plain
    assert len(list(pytester.path.glob("**/memory-test_plain*"))) == 0


def test_ratio_budgets_multiply_the_reference_stages_peak(pytester):
    result = run(pytester, """
def allocate_in_stages(times):
    with auditor.stage("baseline"):
        reference = allocate(64)
    del reference
    with auditor.stage("variant"):
        x = allocate(round(64 * times))

@pytest.mark.memory_budget(live_tensors=1.5, stage="variant", reference="baseline")
def test_twice_the_reference():
    allocate_in_stages(2.0)

@pytest.mark.memory_budget(live_tensors="1.5x", stage="variant", reference="baseline")
def test_1_2_times_the_reference():
    allocate_in_stages(1.2)

@pytest.mark.memory_budget(live_tensors=1.5, stage="variant")
def test_no_reference_stage():
    allocate_in_stages(1.0)
""")
    assert outcomes(result) == {"test_twice_the_reference": "FAILED", "test_1_2_times_the_reference": "PASSED",
                                "test_no_reference_stage": "FAILED"}
    assert ("live tensors peak above the body's start 128.0 MiB in stage `variant` > budget 96.0 MiB "
            "(1.5x the 64.0 MiB peak of stage `baseline`)") in section(result, "test_twice_the_reference")
    assert ("a ratio budget needs the reference stage 'reference' to run in the test body"
            in section(result, "test_no_reference_stage"))


def test_stage_restricts_the_check_to_the_stages_of_that_name_or_path(pytester):
    result = run(pytester, """
def small_then_big():
    with auditor.stage("outer"):
        with auditor.stage("small"):
            x = allocate(16)
        del x
        with auditor.stage("big"):
            y = allocate(128)

@pytest.mark.memory_budget(live_tensors="64MiB", stage="small")
def test_small_fits():
    small_then_big()

@pytest.mark.memory_budget(live_tensors="64MiB", stage="outer/small")
def test_small_by_its_path_fits():
    small_then_big()

@pytest.mark.memory_budget(live_tensors="64MiB", stage="big")
def test_big_does_not_fit():
    small_then_big()

@pytest.mark.memory_budget(live_tensors="64MiB", stage="missing")
def test_a_stage_that_never_ran():
    small_then_big()
""")
    assert outcomes(result) == {"test_small_fits": "PASSED", "test_small_by_its_path_fits": "PASSED",
                                "test_big_does_not_fit": "FAILED", "test_a_stage_that_never_ran": "FAILED"}
    big = section(result, "test_big_does_not_fit")
    assert "live tensors peak above the body's start 128.0 MiB in stage `outer/big` > budget 64.0 MiB" in big
    assert re.search(r"^ +big  <- over budget", big, re.M)
    assert ("no stage 'missing' ran in the test body (stages: outer, outer/small, outer/big)"
            in section(result, "test_a_stage_that_never_ran"))


def test_a_malformed_budget_is_an_error_at_setup_and_the_body_never_runs(pytester):
    result = run(pytester, """
@pytest.mark.memory_budget(peak_rss="1.5 gigs")
def test_not_a_size():
    raise AssertionError("the body ran")

@pytest.mark.memory_budget(peak_rss=2e9)
def test_bytes_as_a_float():
    raise AssertionError("the body ran")

@pytest.mark.memory_budget(peak_rs="1GiB")
def test_a_misspelt_measure():
    raise AssertionError("the body ran")
""")
    assert outcomes(result) == {"test_not_a_size": "ERROR", "test_bytes_as_a_float": "ERROR",
                                "test_a_misspelt_measure": "ERROR"}
    assert "the body ran" not in result.stdout.str()
    assert ("@pytest.mark.memory_budget: peak_rss='1.5 gigs' is not a size: write e.g. 1.5GiB, 900MiB, "
            "512KiB, 1GB or a whole number of bytes" in section(result, "test_not_a_size"))
    assert "a ratio is above 0 and below 100" in section(result, "test_bytes_as_a_float")
    assert "unknown argument(s) peak_rs" in section(result, "test_a_misspelt_measure")


def test_the_fixture_is_the_test_bodys_audit(pytester):
    result = run(pytester, """
records = []

@pytest.fixture
def record_after(memory_audit):
    yield
    records.append(memory_audit.record)  # the whole record, once the body has returned

def test_stages_and_roots(record_after, memory_audit):
    assert auditor.active_audit() is memory_audit
    with auditor.stage("load"):
        weights = allocate(64)
        auditor.track("weights", weights)
    finished = auditor.rebuild(memory_audit.folder, write=False)["stages"]
    assert [s["path"] for s in finished] == ["test body", "test body/load"]

def test_after():
    (record,) = records
    load = record["stages"][1]
    assert load["components"]["weights"]["bytes"] == 64 * MiB
    assert load["live_tensors"]["peak"] >= 64 * MiB
""")
    assert outcomes(result) == {"test_stages_and_roots": "PASSED", "test_after": "PASSED"}


def test_a_test_inside_another_audit_joins_it_and_one_memray_tracker_per_process(pytester):
    result = run(pytester, """
@pytest.fixture
def another_audit(tmp_path):
    with auditor.Audit(out=tmp_path / "another", name="another"):
        yield

@pytest.fixture
def another_tracker(tmp_path):
    import memray
    with memray.Tracker(tmp_path / "another.bin"):
        yield

@pytest.mark.memory_budget(peak_rss="8GiB")
def test_inside_another_audit(another_audit):
    pass

@pytest.mark.memory_budget(peak_rss="8GiB", memray=True)
def test_inside_another_tracker(another_tracker):
    pass
""")
    assert outcomes(result) == {"test_inside_another_audit": "PASSED", "test_inside_another_tracker": "FAILED"}
    assert ("memray could not trace this test" in section(result, "test_inside_another_tracker"))


@pytest.mark.parametrize("kwargs, limits", [
    ({"peak_rss": "1.5GiB", "live_tensors": 900 * 2**20}, (Limit("peak_rss", bytes=1536 * 2**20),
                                                          Limit("live_tensors", bytes=900 * 2**20))),
    ({"live_tensors": 0.6}, (Limit("live_tensors", ratio=0.6),)),
    ({"live_tensors": " 1.25x "}, (Limit("live_tensors", ratio=1.25),)),
    ({"peak_rss": "1GB"}, (Limit("peak_rss", bytes=10**9),)),
])
def test_budgets_are_sizes_or_ratios(kwargs, limits):
    assert parse_budget((), kwargs).limits == limits


@pytest.mark.parametrize("kwargs, message", [
    ({"peak_rss": "1.5G"}, "peak_rss='1.5G' is not a size"),
    ({"peak_rss": True}, "peak_rss=True is not a size"),
    ({"live_tensors": 0.0}, "a ratio is above 0"),
    ({"live_tensors": "2x", "stage": ""}, "stage= names a stage"),
    ({"peak_rss": "1GiB", "census": "yes"}, "census= is True or False"),
])
def test_malformed_budgets_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_budget((), kwargs)


def test_tensors_alive_before_the_body_do_not_count_against_live_tensor_budgets(pytester):
    result = run(pytester, """
@pytest.fixture
def held():
    return allocate(64)  # made before the body: a model a fixture builds, an earlier test's leftovers

@pytest.mark.memory_budget(live_tensors="32MiB")
def test_body_adds_16(held):
    x = allocate(16)

@pytest.mark.memory_budget(live_tensors="32MiB")
def test_body_adds_48(held):
    x = allocate(48)
""")
    assert outcomes(result) == {"test_body_adds_16": "PASSED", "test_body_adds_48": "FAILED"}
    over = section(result, "test_body_adds_48")
    assert "live tensors peak above the body's start 48.0 MiB in stage `test body` > budget 32.0 MiB" in over
    assert "(64.0 MiB of tensors alive as the test body began are not counted" in over
