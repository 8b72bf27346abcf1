"""What `auditor run` says on the terminal, computed from the record: each distinct stage as
its calls end (calls folded: a function staged 5,000 times is one tally, not 5,000 lines), the
summary when the script is over (the stage table with repeated calls folded, the peak, where
memray's flamegraph, the profiler's trace and the run record are), and the traced projection's
headline.

    tallies = StageTallies(); tally = tallies.add(stage_end(entry))  # tally.calls, tally.peak
    summary = run_summary(record, folder, run_json=None)   # None: run.json not written
    summary.rows[0].calls, summary.peak_rss, summary.flamegraph, summary.more_rows, ...

auditor.renderers.terminal formats them. The table is the report's rows (stage_groups) without
its unstaged rows, at most MAX_ROWS of them (the highest peaks, with their parents): the rest
are counted under it, and each is in the report.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from auditor.record.derived import Projection
from auditor.record.run_folder import EVENTS_FILE, load
from auditor.record.schema import Call, Children, RunRecord, RunRecordError, Site, Stage
from auditor.report_models.shown_names import as_shown, escaped

MAX_ROWS = 24  # the stage table's rows on a terminal: with the lines above it, a screenful
_CALL_NUMBERS = re.compile(r"#\d+(?=/|$)")


@dataclass
class StageEnd:
    """A stage as it closes, from the live audit's entry (the record is not written yet)."""
    path: str
    ok: bool
    rss_end: int
    rss_change: int                # end - start
    rss_peak: int
    seconds: float
    key: str = ""                  # the distinct stage: the path without call numbers (`g/f`)

    def __post_init__(self) -> None:
        self.key = self.key or _CALL_NUMBERS.sub("", self.path)


@dataclass
class StageTally:
    """The calls of one distinct stage so far, as the live audit ends them."""
    key: str
    calls: int = 0
    failed: int = 0
    rss_end: int = 0               # the last call's
    rss_change: int = 0            # the last call's
    rss_peak: int = 0              # the highest of any call
    peak_call: int = 1             # which call had it, counting from 1
    seconds: float = 0.0           # summed over the calls
    last: StageEnd | None = field(default=None, repr=False)


class StageTallies:
    """Distinct stages in the order their first call ended; each call folded into its tally."""

    def __init__(self) -> None:
        self.by_key: dict[str, StageTally] = {}

    def add(self, end: StageEnd) -> StageTally:
        tally = self.by_key.get(end.key)
        if tally is None:
            tally = self.by_key[end.key] = StageTally(end.key)
        tally.calls += 1
        tally.failed += not end.ok
        tally.rss_end, tally.rss_change, tally.seconds = end.rss_end, end.rss_change, tally.seconds + end.seconds
        if tally.calls == 1 or end.rss_peak > tally.rss_peak:
            tally.rss_peak, tally.peak_call = end.rss_peak, tally.calls
        tally.last = end
        return tally

    @property
    def calls(self) -> int:
        return sum(tally.calls for tally in self.by_key.values())


@dataclass
class SummaryRow:
    """A row of the stage table: one stage, or the repeated calls of one callable."""
    name: str                      # the staged callable, else the stage name without `#n`
    depth: int                     # under its parent's row
    calls: int
    not_ok: int                    # calls that did not end ok
    last_status: str               # the last call's status
    rss_end: int | None            # the last call's
    rss_change: int                # summed over the calls (a call never finished counts 0)
    rss_peak: int | None           # the highest of any call
    seconds: float                 # summed over the calls
    highest: int                   # which call had that peak, counting from 1
    highest_call: Call | None      # and its staged call, when it was one


@dataclass
class RunSummary:
    name: str
    rows: list[SummaryRow]
    stages: int                    # stages in the record (more than rows: calls folded)
    peak_rss: int | None
    peak_where: str                # "in stage `X`", "after the last stage (`X`)": code spans
    rss_at_start: int | None
    top_site: Site | None          # memray's largest site at its high-water mark
    flamegraph: Path | None        # None: not written
    profiler_trace: Path | None    # the torch profiler's trace, when written
    folder: Path
    run_json: Path | None          # None: not written
    event_log: Path | None         # kept when run.json was not written
    event_log_complete: bool
    children: Children | None = None  # child processes' memory, outside the record's figures
    more_rows: int = 0             # rows left out of `rows` (lower peaks), and their stages
    more_stages: int = 0


@dataclass
class ProjectionSummary:
    """The traced projection's headline (`auditor.jobs.script_projection.project_program`)."""
    target: str
    live_tensor_peak: int | None
    peak_rss: int | None
    peak_stage: str | None
    incomplete: str | None         # where the trace stopped
    folder: Path                   # the run folder, which the full report is made from
    as_rank: str | None = None     # "rank R of N": traced on torch's fake process group
    failed: str | None = None      # "failed at stage X: reason": its figures are not the target's peak
    stand_in: str | None = None    # the target model is a stand-in architecture, in a sentence
    rss_band: tuple[int, int] | None = None  # (low, high) the peak RSS may take (auditor.analysis.projection.rss_band)


def stage_end(entry: dict) -> StageEnd:
    rss = entry["rss"]
    return StageEnd(escaped(entry["path"]), entry["status"] == "ok", rss["end"], rss["end"] - rss["start"],
                    rss["peak"], entry["end_s"] - entry["start_s"])


def shown_rows(rows: list[SummaryRow], limit: int = MAX_ROWS) -> list[SummaryRow]:
    """At most `limit` rows, in reading order: the highest peaks first chosen, each with the
    rows it sits under, so that an indented name always has its parent above it."""
    if len(rows) <= limit:
        return rows
    parents: list[int | None] = []
    open_at: list[int] = []  # the index of the last row seen at each depth
    for i, row in enumerate(rows):
        del open_at[row.depth:]
        parents.append(open_at[-1] if open_at else None)
        open_at.append(i)
    chosen: set[int] = set()
    for i in sorted(range(len(rows)), key=lambda i: -(rows[i].rss_peak or 0)):  # stable: earlier first on a tie
        line = []
        at: int | None = i
        while at is not None and at not in chosen:
            line.append(at)
            at = parents[at]
        if len(chosen) + len(line) > limit:
            continue
        chosen.update(line)
    return [row for i, row in enumerate(rows) if i in chosen]


def run_summary(record: RunRecord, folder: Path, run_json: Path | None) -> RunSummary:
    """`folder`: the run folder, where the files the record names are; `run_json`: None when
    run.json could not be written (the event log then says what the run did)."""
    record = as_shown(record)  # stage names shown with their control characters escaped
    # imported once the script is over: before it, they would count in the audit's memory
    from auditor.analysis.run.stage_groups import fold_key, stage_rows
    from auditor.analysis.run.unstaged import peak_place
    memray = record.memray
    top = memray.sites[0] if memray is not None and memray.sites else None
    flamegraph = folder / (memray.flamegraph or "-") if memray is not None else None
    trace = (record.files or {}).get("torch_profiler")
    events = folder / EVENTS_FILE
    rows = [_row(row.stages, row.depth, fold_key(row.stages[0])) for row in stage_rows(record)]
    shown = shown_rows(rows)
    return RunSummary(
        name=record.name, rows=shown, more_rows=len(rows) - len(shown),
        more_stages=sum(row.calls for row in rows) - sum(row.calls for row in shown),
        stages=len(record.stages), peak_rss=record.peak.rss, peak_where=peak_place(record).phrase,
        rss_at_start=record.process.rss_at_start, top_site=top,
        flamegraph=flamegraph if flamegraph is not None and flamegraph.is_file() else None,
        profiler_trace=folder / trace if trace and (folder / trace).is_file() else None,
        folder=folder, run_json=run_json,
        event_log=events if run_json is None and events.is_file() else None,
        event_log_complete=record.event_log is not None and record.event_log.state == "complete",
        children=record.process.children)


def _row(calls: list[Stage], depth: int, name: str) -> SummaryRow:
    highest, top = max(enumerate(calls, 1), key=lambda pair: pair[1].rss.peak or 0)  # the first, on a tie
    return SummaryRow(
        name=name, depth=depth, calls=len(calls),
        not_ok=sum(call.status != "ok" for call in calls), last_status=calls[-1].status,
        rss_end=calls[-1].rss.end, rss_change=sum(_rss_change(call) for call in calls), rss_peak=top.rss.peak,
        seconds=sum(_duration(call) for call in calls), highest=highest, highest_call=top.call)


def _rss_change(stage: Stage) -> int:
    """RSS end - start; 0 for a stage never finished (a live audit finishes all of its stages)."""
    return 0 if stage.rss.end is None or stage.rss.start is None else stage.rss.end - stage.rss.start


def _duration(stage: Stage) -> float:
    return 0.0 if stage.end_s is None else stage.end_s - stage.start_s


def projection_summary(projection: Projection, folder: Path) -> ProjectionSummary:
    """A traced run that stopped part-way gives no figure: where it failed (the stage read from
    its own record in `folder`, where that is readable)."""
    from auditor.analysis.projection.standing import stand_in, traced_failure
    peak = projection.get("peak") or {}
    as_rank = projection.get("traced_as_rank")
    failed = traced_failure(projection, _traced_record(projection, folder)) if projection.get("incomplete") else None
    return ProjectionSummary(projection["target"], projection.get("live_tensor_peak"), peak.get("rss"),
                             peak.get("stage"), projection.get("incomplete") or None, folder,
                             f"rank {as_rank['rank']} of {as_rank['world_size']}" if as_rank else None,
                             failed.plain if failed is not None else None, stand_in(projection),
                             _band(peak.get("rss_band")))


def _band(band) -> tuple[int, int] | None:
    if isinstance(band, dict) and isinstance(band.get("low"), int) and isinstance(band.get("high"), int):
        return band["low"], band["high"]
    return None


def _traced_record(projection: Projection, folder: Path) -> RunRecord | None:
    """The traced run's own record (its stages' statuses), None where it cannot be read."""
    traced = projection.get("run_folder")
    if not traced:
        return None
    try:
        return load(Path(folder) / traced, from_events=True)
    except (RunRecordError, OSError):
        return None
