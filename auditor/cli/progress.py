"""What long commands show while they work, on stderr (stdout keeps only the command's results).

- StatusLine: the steps of a job, each printed as it starts, the one running shown with its
  time on a terminal; the stages an in-process audit ends named in that line as they end, none
  printed but each distinct stage's first failed call (`auditor run` prints more of them:
  auditor.renderers.terminal.StageLines).
- ChildProgress: a child process that writes run records (a traced run on fake tensors, the
  calibration runs), followed from its event logs while the parent waits: how many stages
  (or runs) it finished of how many expected, the stage it is in, the time spent and left.
  On a terminal a rich progress bar; in a log a line now and then, the wait doubling between
  lines, so that an hour's run prints a dozen.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from auditor.record.run_folder import EVENTS_FILE

POLL_S = 0.5
FIRST_WAIT_S, LONGEST_WAIT_S = 10.0, 300.0  # a log's progress lines: the wait doubles between them


class StatusLine:
    """`with StatusLine() as advance:` then `advance("tracing")` prints and shows each step,
    `advance.stage_ended(entry)` names the stage running in the status line (a failed call is
    printed, once per distinct stage), `with advance.follow(reader, expected, unit):` counts a
    child's stages or runs in it (ChildProgress)."""

    def __enter__(self):
        from auditor.renderers.terminal import console
        from auditor.report_models.terminal import StageTallies
        self._console = console(highlight=True)
        self._bar = progress_bar(self._console, transient=True)
        self._task = self._bar.add_task("starting", total=None, now="")
        self._drawn = self._console.is_terminal and not self._console.is_dumb_terminal
        if self._drawn:  # in a log it would draw nothing, then end with an empty line
            self._bar.start()
        self._step = "starting"
        self._tallies = StageTallies()
        return _Advance(self)

    def _advance(self, text: str) -> None:
        from auditor.renderers.terminal import step
        step(self._console, text)
        self._step = text
        self._bar.reset(self._task, description=text, total=None, now="")

    def _stage_ended(self, entry: dict) -> None:
        from auditor.renderers.terminal import stage_ended
        from auditor.report_models.terminal import stage_end
        ended = stage_end(entry)
        tally = self._tallies.add(ended)
        if not ended.ok and tally.failed == 1:
            stage_ended(self._console, ended)
        self._bar.update(self._task, now=f"{ended.path}" + (f" ({tally.calls:,} calls)" if tally.calls > 1 else ""))

    def __exit__(self, *exc) -> None:
        if self._drawn:
            self._bar.stop()


class _Advance:
    def __init__(self, line: StatusLine):
        self._line = line

    def __call__(self, text: str) -> None:
        self._line._advance(text)

    def stage_ended(self, entry: dict) -> None:
        self._line._stage_ended(entry)

    def follow(self, read: Callable[[], Reading], expected: int | None, unit: str = "stages",
               about: bool = False) -> ChildProgress:
        """A child's progress in the status line (a log: sparse lines, named by the step)."""
        line = self._line
        return ChildProgress(line._console, line._step, read, expected, unit, about,
                             shared=(line._bar, line._task))


def progress_bar(out, transient: bool = False) -> Progress:
    """A rich progress bar on `out` that leaves the program's stdout and stderr alone; a task's
    counts and time left show once it has a total."""
    return Progress(SpinnerColumn(), TextColumn("[dim]auditor:[/] {task.description}"), TimeElapsedColumn(),
                    Counts(), TextColumn("[dim]{task.fields[now]}[/]"), console=out,
                    transient=transient, redirect_stdout=False, redirect_stderr=False)


class Counts(ProgressColumn):
    """`[bar] 12/40 stages 0:01:10 left` once the task has a total; nothing before."""

    def __init__(self):
        super().__init__()
        self.bar, self.left = BarColumn(bar_width=24), TimeRemainingColumn()

    def render(self, task: Task):
        if task.total is None:
            return ""
        grid = Table.grid(padding=(0, 1))
        grid.add_row(self.bar.render(task), f"{int(task.completed):,}/{int(task.total):,} "
                     f"{task.fields.get('unit', '')}", self.left.render(task), "left")
        return grid


@dataclass
class Reading:
    """What a child has done so far, from its files."""
    done: int = 0                   # stages (or runs) finished
    now: str = ""                   # the stage it is in


class EventLogs:
    """The event logs under `root` (any depth: rank-N/, lower-bound/, one per calibration run),
    read as they grow. A reading is of the log begun last: its stages finished (`top_level`:
    only those without a parent) and the stage it is in, named with the log's folder."""

    def __init__(self, root: Path, top_level: bool = False):
        self.root, self.top_level = Path(root), top_level
        self._read: dict[Path, int] = {}       # log -> bytes read (whole lines only)
        self._finished: dict[Path, int] = {}
        self._started: dict[Path, str] = {}

    def read(self) -> Reading:
        if not self.root.is_dir():
            return Reading()
        for log in sorted(self.root.rglob(EVENTS_FILE)):
            self._follow(log)
        if not self._read:
            return Reading()
        log = list(self._read)[-1]  # in the order first seen: a later pass comes after
        where = log.parent.relative_to(self.root).as_posix()
        now = self._started.get(log, "")
        return Reading(self._finished.get(log, 0), f"{where}: {now}" if now and where != "." else now)

    def _follow(self, log: Path) -> None:
        try:
            with open(log, "rb") as f:
                f.seek(self._read.get(log, 0))
                chunk = f.read()
        except OSError:
            return
        whole = chunk[:chunk.rfind(b"\n") + 1]
        self._read[log] = self._read.get(log, 0) + len(whole)
        for line in whole.splitlines():
            if b'"stage_finished"' not in line and b'"stage_started"' not in line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            stage = event.get("stage") or event
            if event.get("event") == "stage_started":
                self._started[log] = str(stage.get("path", ""))
            elif event.get("event") == "stage_finished" and not (self.top_level and stage.get("parent")):
                self._finished[log] = self._finished.get(log, 0) + 1


def stage_reader(root: Path, top_level: bool = False) -> Callable[[], Reading]:
    """Stages finished under `root` (`top_level`: only those without a parent), for a ChildProgress."""
    return EventLogs(root, top_level).read


def run_reader(root: Path, marker: str) -> Callable[[], Reading]:
    """Runs finished under `root` (each leaves `marker` in its folder), the stage now in."""
    logs = EventLogs(root)

    def read() -> Reading:
        now = logs.read().now
        return Reading(sum(1 for _ in Path(root).glob(f"*/{marker}")) if Path(root).is_dir() else 0, now)
    return read


class ChildProgress:
    """`with ChildProgress(console, "tracing on fake tensors", stage_reader(folder), expected=N,
    unit="stages"): run_module(...)`. `expected`: None when unknown, or a guess (`about`: the
    bar then stops at it and the time left is left out once the child does more)."""

    def __init__(self, out, what: str, read: Callable[[], Reading], expected: int | None,
                 unit: str = "stages", about: bool = False, clock=time.monotonic, shared=None):
        """`shared`: (rich Progress, task) of a StatusLine, drawn there rather than anew."""
        self.out, self.what, self.read, self.expected = out, what, read, expected
        self.unit, self.about, self.clock, self.shared = unit, about, clock, shared
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None
        self._started = clock()
        self._reading = Reading()
        self._wait, self._printed_at = FIRST_WAIT_S, self._started

    def __enter__(self):
        self._started = self._printed_at = self.clock()
        if self.out.is_terminal and not self.out.is_dumb_terminal:
            if self.shared is not None:
                self._bar, self._task = self.shared
            else:
                self._bar = progress_bar(self.out)
                self._task = self._bar.add_task(self.what, total=None, now="")
                self._bar.start()
            self._bar.update(self._task, total=self.expected, completed=0, unit=self.unit, now="")
        self._thread = threading.Thread(target=self._follow, name="auditor-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._update()
        if self._bar is not None:
            if self.shared is None:
                self._bar.stop()
        else:
            self._line(f"{self.what}: {self._count()}, {_duration(self.clock() - self._started)}")

    def _follow(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self._update()
            except Exception:  # a display that fails never stops the work it shows
                return

    def _update(self) -> None:
        self._reading = self.read()
        done = self._reading.done
        if self._bar is not None:
            beyond = self.expected is not None and done > self.expected
            self._bar.update(self._task, completed=done, total=None if beyond else self.expected,
                             now=self._reading.now)
            return
        now = self.clock()
        if not self._stop.is_set() and now - self._printed_at >= self._wait:
            self._printed_at, self._wait = now, min(self._wait * 2, LONGEST_WAIT_S)
            left = self._left(now - self._started)
            self._line(f"{self.what}: {self._count()}, {_duration(now - self._started)}"
                       + (f", about {_duration(left)} left" if left is not None else "")
                       + (f", in {self._reading.now}" if self._reading.now else ""))

    def _count(self) -> str:
        done, expected = self._reading.done, self.expected
        if expected is None or done > expected:
            return f"{done:,} {self.unit}"
        return f"{done:,} of {'about ' if self.about else ''}{expected:,} {self.unit}"

    def _left(self, elapsed: float) -> float | None:
        done, expected = self._reading.done, self.expected
        if expected is None or not 0 < done < expected:
            return None
        return elapsed / done * (expected - done)

    def _line(self, text: str) -> None:
        self.out.print(f"auditor: {text}", markup=False, highlight=False, soft_wrap=True)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
