"""The memory report: one markdown file (GitHub-flavoured) and its timeline PNG beside it.

    write_report(record, "runs/x/report.md", run_folder="runs/x")

Sections, in order: summary, stages (repeated calls folded into one row, unstaged time
where it matters), components (over the whole run with their plot; what was alive at the
high-water moments; the census at the peak stage, also just before it when its peak is at
its start, and at the last stage when it is another), timeline, top allocation sites at the
peak, findings (with remedies and the rules checked), theoretical minimum and gap,
environment.

What the report says is computed once, by auditor.analysis.run_report (`run_report(record)`,
one object per section); this module only formats it, section by section. Everything comes
from the run record; the only files read are the ones it names (the flamegraph is linked, not
read), and the PNGs are drawn from the same model by their own renderers (timeline_plot,
components_plot).
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

from auditor import units
from auditor.analysis import run_report as model
from auditor.analysis.component_history import ComponentHistory
from auditor.analysis.components import BEYOND_CENSUS, BEYOND_LIVE, UNSEEN_TENSORS, ProjectionView
from auditor.analysis.run_report import MAX_STAGE_ROWS, RunReport, run_report  # MAX_STAGE_ROWS: tests read it here
from auditor.analysis.stage_groups import StageRow
from auditor.analysis.unstaged import PeakPlace
from auditor.record_schema import Children, Memray, RunRecord, Stage, Unstaged
from auditor.renderers import markdown_text as md
from auditor.renderers.projection_markdown import sections as projection_sections, unexplained

SITE_STACK_FRAMES = 3
MAX_COMPONENT_ROWS = 40   # folded components over the run
MAX_INSTANCES = 200       # instances listed under them
INDENT = "&emsp;"


def write_report(record: RunRecord, out: str | os.PathLike, run_folder: str | os.PathLike | None = None) -> Path:
    """Write the markdown report to `out` and its PNGs next to it (the timeline; the components
    over the run when the record has a census); returns `out`.

    `run_folder` is where the record's own files (flamegraph) live, for relative links."""
    from auditor.renderers import components_plot, timeline_plot
    out = Path(out)
    plot = out.with_name(out.stem + "-timeline.png")
    parts = out.with_name(out.stem + "-components.png")
    report = run_report(record)
    has_census = report.components.has_census
    text = format_report(report, plot=plot.name, report_folder=out.parent,  # first: a record the
                         run_folder=Path(run_folder) if run_folder is not None else None,  # renderer
                         components_plot=parts.name if has_census else None)  # refuses leaves no PNG
    try:
        timeline_plot.write_png(report, plot)
        if has_census:
            components_plot.write_png(report, parts)
        out.write_text(text, encoding="utf-8")
    except BaseException:
        plot.unlink(missing_ok=True)
        parts.unlink(missing_ok=True)
        raise
    return out


def render(record: RunRecord, *, plot: str | None = None, report_folder: Path | None = None,
           run_folder: Path | None = None, components_plot: str | None = None) -> str:
    """The report's markdown. `plot`, `components_plot`: the PNGs' paths relative to the report
    (None: no image)."""
    return format_report(run_report(record), plot=plot, report_folder=report_folder, run_folder=run_folder,
                         components_plot=components_plot)


def format_report(report: RunReport, *, plot: str | None = None, report_folder: Path | None = None,
                  run_folder: Path | None = None, components_plot: str | None = None) -> str:
    """The markdown of a report already computed (`render`'s arguments otherwise)."""
    parts = [
        f"# Memory report: {md.text(report.summary.name)}",
        _banner(report.banner),
        _summary(report.summary),
        _stages(report.stages),
        _components_section(report.components, components_plot),
        projection_sections(report.projections),
        _timeline(plot),
        _sites(report.sites, report_folder, run_folder),
        _findings(report.findings),
        _minimum(report.minimum),
        _environment(report.environment),
    ]
    return "\n\n".join(p for p in parts if p).rstrip() + "\n"


# -- pieces --------------------------------------------------------------------------------

def _banner(banner: model.Banner) -> str:
    lines = []
    exit_ = banner.exit
    if exit_ is not None and exit_.status == "unfinished":
        lines.append(_unfinished(banner))
    elif exit_ is not None and exit_.status != "ok":
        error = f": {md.text(exit_.error)}" if exit_.error else ""
        lines.append(f"> **This run did not end ok ({md.text(exit_.status)}){error}.** Readings stop where it stopped.")
    log = banner.event_log
    if log is not None and log.state == "incomplete":
        reason = log.reason if log.reason is not None else "reason unknown"
        lines.append(f"> **The event log is incomplete** ({md.text(reason)}; "
                     f"{log.lines or 0:,} events written): this record was kept in memory and "
                     "written once there was space.")
    for spawn in banner.spawned:
        folder, workers = spawn.folder, spawn.nprocs
        if folder is None:
            lines.append(f"> **This process started {workers} worker(s) with torch.multiprocessing "
                         f"(start method {md.text(spawn.start_method or 'unknown')}), not audited**: their memory is not in this record.")
        else:
            lines.append(f"> **This process spawned {workers} worker(s) with torch.multiprocessing, audited as "
                         f"ranks in {md.code(('' if folder == '.' else folder + '/') + 'rank-N')} of this run "
                         f"folder**: the work ran there. Their merged report: `auditor report` on "
                         f"{'this run folder' if folder == '.' else 'that folder'}.")
    if banner.children is not None:
        lines.append(_children(banner.children, audited=any(s.folder is not None for s in banner.spawned)))
    if banner.traced:
        lines.append("> **A traced run on fake tensors.** Components and live tensors are the workload's; "
                     "RSS readings are the tracing process's, not the workload's.")
    return "\n>\n".join(lines)


def _children(children: Children, audited: bool) -> str:
    """The memory this process's children held, which no figure of the report counts."""
    among = " (the spawned workers, audited as ranks, among them)" if audited else ""
    return (f"> **Child processes held memory outside this record**{among}: {children_held(children)}. "
            "This report's figures are this process's own (a forked child's RSS also counts the "
            "pages it shares with this process).")


def children_held(children: Children) -> str:
    """What a record's `process.children` says, as a clause."""
    held = []
    if children.largest_ended_peak_rss is not None:
        held.append(f"the largest that ended during the run peaked at {units.size(children.largest_ended_peak_rss)} RSS")
    if children.alive_at_end:
        own = children.alive_uss_at_end
        held.append(f"{children.alive_at_end} still running at its end held "
                    f"{units.size(children.alive_rss_at_end or 0)} RSS"
                    + (f", {units.size(own)} of it their own (USS)" if own is not None else ""))
    return "; ".join(held)


def _unfinished(banner: model.Banner) -> str:
    """What a reader of a killed run needs first: that it did not finish, and how far it got."""
    finished, still_open = banner.finished, banner.still_open
    error = banner.exit.error if banner.exit is not None else None
    how = f" ({md.text(error)})" if error else ""
    got = f"{len(finished):,} of {banner.stages:,} stages finished"
    if finished:
        got += f", the last {md.code(finished[-1].path)}"
    if still_open:
        got += "; open when it stopped: " + ", ".join(md.code(s.path) for s in still_open[-5:])
    return (f"> **This run did not finish**{how}: it was killed or interrupted, or its record "
            f"could not be written. {got}. Readings stop where the event log stops.")


def _summary(summary: model.Summary) -> str:
    place = summary.peak_place
    rows = [["run", md.text(summary.name)]]
    where = f" {_phrase(place.phrase)}" if place.kind != "unknown" else f" ({_phrase(place.phrase)})"
    rows.append(["peak RSS", f"**{units.size(summary.peak_rss)}**{where}"])
    rows.append(["RSS at start / end", f"{units.size(summary.rss_at_start)} / "
                                       f"{units.size(summary.rss_at_end)}"])
    weights = summary.weights
    if weights:
        weights_at = "the most a census saw" if summary.weights_from_any_census else "at the peak stage"
        note = f"; module buffers {units.size(summary.buffers)} not counted" if summary.buffers else ""
        rows.append(["peak / weights", f"**{units.ratio(summary.peak_rss, weights)}** the weights "
                                       f"({units.size(weights)} of parameters {weights_at}{note})"])
    else:
        rows.append(["peak / weights", "no census: the weights are unknown (run with census on)"])
    live = summary.live_tensor_high
    if live:
        rows.append(["peak live tensors", f"{units.size(live[0])} {live[1]}"
                                          f" ({units.size((summary.peak_rss or 0) - live[0])} below peak RSS)"])
    else:
        largest = summary.largest_census
        extra = f"; largest census at a stage end: {units.size(largest)}" if largest else ""
        rows.append(["peak live tensors", f"not measured (no live-tensor meter in this record){extra}"])
    for headline in summary.projections:
        rows.append([f"projected ({md.text(headline.view.label)})", _projected(headline)])
    if not summary.projections:
        rows.append(["projections", "none in this record"])
    if summary.unstaged is not None:
        rows.append(["unstaged time", _unstaged_summary(summary.unstaged, place)])
    tally = ", ".join(f"{n} {s}" for s, n in summary.findings.items() if n) or "none"
    rows.append(["findings", f"{tally} (see [Findings](#findings))"])
    return "## Summary\n\n" + md.table(["measure", "value"], rows)


def _projected(headline: model.ProjectionHeadline) -> str:
    view = headline.view
    value = (f"{units.size(view.peak_rss)} peak RSS" if view.peak_rss is not None
             else _deferred(view, headline.traced) if view.unexplained is not None else "RSS not projected")
    if view.peak_stage:
        value += f" in stage {md.code(view.peak_stage)}"
    if view.live_tensor_peak is not None:
        value += f"; live tensors {units.size(view.live_tensor_peak)}"
    if view.caveat:
        value += f"; **{md.text(view.caveat)}**"
    if view.estimates:
        value += f"; {md.text(view.estimates)}"
    if view.basis and view.peak_rss is not None:
        value += f" ({md.text(view.basis)})"
    return value


def _phrase(text: str) -> str:
    """A phrase with `code` spans (from analysis) made safe for a table cell."""
    pieces = text.split("`")
    return "".join(md.code(p) if i % 2 else md.text(p) for i, p in enumerate(pieces))


def _unstaged_summary(time: model.UnstagedTime, place: PeakPlace) -> str:
    share = f" ({time.seconds / time.run_s:.1%} of the run)" if time.run_s else ""
    text = f"{units.seconds(time.seconds)} in {time.intervals:,} intervals no stage covers{share}"
    if place.kind == "unstaged":
        text += f"; the run's peak is in one: {_phrase(place.phrase)}"
        if place.interval is not None:
            text += (f" ({units.seconds(_length(place.interval))}, "
                     f"see [Components](#components))")
    return text


def _length(interval: Unstaged) -> float:
    """How long an unstaged interval lasted (it is recorded at its end, so it has one)."""
    assert interval.end_s is not None
    return interval.end_s - interval.start_s


def _stages(stages: model.Stages) -> str:
    if not stages.recorded:
        return "## Stages\n\nThe record has no stages." + _unstaged_note(stages.unstaged)
    live, heap, cuda, folded = stages.live_tensors, stages.py_heap, stages.cuda, stages.folded
    headers = ["stage", "status", "duration", "RSS end", "delta", "peak inside", "peak - start"]
    headers += ["live tensors peak"] * live + ["Python heap end", "Python heap peak"] * heap
    headers += ["CUDA allocated", "CUDA reserved", "CUDA peak allocated"] * cuda
    headers += ["highest call (RSS; live tensors)"] * folded
    rows = [_stage_row(line, live, heap, cuda, folded) for line in stages.lines]
    note = ("Stages in start order, indented under their parent; the row holding the run's "
            "peak is in bold. *delta* = RSS end - start; *peak inside* is the highest RSS at any "
            "instant of the stage.")
    if folded:
        note += (" Repeated calls of one callable are one row (*× n*): *duration* is their total, "
                 "*RSS end* the last call's, *delta* from the first call's start to the last "
                 "call's end, *peak inside* the highest of any call and *peak - start* the largest "
                 "rise of any call; the last column names the call with the highest RSS peak "
                 "and the one with the highest live-tensor peak. Every call is in the run "
                 "record's `stages`.")
    if stages.unstaged_rows:
        note += (" *(unstaged)* rows are time no stage covers at that depth, shown where their "
                 "peak or length matters.")
    more = ""
    left = stages.left_out
    if left:
        calls = sum(max(r.count, 1) for r in left)
        more = (f"\n\n{len(left):,} more rows ({calls:,} stages or intervals) are left out to keep "
                f"the table to {MAX_STAGE_ROWS} rows; every stage is in the run record's `stages`. "
                f"Shown: the row holding the peak with its parents, then the shallowest rows, "
                f"highest peaks first within a depth, each with its parents.")
    table = md.table(headers, rows, right=set(range(2, len(headers) - folded)))
    return "## Stages\n\n" + note + "\n\n" + table + more + _unstaged_note(stages.unstaged)


def _stage_row(line: model.StageLine, live: bool, heap: bool, cuda: bool, folded: bool) -> list[str]:
    row = line.row
    name = md.text(row.label) + (f" × {row.count:,}" if row.kind == "folded" else "")
    if row.kind == "unstaged":
        name = f"*{_phrase(row.label)}*"
    name = INDENT * row.depth + (f"**{name}**" if line.holds_peak else name)
    start, end = row.reading("rss", "start"), row.reading("rss", "end")
    top, holder = row.highest("rss")
    rise = row.largest_rise()
    cells = [name, _status(row), units.seconds(row.duration), units.size(end),
             units.signed_size(None if end is None or start is None else end - start),
             units.size(top), units.signed_size(rise)]
    if live:
        cells.append(units.size(row.highest("live_tensors")[0]))
    last = row.entries[-1]
    if heap:
        cells += [units.size(last.py_heap.end if last.py_heap else None),
                  units.size(_most(e.py_heap.peak if e.py_heap else None for e in row.entries))]
    if cuda:
        c = last.cuda
        cells += [units.size(c.allocated_end if c else None), units.size(c.reserved_end if c else None),
                  units.size(_most(e.cuda.peak_allocated if e.cuda else None for e in row.entries))]
    if folded:
        cells.append(_highest_calls(line) if row.kind == "folded" else "")
    return cells


def _most(values: Iterable[int | None]) -> int | None:
    return max((v for v in values if v is not None), default=None)


def _status(row: StageRow) -> str:
    if row.kind == "unstaged":
        return "-"
    if row.count == 1:
        stage = row.stages[0]
        status = stage.status
        if status == "failed":
            return "**FAILED**" + (f": {md.text(stage.error)}" if stage.error else "")
        return "**open** (never finished)" if status == "open" else md.text(status)
    counts = row.statuses
    if set(counts) == {"ok"}:
        return "ok"
    words = {"ok": "ok", "failed": "**FAILED**", "open": "**open**"}
    return ", ".join(f"{words.get(k, md.text(k))} {n:,}" for k, n in counts.items())


def _highest_calls(line: model.StageLine) -> str:
    text = md.code(line.highest_call) if line.highest_call is not None else "-"  # folded: calls only
    if line.highest_live_call is not None:
        text += f"; {md.code(line.highest_live_call)} ({units.size(line.row.highest('live_tensors')[0])})"
    return text


def _unstaged_note(time: model.UnstagedTime | None) -> str:
    if time is None:
        return ""
    share = f", {time.seconds / time.run_s:.1%} of the run" if time.run_s else ""
    return (f"\n\nUnstaged time in all: {units.seconds(time.seconds)} in {time.intervals:,} intervals{share} "
            f"(each is in the run record's `unstaged`).")


def _components_section(components: model.Components, plot: str | None = None) -> str:
    parts = ["## Components"]
    if components.has_census:
        parts.append(_over_the_run(components.over_the_run, components.census_ends, plot))
    else:
        parts.append("No tensor census in this record (run with census on to see which structure "
                     "holds the memory).")
    if components.unstaged_peak is not None:
        parts.append(_unstaged_peak(components.unstaged_peak))
    parts += [_live_high(high) for high in components.live_highs]
    if not components.has_census:
        return "\n\n".join(parts)
    if components.peak_stage is None:
        parts.append("No stage holds the run's peak, so there is no peak stage census to show.")
        return "\n\n".join(parts)
    for census in components.censuses:
        before = census.moment == "just before the peak stage"
        parts.append(_component_tables(census, _what_made_the_peak(components.peak_stage) if before else ""))
    return "\n\n".join(parts)


def _what_made_the_peak(holder: Stage) -> str:
    """Why the census before the peak stage is shown: the peak stage frees what made the peak."""
    rss = holder.rss  # it peaked at its start: both read
    drop = rss.peak - rss.end if rss.peak is not None and rss.end is not None else None
    return (f"The peak stage {md.code(holder.path)} reached its peak near its "
            f"start and ended {units.size(drop)} "
            f"lower, so the census taken just before it began shows what "
            f"made the peak.")


def _over_the_run(items: list[ComponentHistory], ends: int, plot: str | None) -> str:
    lead = (f"Every component the census found at the {ends:,} stage ends, folded over its "
            "instances (the state of every helper of one class: `Helper[model.layers.3.mlp].H` "
            "and `Helper#2.H` are `Helper.H`). *Bytes per instance* is exact (the most each instance held at a "
            "stage end), listed by distinct size; *most alive at once* is the most the instances "
            "held together at one stage end. State made and freed inside one stage shows only "
            "in the live-tensor compositions below.")
    rows = []
    for item in items[:MAX_COMPONENT_ROWS]:
        rows.append([md.code(item.name), md.text(item.category), f"{len(item.instances):,}", _sizes(item.sizes),
                     f"{units.size(item.most_at_once)}" + (f" ({_count(item.most_instances_at_once, 'instance')})"
                                                          if len(item.instances) > 1 else "")
                     + f" at the end of {md.code(item.most_at)}",
                     md.code(item.first_stage), md.code(item.last_stage)])
    table = md.table(["component", "category", "instances", "bytes per instance", "most alive at once",
                    "first seen", "last seen"], rows, right={2})
    more = (f"\n\n{len(items) - MAX_COMPONENT_ROWS:,} smaller components are left out; every "
            f"census is in the run record." if len(items) > MAX_COMPONENT_ROWS else "")
    image = (f"\n\n![components at each stage end]({quote(plot)})\n\nEach component's bytes at "
             "every stage end, the largest stacked (steps: a census is taken at stage ends only)."
             if plot else "")
    return f"### Over the run\n\n{lead}\n\n{table}{more}\n\n{_instances(items)}{image}"


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _sizes(sizes: list[tuple[int, int]]) -> str:
    shown = [f"{units.size(b)} ({b:,} B)" + (f" × {n:,}" if n > 1 else "") for b, n in sizes[:4]]
    if len(sizes) > 4:
        shown.append(f"{len(sizes) - 4} more sizes")
    return "; ".join(shown)


def _instances(items) -> str:
    rows: list[list[str]] = []
    total = sum(len(i.instances) for i in items)
    for item in items:
        for instance in item.instances:
            if len(rows) >= MAX_INSTANCES:
                break
            rows.append([md.code(item.name), md.code(instance.name), f"{instance.bytes:,}",
                         md.code(instance.first_stage), md.code(instance.last_stage)])
    more = (f"\n\n{total - len(rows):,} more instances are in the run record's censuses."
            if total > len(rows) else "")
    table = md.table(["component", "instance", "bytes", "first stage end seen", "last stage end seen"],
                   rows, right={2})
    return (f"<details><summary>Each instance ({total:,})</summary>\n\n{table}{more}\n\n</details>")


def _unstaged_peak(peak: model.UnstagedPeak) -> str:
    place = peak.place
    title = f"### What was alive at the run's peak, {_phrase(place.phrase)}"
    interval = place.interval
    if interval is None:
        return f"{title}\n\nThe record has no interval matching the peak's place."
    rss = interval.rss
    lead = (f"The run's peak RSS ({units.size(rss.peak)}) fell in time no stage covers "
            f"({units.seconds(_length(interval))}; RSS "
            f"{units.size(rss.start)} at its start, {units.size(rss.end)} at its end).")
    if peak.alive is not None:
        return (f"{title}\n\n{lead} At the interval's live-tensor high (owners from the census at "
                f"the next stage end):\n\n{_at_peak_table(peak.alive)}")
    a = peak.census
    if a is None:
        return f"{title}\n\n{lead} The record has no composition for it: no live-tensor meter and no census before it."
    rows = [[md.code(r.name), md.text(r.category), units.size(r.bytes)] for r in a.rows]
    rows.append(["**census total**", "", f"**{units.size(a.census)}**"])
    return (f"{title}\n\n{lead} No live-tensor composition for it; the census at the end of "
            f"{md.code(a.stage)}, the last before it (an estimate of what was alive: the "
            f"interval may have made more):\n\n"
            + md.table(["component", "category", "bytes"], rows, right={2}))


def _live_high(high: model.LiveHigh) -> str:
    """What was alive at the high-water moment of the peak stage or of a top live peak."""
    stage = high.stage
    readings = stage.live_tensors
    assert readings is not None  # a live-tensor high was read
    which = "the peak stage" if high.is_peak_stage else "a top live-tensor peak"
    label = f" ({md.text(high.call)})" if high.call != stage.name else ""
    return (f"### Alive at the live-tensor high of {md.code(stage.path)}{label}, {which}\n\n"
            f"What was alive at the moment the live-tensor meter was highest inside the stage "
            f"({units.size(readings.peak)}; {units.size(readings.start)} at its start, "
            f"{units.size(readings.end)} at its end): every storage alive then, by owner "
            f"(its census component at the stage end) and category; storages freed before "
            f"the stage ended have no owner and are named by the operator and stage that "
            f"made them.\n\n{_at_peak_table(high.alive)}")


def _at_peak_table(alive: model.AliveAt) -> str:
    at_peak = alive.at_peak
    total = at_peak.bytes
    rows = []
    for row in at_peak.rows:
        owner = md.code(row.owner) if row.owner else "-"
        rows.append([owner, md.text(row.category or "other"),
                     md.code(row.created_in) if row.created_in else "before the audit or unstaged",
                     md.code(row.op) if row.op else "-", f"{row.tensors:,}",
                     units.size(row.bytes), units.share(row.bytes, total),
                     "yes" if row.alive_at_end else "no, freed before it"])
    if at_peak.rows_left_out:
        rows.append([f"{at_peak.rows_left_out:,} smaller groups", "", "", "", "",
                     units.size(at_peak.bytes_left_out), units.share(at_peak.bytes_left_out, total), ""])
    rows.append(["**total at the high**", "", "", "", "", f"**{units.size(total)}**", "", ""])
    table = md.table(["owner", "category", "created in", "op", "tensors", "bytes", "share", "alive at the end"],
                   rows, right={4, 5, 6})
    categories = "; ".join(f"{md.text(c)} {units.size(b)}" for c, b in alive.categories)
    return f"{table}\n\nBy category: {categories or 'none'}."


def _deferred(view: ProjectionView, traced: ProjectionView | None) -> str:
    """The headline of a scaled projection its drivers do not explain: the traced projection's
    figure for the same target, and that it stands in for the scaled one."""
    miss = view.unexplained or {}
    what = f" ({md.text(miss['what'])})" if miss.get("what") else ""
    text = (f"not explained by its drivers (miss {units.size(miss.get('bytes'))} in stage "
            f"{md.code(miss.get('stage', '?'))}{what}): see traced")
    if traced is None:
        return text + " (no traced projection in this record: a run without --no-trace makes one)"
    figure = (f"{units.size(traced.peak_rss)} peak RSS" if traced.peak_rss is not None
              else f"live tensors {units.size(traced.live_tensor_peak)}")
    return f"{text}: the traced figure stands for it, {figure} in stage {md.code(traced.peak_stage or '?')}"


def _component_tables(census: model.StageCensus, why: str = "") -> str:
    stage, a, projected = census.stage, census.attribution, census.projected
    title = f"### Components {census.moment}: {md.code(stage.path)}"
    if a is None:
        return f"{title}\n\nThis stage has no census."
    rss = stage.rss
    lead = (f"Census at the end of the stage, a moment after its work (for the algorithm's state "
            f"over the run see *Over the run*; for what made a peak, the live-tensor highs): "
            f"RSS {units.size(a.rss_end)}; the peak inside the stage "
            f"was {units.size(a.rss_peak)} ({units.signed_size(None if a.rss_peak is None or a.rss_end is None else a.rss_peak - a.rss_end)} "
            f"from its end: transients, see the timeline and the allocation sites). "
            f"Share = of RSS at the stage end.")
    if why:
        lead = f"{why} {lead}"
    headers = ["component", "category", "bytes", "share"] + [f"projected, {md.text(v.label)}" for v, _ in projected]

    def proj(get, parts=lambda p: ()) -> list[str]:
        """Each view's figure, or why it has none: one of `parts` its drivers do not explain."""
        def cell(p):
            missed = [p.unexplained[k] or 0 for k in parts(p) if k in p.unexplained]
            return unexplained(max(missed)) if missed else units.size(get(p))
        return [cell(p) if p is not None else "-" for _, p in projected]

    def proj_component(name: str) -> list[str]:  # with the bytes that rest on estimated sizes
        return [unexplained(p.unexplained[name]) if p is not None and name in p.unexplained else
                units.size(p.components.get(name)) + (f" (est. {units.size(p.estimated[name])})"
                                                      if p.estimated.get(name) else "")
                if p is not None else "-" for _, p in projected]

    rows = [[md.code(r.name), md.text(r.category), units.size(r.bytes), units.share(r.bytes, a.rss_end)]
            + proj_component(r.name) for r in a.rows]
    rows.append(["**census total**", "", f"**{units.size(a.census)}**", units.share(a.census, a.rss_end)]
                + proj(lambda p: sum(v for v in p.components.values() if v is not None), lambda p: list(p.components)))
    rows.append([md.text(BEYOND_CENSUS), "", units.size(a.beyond_census), units.share(a.beyond_census, a.rss_end)]
                + proj(lambda p: None if p.unseen is None and p.beyond_tensors is None
                       else (p.unseen or 0) + (p.beyond_tensors or 0), lambda p: ["unseen"]))
    if a.unseen is not None:
        rows.append([INDENT + "of which " + md.text(UNSEEN_TENSORS), "", units.size(a.unseen),
                     units.share(a.unseen, a.rss_end)] + proj(lambda p: p.unseen, lambda p: ["unseen"]))
        rows.append([INDENT + "of which " + md.text(BEYOND_LIVE), "", units.size(a.beyond_live),
                     units.share(a.beyond_live, a.rss_end)] + proj(lambda p: p.beyond_tensors))
    rows.append(["**RSS at the stage end**", "", f"**{units.size(a.rss_end)}**",
                 units.share(a.rss_end, a.rss_end)] + proj(lambda p: None))
    if a.rss_peak is not None and a.rss_end is not None:
        rows.append(["transient inside the stage (peak - end)", "", units.size(a.rss_peak - a.rss_end), ""]
                    + proj(lambda p: p.transient, lambda p: ["transient"]))
        rows.append(["**peak inside the stage**", "", f"**{units.size(rss.peak)}**", ""]
                    + proj(lambda p: p.rss_peak, lambda p: ["peak"]))
    table = md.table(headers, rows, right=set(range(2, len(headers))))
    cat_headers = ["category", "bytes", "share", "x weights"] + [f"projected, {md.text(v.label)}" for v, _ in projected]
    cat_rows = []
    for category, total in a.categories:
        names = [r.name for r in a.rows if r.category == category]
        cat_rows.append([md.text(category), units.size(total), units.share(total, a.rss_end),
                         units.ratio(total, a.weights)]
                        + proj(lambda p, ns=names: sum(p.components.get(n) or 0 for n in ns), lambda p, ns=names: ns))
    cat_rows.append([md.text(BEYOND_CENSUS), units.size(a.beyond_census),
                     units.share(a.beyond_census, a.rss_end), units.ratio(a.beyond_census, a.weights)]
                    + ["" for _ in projected])
    cat_rows.append(["**RSS at the stage end**", f"**{units.size(a.rss_end)}**",
                     units.share(a.rss_end, a.rss_end), units.ratio(a.rss_end, a.weights)]
                    + ["" for _ in projected])
    categories = md.table(cat_headers, cat_rows, right=set(range(1, len(cat_headers))))
    weights_note = (f"Weights = parameters, {units.size(a.weights)}"
                    + (f" (module buffers, {units.size(a.buffers)}, are counted under weights "
                       f"above but not in the ratio)." if a.buffers else "."))
    return f"{title}\n\n{lead}\n\n{table}\n\nBy category:\n\n{categories}\n\n{weights_note}"


def _timeline(plot: str | None) -> str:
    if not plot:
        return ""
    return ("## Timeline\n\n"
            f"![RSS over time]({quote(plot)})\n\n"
            "RSS at each stage boundary and mark, with each stage's peak drawn inside it (at the "
            "middle of the part of the stage no child covers: the time inside the stage is not "
            "recorded). Top-level stages are shaded.")


def sites_section(record: RunRecord, report_folder: Path | None, run_folder: Path | None,
                  head: str = "## Top allocation sites at the peak") -> str:
    """memray's sites alive at its high-water mark (the training-step report titles it its own way)."""
    return _sites(model.sites(record), report_folder, run_folder, head)


def format_sites(sites: model.Sites, report_folder: Path | None, run_folder: Path | None,
                 head: str = "## Top allocation sites at the peak") -> str:
    """The sites section of a model already computed (the training-step report has one per configuration)."""
    return _sites(sites, report_folder, run_folder, head)


def _sites(sites: model.Sites, report_folder: Path | None, run_folder: Path | None,
           head: str = "## Top allocation sites at the peak") -> str:
    memray, probe = sites.memray, sites.probe
    if memray is None:
        state = probe.state if probe is not None else None
        why = (probe.reason if probe is not None else None) or (
            "memray was off for this run (`auditor run --memray`; `auditor gradprobe` traces unless given --no-memray)"
            if state in (None, "off") else f"memray {state}")
        return f"{head}\n\nNo memray trace: {md.text(why)}."
    lead = (f"memray's high-water mark: {units.size(memray.peak_memory)} of native allocations "
            f"({_memray_stage(memray)}), {memray.total_allocations or 0:,} allocations in the run. "
            "Sites alive at that instant, grouped by their innermost frame in user code:")
    if memray.auditor_bytes:
        lead += (f" ({units.size(memray.auditor_bytes)} allocated by the auditor itself and alive "
                 f"then are left out.)")
    rows = []
    for index, line in enumerate(sites.lines, 1):
        site = line.site
        where = f"{line.where}: {site.code}" if site.code else line.where  # the source line, read when summarized
        rows.append([str(index), md.code(where),
                     md.code(site.function) if site.function else "-",
                     units.size(site.bytes), f"{site.allocations:,}", _stack(line)])
    table = md.table(["#", "location and line", "function", "bytes", "allocations", "stack (innermost first)"],
                   rows, right={0, 3, 4}) if rows else "No allocation was alive at the high-water mark."
    return f"{head}\n\n{lead}\n\n{table}\n\n{_flamegraph_link(memray, report_folder, run_folder)}"


def _memray_stage(memray: Memray) -> str:
    """The stage memray's high-water mark belongs to, and how it was found (older records: the
    run's RSS-peak stage, said so)."""
    basis = memray.stage_basis
    at = f", about {units.seconds(memray.at_s)} into the audit" if memray.at_s is not None else ""
    if memray.stage:
        where = f"in stage {md.code(memray.stage)}"
    elif basis:
        where = "in no stage (unstaged time)"
    else:
        return "outside any stage"
    how = md.text(basis) if basis else "the run's RSS-peak stage (an older record: not located by time)"
    return f"{where}{at}; stage found by: {how}"


def _flamegraph_link(memray: Memray, report_folder: Path | None, run_folder: Path | None) -> str:
    name = memray.flamegraph
    if not name:
        return "No flamegraph was written for this run."
    if run_folder is None or report_folder is None:
        return f"Flamegraph: {md.code(name)} in the run folder."
    target = Path(run_folder) / name
    if _kept_out_of_git(target):  # a link would break for everyone reading the committed report
        folder = os.path.relpath(Path(run_folder).resolve(), Path(report_folder).resolve())
        return (f"Flamegraph: {md.code(name)} in the run folder {md.code(folder)}, where the command wrote it; "
                "git ignores it (megabytes), so it exists only where the command ran.")
    if not target.exists():
        return f"Flamegraph: {md.code(name)} was not found in the run folder {md.code(run_folder)}."
    return f"Flamegraph of the allocations alive at the peak: [{md.text(name)}]({md.relative_link(target, report_folder)})."


def _kept_out_of_git(path: Path) -> bool:
    """True when `path` lies in a git work tree that ignores it (False without git)."""
    try:
        done = subprocess.run(["git", "check-ignore", "-q", path.name], cwd=path.parent,
                              capture_output=True, timeout=10) if path.parent.is_dir() else None
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done is not None and done.returncode == 0


def _stack(line: model.SiteLine) -> str:
    shown = []
    for frame in line.stack[:SITE_STACK_FRAMES]:
        function = frame.function if len(frame.function) <= 60 else frame.function[:57] + "..."
        shown.append(f"{function} ({frame.where})" if frame.where else function)
    if not shown:
        return "-"
    text = " ← ".join(shown) + (" ← …" if len(line.stack) > SITE_STACK_FRAMES else "")
    return ("native: " if line.native else "") + md.text(text)


def _findings(findings: model.Findings) -> str:
    head = "## Findings"
    found, outcomes = findings.found, findings.outcomes
    if found:
        lines = []
        for f in found:
            site = f.evidence.get("memray_site")
            shown = {**f.evidence, "memray_site": findings.shown_sites[site]} if site else f.evidence
            evidence = ", ".join(f"{k.replace('_', ' ')} {md.code(v)}" for k, v in shown.items()
                                 if k in ("stage", "component", "from_stage", "to_stage", "memray_site") and v)
            lines.append(f"- **{f.severity}** ({f.rule}): {f.statement}" + (f" Evidence: {evidence}." if evidence else ""))
            if f.remedy:
                lines.append(f"  - Remedy: {f.remedy}{_saving(f.saving)}")
            if f.validated:
                lines.append(f"  - Validated: {_validated(f.validated)}")
        body = "\n".join(lines)
    else:
        body = "No rule fired on this record."
    rows = []
    for o in outcomes:
        result = (f"not checked: {md.text(o.not_checked)}" if o.not_checked
                  else f"fired ({len(o.findings)})" if o.findings else "silent")
        rows.append([md.code(o.rule.id), md.text(o.rule.title), md.text(o.rule.threshold), result])
    rules = md.table(["rule", "looks for", "threshold", "result"], rows)
    note = ("Each finding's remedy is the change that removes it; its saving is an upper bound: "
            "the bytes of the evidence here and, projected, at each target in the record (what "
            "the algorithm still needs of them comes back).")
    return (f"{head}\n\nDetected from the record by the rules below, not written by hand. {note}"
            f"\n\n{body}\n\nRules checked:\n\n{rules}")


def _saving(saving: dict | None) -> str:
    if not saving:
        return ""
    text = f" Saves up to {units.size(saving['bytes'])} here"
    projected = [p for p in saving.get("projected") or []]
    if not projected:
        return text + " (no projection in this record)."
    parts = [f"{units.size(p['bytes'])} at {p['target']} ({p.get('method', 'projected')})"
             if p["bytes"] is not None else f"not projected at {p['target']} ({p.get('method', 'projected')})"
             for p in projected]
    return text + "; " + "; ".join(parts) + "."


def _validated(items) -> str:
    """The measured variants that implement the remedy, with what their comparison measured."""
    parts = []
    for item in items:
        text = f"variant {md.code(item['variant'])}" + (f" ({item['what']})" if item.get("what") else "")
        saving = item.get("peak_saving")
        if saving is None:
            text += ", no measured saving"
        elif item.get("claims_saving"):
            text += f", {units.size(saving)} less peak RSS"
        else:
            text += f", no saving beyond the noise ({units.signed_size(-saving)} peak RSS)"
        if item.get("agreement"):
            text += f", result {item['agreement']}"
        parts.append(text)
    first = items[0]
    where = ", ".join(w for w in (first.get("architecture"),
                                  f"{first['runs']} runs a side" if first.get("runs") else None) if w)
    source = f" by {md.code(first['source'])}" if first.get("source") else ""
    return ("; ".join(parts) + f" (whole-run peak RSS against the baseline, measured{source}"
            + (f": {where}" if where else "") + ").")


def _minimum(minimum: model.Minimum) -> str:
    head = "## Theoretical minimum and gap"
    if not minimum.items:
        return f"{head}\n\nNo minimum was declared for this run (the job that ran the algorithm puts it in the record's `minimum` field)."
    total = minimum.total
    rows = [[md.text(i.get("name", "?")), units.size(i.get("bytes")), md.text(i.get("why", ""))] for i in minimum.items]
    rows.append(["**total**", f"**{units.size(total)}**", ""])
    peak = minimum.peak_rss
    gap_rows = [["peak RSS", units.size(peak), units.signed_size(None if peak is None else peak - total),
                 units.ratio(peak, total)]]
    live = minimum.live_tensor_high
    if live:
        gap_rows.append(["peak live tensors", units.size(live[0]), units.signed_size(live[0] - total),
                         units.ratio(live[0], total)])
    else:
        gap_rows.append(["peak live tensors", "not measured", "-", "-"])
    note = f"\n\n{md.text(minimum.note)}" if minimum.note else ""
    return (f"{head}\n\n" + md.table(["item", "bytes", "why"], rows, right={1}) + note + "\n\n"
            + md.table(["measured", "bytes", "gap to the minimum", "x minimum"], gap_rows, right={1, 2, 3}))


def environment_section(record: RunRecord, head: str = "## Environment") -> str:
    return _environment(model.environment(record), head)


def format_environment(environment: model.Environment, head: str = "## Environment") -> str:
    """The environment section of a model already computed (the training-step report shows its first configuration's)."""
    return _environment(environment, head)


def _environment(environment: model.Environment, head: str = "## Environment") -> str:
    env, machine = environment.software, environment.machine
    rows = [["python", md.text(_or(env.python, "-"))], ["torch", md.text(env.torch or "-")],
            ["transformers", md.text(env.transformers or "-")],
            ["threads", md.text(_or(env.threads, "-"))],
            ["device", md.text(environment.device)]]
    if env.malloc is not None:  # None: a record from before it was kept
        rows.insert(4, ["malloc", md.text(malloc_setting(env.malloc))])
    if machine is not None:
        rows.append(["machine", md.text(f"{_or(machine.platform, '?')}, {machine.cpus} CPUs, "  # None: unknown to os
                                      f"{units.size(machine.memory_total)} memory")])
    rows += [["command", md.code(environment.command)], ["started at", md.text(environment.started_at)]]
    if environment.finished_at:
        rows.append(["finished at", md.text(environment.finished_at)])
    if environment.audited_s is not None:
        rows.append(["audited time", units.seconds(environment.audited_s) + " (census time excluded)"])
    exit_ = environment.exit
    if exit_ is not None:
        rows.append(["exit", md.text(exit_.status + (f": {exit_.error}" if exit_.error else ""))])
    overhead = environment.overhead_s
    if overhead:
        rows.append(["audit overhead", ", ".join(f"{md.text(k)} {units.seconds(v)}" for k, v in overhead.items())])
    probe_rows = []
    for name, probe in environment.probes.items():
        detail = probe.reason or probe.method or ""
        probe_rows.append([md.text(name), md.text(probe.state), md.text(detail)])
    if environment.live_tensors_absent:
        probe_rows.append(["live tensors", "absent", "no live-tensor meter readings in this record"])
    parts = [head, md.table(["setting", "value"], rows)]
    if probe_rows:
        parts.append("Probes:\n\n" + md.table(["probe", "state", "method or reason"], probe_rows))
    warnings = environment.warnings
    parts.append("Warnings:\n\n" + "\n".join(f"- {md.text(w)}" for w in warnings) if warnings else "Warnings: none.")
    return "\n\n".join(parts)


def malloc_setting(settings: dict[str, str]) -> str:
    """glibc malloc's settings of the run, and what they mean for its mmap threshold."""
    from auditor.allocator_retention import threshold_fixed
    if not settings:
        return "glibc defaults: the mmap threshold follows the largest block freed (up to 32 MiB)"
    given = ", ".join(f"{name}={value}" for name, value in sorted(settings.items()))
    return given + (": the mmap threshold stays fixed" if threshold_fixed(settings)
                    else ": the mmap threshold follows the largest block freed")


def _or(value: object, absent: str) -> object:
    """`value`, or what a reader sees for a reading the record does not have."""
    return absent if value is None else value
