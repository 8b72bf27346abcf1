"""What the commands print on the terminal (rich): the lines of the stages as they end and the
summary of `auditor run`, compare's runs and table, validate-projection's tables, the steps of long
commands. Each formats a model made by analysis (auditor.report_models.terminal,
comparison_report, validation_report); nothing here reads a record.

Progress and summaries go to stderr, so stdout keeps only the command's results. rich is
imported with this module: `auditor run` imports it before the audit, not inside a stage.

The stage lines stay a screenful whatever the call count (StageLines): a line for each distinct
stage's first call, its further calls folded (on a terminal into one line redrawn in place, a
rich Live refreshed at most every REDRAW_S that leaves the program's own stdout and stderr
alone; in a log into update lines ever further apart), and a line with all of its calls at the end.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from auditor.facts.units import MiB  # GiB from 1 GiB on
from auditor.facts.units import mib_or_gib as mib
from auditor.facts.units import signed_mib_or_gib as signed_mib

if TYPE_CHECKING:
    from auditor.report_models.comparison import ComparisonReport, Run, Spread
    from auditor.report_models.terminal import ProjectionSummary, RunSummary, StageEnd, StageTally, SummaryRow
    from auditor.report_models.validation import ValidationReport

def console(*, stdout: bool = False, highlight: bool = False, piped_width: int | None = None) -> Console:
    """A console on stderr (stdout: the command's results). `piped_width`: its width when the
    stream is not a terminal (None: rich's own, from COLUMNS)."""
    stream = sys.stdout if stdout else sys.stderr
    width = None if piped_width is None or stream.isatty() else piped_width
    return _Console(stderr=not stdout, highlight=highlight, width=width)


class _Console(Console):
    """A console that falls silent when its reader has gone (`| head -1` ended). rich's own
    puts /dev/null on the process's stdout and raises SystemExit(1): under `auditor run` that
    ended the audited program, its own status and stdout taken from it."""

    def on_broken_pipe(self) -> None:
        self.quiet = True


def step(out: Console, text: str) -> None:
    """A step of a long command, as it starts (`text` is rich markup)."""
    out.print(f"[dim]auditor:[/] {text}", highlight=False)


# -- auditor run ---------------------------------------------------------------------------

MAX_STAGE_LINES = 12   # distinct stages with lines of their own; the rest share one
MAX_FAILURE_LINES = 10  # failed calls printed on a line of their own (each stage's first)
REDRAW_S = 0.2         # a terminal's lines are redrawn at most this often
FIRST_WAIT_S, LONGEST_WAIT_S = 5.0, 300.0  # a log's update lines: the wait doubles between them


def stage_ended(out: Console, stage: StageEnd) -> None:
    """One call's line, as it ended."""
    out.print(stage_markup(stage), soft_wrap=True)


def stage_markup(stage: StageEnd) -> str:
    mark = "[green]ok[/]" if stage.ok else "[red]FAILED[/]"
    return (f"[dim]auditor:[/] {mark} {escape(stage.path)}  rss {mib(stage.rss_end)} "
            f"({signed_mib(stage.rss_change)}), peak {mib(stage.rss_peak)}, {stage.seconds:.2f} s")


def tally_markup(tally: StageTally) -> str:
    """A distinct stage's calls so far, on one line: `ok g/f  5,000 calls, peak 27.7 MiB (#38), ...`."""
    mark = "[green]ok[/]" if not tally.failed else f"[red]{tally.failed:,} FAILED[/]"
    return (f"[dim]auditor:[/] {mark} {escape(tally.key)}  {tally.calls:,} calls, peak "
            f"{mib(tally.rss_peak)} (#{tally.peak_call}), rss {mib(tally.rss_end)} at the last, "
            f"{tally.seconds:.2f} s in all")


class StageLines:
    """The stage lines of `auditor run`: `lines.stage_ended(stage_end(entry))` as each stage
    ends (from the audited program, any thread), `lines.close()` once the program is over.

    A distinct stage's first call gets a line as it ends, and so does each stage's first failed
    call. Its further calls are folded: on a terminal into one line at the bottom, redrawn in
    place (the stage that ended last, its calls and running peak); in a log into an update line
    now and then, the wait doubling between them. When the program is over each repeated stage
    gets one line with all of its calls. Only one line is ever redrawn, so whatever the program
    prints on the same terminal between two redraws is never erased. Only the process that made
    it prints: a child the program forks inherits it silently."""

    def __init__(self, out: Console, clock=time.monotonic):
        from auditor.report_models.terminal import StageTallies
        self.out, self.clock = out, clock
        self.tallies = StageTallies()
        self.live = out.is_terminal and not out.is_dumb_terminal
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._display: Live | None = None
        self._live_key = ""               # the stage its line shows
        self._drawn_at = float("-inf")
        self._shown: dict[str, int] = {}  # distinct stage -> the calls its last printed line counted
        self._failures = 0                # failed calls printed on their own line
        self._wait, self._updated_at = FIRST_WAIT_S, clock()
        self._closed = False

    def stage_ended(self, stage: StageEnd) -> None:
        if os.getpid() != self._pid:
            return
        with self._lock:
            if self._closed:
                return
            tally = self.tallies.add(stage)
            if tally.calls == 1 and len(self._shown) < MAX_STAGE_LINES:
                self._shown[tally.key] = 1
                stage_ended(self.out, stage)
            elif not stage.ok and tally.failed == 1 and self._failures < MAX_FAILURE_LINES:
                self._failures += 1  # a failure is never only folded into a count
                stage_ended(self.out, stage)
            elif tally.key in self._shown:
                self._fold(tally)

    def close(self) -> None:
        """Each stage whose last line did not count all of its calls gets one that does."""
        with self._lock:
            if self._closed or os.getpid() != self._pid:
                return
            self._closed = True
            if self._display is not None:  # its last drawing: all the calls of the stage it shows
                tally = self.tallies.by_key[self._live_key]
                self._display.update(_one_line(tally_markup(tally)), refresh=True)
                self._display.stop()  # kept: a transient one would move the cursor up, over the program's output
                self._shown[tally.key] = tally.calls
            for tally in list(self.tallies.by_key.values())[:MAX_STAGE_LINES]:
                if self._shown.get(tally.key, 0) < tally.calls:
                    self.out.print(tally_markup(tally), soft_wrap=True)
            rest = list(self.tallies.by_key.values())[MAX_STAGE_LINES:]
            if rest:
                self.out.print(_more_markup(rest), soft_wrap=True)

    def _fold(self, tally: StageTally) -> None:
        now = self.clock()
        if self.live:
            if now - self._drawn_at < REDRAW_S:
                return
            self._drawn_at = now
            self._live_key, line = tally.key, _one_line(tally_markup(tally))
            if self._display is None:  # no refresh thread, no redirection: the program's streams stay its own
                self._display = Live(line, console=self.out, auto_refresh=False,
                                     redirect_stdout=False, redirect_stderr=False)
                self._display.start(refresh=True)
            else:
                self._display.update(line, refresh=True)
            return
        if now - self._updated_at < self._wait:
            return
        self._updated_at, self._wait = now, min(self._wait * 2, LONGEST_WAIT_S)
        self._shown[tally.key] = tally.calls
        self.out.print(tally_markup(tally) + " [dim](so far)[/]", soft_wrap=True)


def _one_line(markup: str) -> Text:
    """Never wrapped: a line redrawn in place must be one line, or its first half stays behind."""
    line = Text.from_markup(markup, overflow="ellipsis")
    line.no_wrap = True
    return line


def _more_markup(rest: list[StageTally]) -> str:
    top = max(rest, key=lambda t: t.rss_peak)
    return (f"[dim]auditor:[/] {len(rest):,} more stages, {sum(t.calls for t in rest):,} calls "
            f"(the highest peak {mib(top.rss_peak)} in {escape(top.key)}); each is in the run record")


def run_summary(out: Console, summary: RunSummary) -> None:
    """The stage table, then where the peak was and where the run's files are."""
    table = _stage_table(summary, whole_names=not out.is_terminal)
    # a log has no width of its own: the table takes what its names need, never cut mid-word
    width = out.width
    if not out.is_terminal:
        out.width = max(width, Measurement.get(out, out.options.update_width(10_000), table).maximum)
    try:
        out.print(table)
    finally:
        out.width = width
    if summary.more_rows:
        _line(out, f"... {summary.more_rows:,} more rows ({summary.more_stages:,} stages) with lower peaks: "
                   f"auditor report {summary.folder} lists them")
    if len(summary.rows) + summary.more_rows < summary.stages:
        rows = len(summary.rows) + summary.more_rows
        _line(out, f"({summary.stages:,} stages in {rows:,} row{'s' if rows > 1 else ''}: repeated "
                   "calls folded, delta and time summed over the calls; each call is in the run record)")
    where = summary.peak_where.replace("`", "")  # in stage X, after the last stage (X), ...
    _line(out, f"peak RSS {mib(summary.peak_rss)} {where}; started at {mib(summary.rss_at_start)}")
    children = summary.children
    if children is not None:  # never counted above: the process's own RSS
        parts = ([f"the largest that ended peaked at {mib(children.largest_ended_peak_rss)}"]
                 if children.largest_ended_peak_rss is not None else [])
        if children.alive_at_end:
            own = children.alive_uss_at_end
            parts.append(f"{children.alive_at_end} running at the end held {mib(children.alive_rss_at_end)}"
                         + (f", {mib(own)} of it their own (USS)" if own is not None else ""))
        _line(out, f"child processes (not audited, not in these figures): {'; '.join(parts)}")
    top = summary.top_site
    if top is not None:  # only files that exist are named
        _line(out, f"memray: top site at the high-water mark {top.location} ({mib(top.bytes)}); "
                   f"flamegraph {summary.flamegraph or 'not written'}")
    trace = summary.profiler_trace
    if trace is not None:
        _line(out, f"torch profiler trace: {trace}; view it with tensorboard --logdir {trace.parent}")
    if summary.run_json is not None:
        _line(out, f"run record: {summary.run_json}")
        return
    folder, events = summary.folder, summary.event_log
    held = "every event" if summary.event_log_complete else "the events written before it failed"
    kept = (f"{events} holds {held}; `auditor report {folder}` renders them and `auditor rebuild {folder}` "
            "writes run.json once there is space") if events is not None else "no event log either"
    _line(out, f"run record: not written (see the warning above); {kept}")


def _stage_table(summary: RunSummary, whole_names: bool) -> Table:
    """`whole_names`: the stage column never wraps (a log's table is as wide as it needs); on a
    terminal, narrower than the table, names fold at its edge."""
    table = Table(title=f"auditor: {summary.name}", title_justify="left")
    table.add_column("stage", no_wrap=whole_names, overflow="fold")
    for column in ("calls", "RSS end", "delta", "peak inside", "time"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("at call", overflow="fold", max_width=40)  # which call had the highest peak
    for row in summary.rows:  # a stage is its name indented under its parent, as in a profiler
        table.add_row(escape("  " * row.depth + row.name + _not_ok(row)), f"{row.calls:,}", mib(row.rss_end),
                      signed_mib(row.rss_change), mib(row.rss_peak), f"{row.seconds:.2f} s",
                      escape(_which_call(row)))
    return table


def _not_ok(row: SummaryRow) -> str:
    if not row.not_ok:
        return ""
    return f" [{row.last_status if row.calls == 1 else f'{row.not_ok} not ok'}]"


def _which_call(row: SummaryRow) -> str:
    """Where a folded row's highest peak was: `#113 model.layers.3.mlp.down_proj`, `2 of 3`."""
    if row.calls == 1:
        return ""
    call = row.highest_call
    if call is None:
        return f"{row.highest} of {row.calls}"
    return f"#{call.index}" + (f" {call.label}" if call.label else "")


def projection_summary(out: Console, summary: ProjectionSummary) -> None:
    rank = (f" as {summary.as_rank} (fake process group: the backend's own collective buffers not traced)"
            if summary.as_rank else "")
    if summary.failed is not None:  # its figures stop part-way: none is the target's peak
        _line(out, f"traced projection to {summary.target}{rank}: {summary.failed}; no figure for the target "
                   "(the stages it finished: auditor report)")
    else:
        _line(out, f"traced projection to {summary.target}{rank}: peak live tensors {mib(summary.live_tensor_peak)}, "
                   f"peak RSS {mib(summary.peak_rss)}{_band(summary.rss_band)} in stage {summary.peak_stage}")
        if summary.stand_in:
            _line(out, f"  target model: {summary.stand_in}")
    _line(out, f"per stage and component: auditor report {summary.folder}")


def _band(band: tuple[int, int] | None) -> str:
    return f" (band {mib(band[0])} to {mib(band[1])})" if band else ""


def _line(out: Console, text: str) -> None:
    """Plain text, whatever brackets it holds, never wrapped."""
    out.print(text, markup=False, soft_wrap=True)


# -- auditor compare -----------------------------------------------------------------------

def comparison_run(out: Console, run: Run, total: int) -> None:
    """A run of the comparison as it ends (auditor.report_models.comparison.finished_run)."""
    _line(out, f"compare: [{run.order}/{total}] {run.side} run {run.repeat}: peak "
               f"{mib(run.peak_rss)}, loaded {mib(run.loaded_rss)}, {run.wall_s:.2f} s, {run.agreement} "
               f"(load {run.load_1min:.2f})")


def comparison(out: Console, report: ComparisonReport) -> None:
    """Each side's medians and ranges, then each variant's verdict."""
    table = Table(title=f"compare: {report.name} (median of {report.setting.repeats}; min-max)",
                  title_justify="left")
    for column in ("side", "peak RSS MiB", "loaded MiB", "peak over loaded MiB", "wall s"):
        table.add_column(column, justify="left" if column == "side" else "right", overflow="fold")
    for side in report.sides:
        table.add_row(escape(side.name), _spread(side.peak_rss, MiB), _spread(side.loaded_rss, MiB),
                      _spread(side.overhead, MiB), _spread(side.wall_s, 1, 1))
    out.print(table)
    for v in report.variants:
        mark = "[red]FAIL[/]" if v.failed else "[green]ok[/]"
        ratios = (f"peak x{v.peak_ratio:.3f}" if v.peak_ratio is not None else "") + (
            f", overhead x{v.overhead_ratio:.3f}" if v.overhead_ratio is not None else "")
        out.print(f"{mark} {escape(v.name)}: {ratios}; {escape(v.why)}", soft_wrap=True)


def _spread(spread: Spread | None, unit: float, digits: int = 0) -> str:
    """The median over min-max, in `unit`."""
    if spread is None:
        return "-"
    return (f"{spread.median / unit:,.{digits}f}\n"
            f"{spread.min / unit:,.{digits}f}-{spread.max / unit:,.{digits}f}")


# -- auditor validate-projection -----------------------------------------------------------

def validation(out: Console, report: ValidationReport, output: Path) -> None:
    """The scale-up, the tables of the markdown report, and where it and the runs are."""
    from auditor.renderers.validation_markdown import tables  # not needed by `auditor run`
    low, high = report.scale_up_range
    note = "" if report.in_range else f" (the targets are stated for {low:g}x to {high:g}x)"
    out.print(f"[bold]{report.small.label} -> {report.target.label}[/]: "
              f"{report.scale_up:.1f}x parameters{note}", highlight=False)
    titles = {"targets": "Targets", "peaks": "Peaks", "stages": "Peak inside each stage",
              "components": f"Components at the end of {report.components_stage}"}
    for name, (headers, rows) in tables(report).items():
        table = Table(title=titles[name], title_justify="left")
        for i, header in enumerate(headers):
            left = i == 0 or header in ("category", "target", "method")
            table.add_column(header, justify="left" if left else "right")
        for row in rows:
            table.add_row(*row)
        out.print(table)
    out.print(f"report: {output}\nruns: {report.folder}", highlight=False)
