"""Memory budgets in pytest: a test fails when its body uses more memory than it may.

Installed with the package (a `pytest11` entry point), so every test in the environment can say:

    @pytest.mark.memory_budget(peak_rss="1.5GiB", live_tensors="900MiB", stage="prune")
    def test_prune_fits(model, batches):
        with auditor.stage("prune"):
            prune(model, batches)

The test body runs under an `auditor.Audit` (one wrapping stage, "test body"), whose run record
goes to a folder under pytest's temporary directory.

Budgets, each checked against the peak of every matching stage:
    peak_rss       the highest RSS inside the stage (the whole process's: interpreter and
                   libraries included): the kernel's high-water mark, reset as the stage opens, so
                   a higher RSS the process reached before the test does not count.
    live_tensors   the highest live tensor-storage bytes inside the stage (switches the
                   live-tensor meter on), above those alive when the test body began: tensors
                   made by fixtures or left by earlier tests do not count.
  Each is a size or a ratio. A size is an int (bytes) or a string with its unit: "1.5GiB",
  "900MiB", "512KiB", "1GB". A ratio is a float or a string ending in "x" (0.6 or "0.6x"): that
  many times the same measure's peak in the reference stage of the same test, so the budget holds
  on any machine. One rule, no guessing from magnitudes: ints are bytes, floats are ratios (a
  float of 100 or more is an error, not a ratio).

Where and against what:
    stage="prune"         the stages named so, or with that path below the test body
                          ("gradients/original"); without it, the whole test body.
    reference="baseline"  the stage whose peaks ratio budgets multiply (default "reference"):
                          run the code to compare with inside `with auditor.stage("baseline"):`.

    @pytest.mark.memory_budget(live_tensors="0.6x", stage="lean", reference="baseline")
    def test_lean_saves_memory():
        with auditor.stage("baseline"):
            run("baseline")
        with auditor.stage("lean"):
            run("lean")

Options: census=True takes a tensor census at each stage end, so a failure lists the largest
components (name `auditor.track` roots to see your own structures); memray=True traces the body
with memray, so a failure lists the top allocation sites. Over budget, the failure shows the
stage table (peak RSS, live-tensor peak, duration), those components or sites, and the run record
(`auditor report RUN.json` renders the full report). A malformed marker is an error at the
test's setup; its body does not run.

The fixture `memory_audit` is the test body's `auditor.Audit` (census and live-tensor meter on
unless the marker says census=False), with or without a marker: add stages and `auditor.track`
roots; `auditor.rebuild(memory_audit.folder, write=False)` reads the stages finished so far, and
`memory_audit.record` holds the whole record once the body has returned (in a fixture's teardown).

Under another audit (`auditor run -m pytest ...`, or a test inside the program's own Audit) the
test's audit is nested, joined to the running one (auditor.capture.nested_audit): a stage of that
run named after the test, with a record of its own that the budget is checked against, so a test
passes and fails as it does alone. The live-tensor meter is lent for the body when the running
audit lacks it; the census and memray cannot be (one set of probes per process): without them
a failure lists no components or sites, the fixture's default census is left out, and
memray=True fails saying why. Tests with neither the
marker nor the fixture are not touched. This module imports no torch; the audit is built only
for tests that ask for it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from auditor.capture.audit import Audit  # already loaded with the package: costs nothing more
from auditor.capture.stage import active_audit, stage
from auditor.facts import units
from auditor.record.schema import RunRecord, Stage

MARKER = "memory_budget"
BODY = "test body"
DEFAULT_REFERENCE = "reference"
MEASURES = {"peak_rss": ("rss", "peak RSS"),
            "live_tensors": ("live_tensors", "live tensors peak above the body's start")}
OPTIONS = ("stage", "reference", "census", "memray")
MAX_RATIO = 100  # a float this large is bytes written without a unit, not a ratio
TOP = 5

_BUDGET = pytest.StashKey["Budget | None"]()
_AUDIT = pytest.StashKey[object]()


# -- the marker ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Limit:
    """One budget: `bytes`, or `ratio` times the reference stage's peak of the same measure."""
    measure: str
    bytes: int | None = None
    ratio: float | None = None

    def allowed(self, reference_peak: int | None) -> int:
        if self.ratio is not None:
            if reference_peak is None:  # enforce reads every measure's reference peak first
                raise ValueError(f"{self.measure}: a ratio budget without its reference stage's peak")
            return round(self.ratio * reference_peak)
        if self.bytes is None:  # parse_limit gives every limit a ratio or bytes
            raise ValueError(f"{self.measure}: a budget with neither bytes nor a ratio")
        return self.bytes

    def describe(self, reference: str, reference_peak: int | None) -> str:
        if self.ratio is None:
            return units.size(self.bytes)
        return (f"{units.size(self.allowed(reference_peak))} ({self.ratio:g}x the "
                f"{units.size(reference_peak)} peak of stage `{reference}`)")


@dataclass(frozen=True)
class Budget:
    limits: tuple[Limit, ...]
    stage: str | None = None
    reference: str = DEFAULT_REFERENCE
    census: bool | None = None
    memray: bool = False

    @property
    def needs_reference(self) -> bool:
        return any(limit.ratio is not None for limit in self.limits)


def parse_budget(args: tuple, kwargs: dict) -> Budget:
    """The marker's arguments as a Budget; ValueError (one line) for anything malformed."""
    if args:
        raise ValueError(f"takes keyword arguments only (peak_rss=..., live_tensors=...), got {args!r}")
    unknown = sorted(set(kwargs) - set(MEASURES) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown argument(s) {', '.join(unknown)}; known: "
                         f"{', '.join([*MEASURES, *OPTIONS])}")
    limits = tuple(parse_limit(m, kwargs[m]) for m in MEASURES if kwargs.get(m) is not None)
    for name in ("stage", "reference"):
        if name in kwargs and (not isinstance(kwargs[name], str) or not kwargs[name]):
            raise ValueError(f"{name}= names a stage: a non-empty string, got {kwargs[name]!r}")
    for name in ("census", "memray"):
        if name in kwargs and not isinstance(kwargs[name], bool):
            raise ValueError(f"{name}= is True or False, got {kwargs[name]!r}")
    return Budget(limits, stage=kwargs.get("stage"),
                  reference=kwargs.get("reference", DEFAULT_REFERENCE),
                  census=kwargs.get("census"), memray=kwargs.get("memray", False))


def parse_limit(measure: str, value) -> Limit:
    ratio = _ratio(value)
    if ratio is not None:
        if not 0 < ratio < MAX_RATIO:
            raise ValueError(f"{measure}={value!r}: a ratio is above 0 and below {MAX_RATIO} "
                             "(for a size in bytes give an int or a string with its unit)")
        return Limit(measure, ratio=ratio)
    try:
        return Limit(measure, bytes=units.parse_size(value))
    except ValueError as error:
        raise ValueError(f"{measure}={error}; or a ratio to the reference stage: 0.6 or '0.6x'") from None


def _ratio(value) -> float | None:
    """The ratio a float or an "0.6x" string means; None for anything else."""
    if isinstance(value, float):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]*\.?[0-9]+\s*x\s*", value):
        return float(value.strip()[:-1])
    return None


def _budget(item) -> Budget | None:
    """The item's parsed marker (parsed once); a malformed one fails the test at setup."""
    if _BUDGET in item.stash:
        return item.stash[_BUDGET]
    marker = item.get_closest_marker(MARKER)
    item.stash[_BUDGET] = None  # a malformed marker fails the test once, at setup
    if marker is None:
        return None
    try:
        budget = parse_budget(marker.args, marker.kwargs)
    except ValueError as error:
        problem = str(error)
    else:
        item.stash[_BUDGET] = budget
        return budget
    pytest.fail(f"@pytest.mark.{MARKER}: {problem}", pytrace=False)  # outside `except`: no chained traceback


# -- hooks and fixture ---------------------------------------------------------------------

def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(peak_rss=None, live_tensors=None, stage=None, reference='reference', census=None, "
        "memray=False): fail the test when its body (or the named stage) goes over a memory budget, "
        "a size ('1.5GiB') or a ratio to the reference stage (0.6 or '0.6x'); see auditor.pytest_plugin")


def pytest_runtest_setup(item) -> None:
    _budget(item)


@pytest.fixture
def memory_audit(request, tmp_path_factory):
    """The test body's `auditor.Audit`: active from the body's first line to its last."""
    audit = request.node.stash[_AUDIT] = _new_audit(request.node, tmp_path_factory, fixture=True)
    return audit


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    budget, audit = item.stash.get(_BUDGET, None), item.stash.get(_AUDIT, None)
    if budget is None and audit is None:
        return (yield)
    if audit is None:
        # What the tmp_path_factory fixture returns; a hook has no fixture request to ask.
        audit = _new_audit(item, item.config._tmp_path_factory, fixture=False)
    with audit, stage(BODY):
        result = yield
    if budget is not None:
        enforce(budget, RunRecord.from_json(audit.record, str(audit.run_json)), audit.run_json)
    return result


def _new_audit(item, tmp_path_factory, fixture: bool) -> Audit:
    budget = _budget(item)
    measures = {limit.measure for limit in budget.limits} if budget else set()
    # The fixture's census is a default: under an audit without one (`auditor run` without --census) it
    # cannot run, and goes without a warning; census=True on the marker warns (auditor.capture.nested_audit).
    running = active_audit()
    census = (budget.census if budget and budget.census is not None
              else fixture and (running is None or bool(running.options["census"])))
    folder = tmp_path_factory.mktemp("memory-" + re.sub(r"[^\w.-]", "_", item.name)[:40])
    return Audit(out=folder, name=item.name, command=f"pytest {item.nodeid}", census=census,
                 live_tensors=fixture or "live_tensors" in measures,
                 memray=bool(budget and budget.memray))


# -- checking the record -------------------------------------------------------------------

def enforce(budget: Budget, record: RunRecord, run_json) -> None:
    """Fail the test, showing where the memory went, if any matching stage is over budget."""
    _check_memray(budget, record)
    stages = _matching(record, budget.stage) if budget.stage else _matching(record, BODY)
    if not stages:
        pytest.fail(f"{MARKER}: no stage {budget.stage!r} ran in the test body (stages: "
                    f"{', '.join(_relative(s.path) for s in record.stages[1:]) or 'none'})",
                    pytrace=False)
    _check_measured(budget, record, stages)
    floors = _floors(record)
    reference = _reference_peaks(budget, record, floors)
    overruns = [(limit, stage, _peak(stage, limit.measure, floors), reference.get(limit.measure))
                for limit in budget.limits for stage in stages
                if _peak(stage, limit.measure, floors) > limit.allowed(reference.get(limit.measure))]
    if overruns:
        pytest.fail(explain(budget, record, overruns, run_json), pytrace=False)


def _check_memray(budget: Budget, record: RunRecord) -> None:
    probe = (record.probes or {}).get("memray")
    state = probe.state if probe is not None else None
    if budget.memray and state != "on":
        why = probe.reason if probe is not None and probe.reason is not None else state
        pytest.fail(f"{MARKER}(memray=True): memray could not trace this test: "
                    f"{why}. Only one memray tracker can run per "
                    "process (not under `pytest --memray` or `memray run`)", pytrace=False)


def _check_measured(budget: Budget, record: RunRecord, stages: list[Stage]) -> None:
    """A budget whose measure has no figure fails saying why: a missing figure is no pass."""
    for limit in budget.limits:
        field = MEASURES[limit.measure][0]
        if any(getattr(s, field) is None for s in stages):
            probe = (record.probes or {}).get(field)
            why = (probe.reason or probe.state) if probe is not None else "no such probe"
            pytest.fail(f"{MARKER}({limit.measure}=...): {MEASURES[limit.measure][1]} could not be measured "
                        f"in this test: {why}", pytrace=False)


def _reference_peaks(budget: Budget, record: RunRecord, floors: dict[str, int]) -> dict[str, int]:
    if not budget.needs_reference:
        return {}
    stages = _matching(record, budget.reference)
    if not stages:
        pytest.fail(f"{MARKER}: a ratio budget needs the reference stage {budget.reference!r} to run "
                    f"in the test body: wrap the code to compare with in "
                    f"`with auditor.stage({budget.reference!r}):`", pytrace=False)
    return {measure: max(_peak(s, measure, floors) for s in stages) for measure in MEASURES}


def _matching(record: RunRecord, name: str) -> list[Stage]:
    return [s for s in record.stages if name in (s.name, _relative(s.path))]


def _relative(path: str) -> str:
    """A stage's path below the test body's wrapping stage."""
    return path.removeprefix(BODY + "/")


def _floors(record: RunRecord) -> dict[str, int]:
    """What each measure does not count: for live tensors, those alive as the body began
    (fixtures' and earlier tests' tensors), so a budget holds whatever ran before the test."""
    body = next((s for s in record.stages if s.path == BODY), None)
    live = body.live_tensors if body is not None else None
    return {"live_tensors": (live.start if live is not None else None) or 0}


def _peak(stage: Stage, measure: str, floors: dict[str, int] | None = None) -> int:
    readings = getattr(stage, MEASURES[measure][0])  # rss or live_tensors (None: meter off)
    peak = (readings.peak if readings is not None else None) or 0
    return max(0, peak - (floors or {}).get(measure, 0))


# -- the failure message -------------------------------------------------------------------

def explain(budget: Budget, record: RunRecord, overruns: list, run_json) -> str:
    lines = [f"memory budget exceeded in {record.name}:"]
    for limit, over, peak, reference_peak in overruns:
        lines.append(f"  {MEASURES[limit.measure][1]} {units.size(peak)} in stage "
                     f"`{_relative(over.path)}` > budget "
                     f"{limit.describe(budget.reference, reference_peak)}")
    floor = _floors(record)["live_tensors"]
    if floor and any(limit.measure == "live_tensors" for limit, *_ in overruns):
        lines.append(f"  ({units.size(floor)} of tensors alive as the test body began are not counted; "
                     "the table shows whole peaks)")
    worst = {id(stage) for _, stage, _, _ in overruns}
    limit, stage = overruns[0][:2]
    lines += ["", *stage_table(record, worst), "", *where_it_went(record, peak_holder(record, stage, limit.measure))]
    lines += ["", f"run record: {run_json}  (report: auditor report {run_json} -o report.md)"]
    return "\n".join(lines)


def stage_table(record: RunRecord, over: set[int]) -> list[str]:
    rows = [["stage", "peak RSS", "live tensors peak", "duration"]]
    for s in record.stages:
        depth = s.path.count("/")
        duration = None if s.end_s is None else s.end_s - s.start_s
        live = s.live_tensors.peak if s.live_tensors is not None else None
        rows.append(["  " * depth + s.name + ("  <- over budget" if id(s) in over else ""),
                     units.size(s.rss.peak), units.size(live), units.seconds(duration)])
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return ["  " + "  ".join([row[0].ljust(widths[0])]
                             + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=False)])
            for row in rows]


def peak_holder(record: RunRecord, stage: Stage, measure: str) -> Stage:
    """The innermost stage within `stage` that reached its peak: its census (taken at its end)
    shows what made the peak, where the outer stage's end may have freed it all."""
    inside = [s for s in record.stages
              if s.path == stage.path or s.path.startswith(stage.path + "/")]
    holders = [s for s in inside if _peak(s, measure) == _peak(stage, measure)]
    return max(holders, key=lambda s: s.path.count("/"))


def where_it_went(record: RunRecord, stage: Stage) -> list[str]:
    lines = []
    if stage.components is not None:
        lines.append(f"top components at the end of stage `{_relative(stage.path)}` (census):")
        ranked = sorted(stage.components.items(), key=lambda kv: kv[1].bytes, reverse=True)
        lines += [f"  {units.size(c.bytes):>12}  {name} ({c.category})" for name, c in ranked[:TOP]]
        lines += ["  (no tensors alive at its end)"] * (not ranked)
    memray = record.memray
    if memray is not None:
        where = f" (in stage `{_relative(memray.stage)}`)" if memray.stage else ""
        lines.append(f"top allocation sites alive at the run's memray peak{where}:")
        lines += [f"  {units.size(site.bytes):>12}  {site.location} in {site.function}"
                  + (f": {site.code}" if site.code else "") for site in memray.sites[:TOP]]
    if not lines:
        lines.append("(mark with census=True to see the largest components, memray=True for the "
                     "allocation sites)")
    return lines
