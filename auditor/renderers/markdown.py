"""The memory report: one markdown file (GitHub-flavoured) and its PNGs beside it.

    write(run_report(record), "runs/x/report.md", run_folder="runs/x")

It opens with the answer: a title line (the peak, its multiple of the weights, each target's
projected peak), what was alive at the peak by category and component (here, x the weights,
at each target), and the fixes (auditor.renderers.answer_markdown). Then the summary, the
stages (repeated calls folded into one row, unstaged time where it matters), the timeline and
the theoretical minimum; the rest is folded under `<details>`: components over the run and at
each live-tensor high (components_markdown), each target's projection (projection_markdown),
allocation sites (sites_markdown), each finding in full with the rules checked, environment.

What the report says is computed once, by auditor.report_models.run (`run_report(record)`,
one object per section), before it is handed here; these modules only format it (the
protocol: auditor/renderers/__init__.py). Everything comes from the run record;
the only files read are the ones it names (the flamegraph is linked, not read), and the PNGs
are drawn from the same model by their own renderers (timeline_plot, components_plot).
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

from auditor.analysis.projection.views import ProjectionView
from auditor.analysis.run.stage_groups import StageRow
from auditor.analysis.run.unstaged import PeakPlace
from auditor.facts import safe_files, units
from auditor.record.schema import Children
from auditor.renderers import components_markdown
from auditor.renderers import markdown_text as md
from auditor.renderers.answer_markdown import answer_section, findings_detail, fixes_section
from auditor.renderers.components_markdown import length as _length
from auditor.renderers.markdown_text import INDENT, folded
from auditor.renderers.markdown_text import phrase as _phrase
from auditor.renderers.projection_markdown import heading as projection_heading
from auditor.renderers.projection_markdown import sections as projection_sections
from auditor.renderers.sites_markdown import section as sites_section
from auditor.report_models.run import (  # MAX_STAGE_ROWS: tests read it here
    MAX_STAGE_ROWS,
    Banner,
    Environment,
    Minimum,
    ProjectionHeadline,
    RunReport,
    StageLine,
    Stages,
    Summary,
    UnstagedTime,
)

__all__ = ["MAX_STAGE_ROWS", "environment_section", "render", "write"]


def write(report: RunReport, out: str | os.PathLike, run_folder: str | os.PathLike | None = None) -> Path:
    """Write the markdown report to `out` and its PNGs next to it (the timeline; the components
    over the run when the record has a census); returns `out`.

    `run_folder` is where the record's own files (flamegraph) live, for relative links."""
    from auditor.renderers import components_plot, timeline_plot
    out = Path(out)
    plot = out.with_name(out.stem + "-timeline.png")
    parts = out.with_name(out.stem + "-components.png")
    has_census = report.components.has_census
    text = render(report, plot=plot.name, report_folder=out.parent,  # first: a record the
                         run_folder=Path(run_folder) if run_folder is not None else None,  # renderer
                         components_plot=parts.name if has_census else None)  # refuses leaves no PNG
    try:
        timeline_plot.render(report, plot)
        if has_census:
            components_plot.render(report, parts)
        safe_files.write_text(out, text)  # a link planted at `out` is replaced, never followed
    except BaseException:
        plot.unlink(missing_ok=True)
        parts.unlink(missing_ok=True)
        raise
    return out


def render(report: RunReport, *, plot: str | None = None, report_folder: Path | None = None,
           run_folder: Path | None = None, components_plot: str | None = None) -> str:
    """The report's markdown. `plot`, `components_plot`: the PNGs' paths relative to the report
    (None: no image); `report_folder`, `run_folder`: where the report and the record's own files
    are, for relative links."""
    details = [*components_markdown.details(report.components, components_plot)]
    if report.targets:
        details.append(folded("Projection to " + ", ".join(t.target for t in report.targets)
                              + ": each stage and component, and how",
                              projection_sections(report.targets, [h.view for h in report.summary.projections])))
    details += [folded("Allocation sites at the peak (memray)", sites_section(report.sites, report_folder, run_folder)),
                folded("Each finding in full, and the rules checked", findings_detail(report.findings)),
                folded("Environment, probes and the audit's own time", environment_section(report.environment))]
    parts = [
        _title(report.summary),
        _banner(report.banner),
        answer_section(report.answer, report.summary.peak_place, report.components, report.targets),
        fixes_section(report.fixes),
        _summary(report.summary),
        _stages(report.stages),
        _timeline(plot),
        _minimum(report.minimum),
        "## Details\n\n" + "\n\n".join(details),
    ]
    return "\n\n".join(p for p in parts if p).rstrip() + "\n"


def _title(summary: Summary) -> str:
    """The title line: the peak, its multiple of the weights, each target's projected peak."""
    said = [f"peak {units.size(summary.peak_rss)} RSS"]
    if summary.weights:
        said.append(f"{units.ratio(summary.peak_rss, summary.weights)} the weights")
    targets: dict[str, list[str]] = {}
    for headline in summary.projections:
        view = headline.view
        figure = (units.size(view.peak_rss) if view.peak_rss is not None
                  else f"live tensors {units.size(view.live_tensor_peak)}" if view.live_tensor_peak is not None
                  else "not projected")
        name = view.target + (f" {view.target_dtype}" if view.target_dtype else "")
        not_shown = view.failed.phrase if view.failed is not None else view.withheld  # no figure: it stopped,
        targets.setdefault(name, []).append(f"{figure} ({headline.how})" if not_shown is None  # or the
                                            else f"({headline.how}) {not_shown}")  # traced one differs
    line = ", ".join(said) + "".join(f"; at {t} {', '.join(f)}" for t, f in targets.items())
    return f"# Memory report: {md.text(summary.name)}: {md.text(line)}"


# -- pieces --------------------------------------------------------------------------------

def _banner(banner: Banner) -> str:
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
                         f"(start method {md.text(spawn.start_method or 'unknown')}), not audited**: "
                         "their memory is not in this record.")
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
        held.append(f"the largest that ended during the run peaked at "
                    f"{units.size(children.largest_ended_peak_rss)} RSS")
    if children.alive_at_end:
        own = children.alive_uss_at_end
        held.append(f"{children.alive_at_end} still running at its end held "
                    f"{units.size(children.alive_rss_at_end or 0)} RSS"
                    + (f", {units.size(own)} of it their own (USS)" if own is not None else ""))
    return "; ".join(held)


def _unfinished(banner: Banner) -> str:
    """What a reader of a killed run needs first: that it did not finish, and how far it got."""
    finished, still_open = banner.finished, banner.still_open
    error = banner.exit.error if banner.exit is not None else None
    how = f": {md.text(error)}." if error else ": it was killed or interrupted, or its record could not be written."
    got = f"{len(finished):,} of {banner.stages:,} stages finished"
    if finished:
        got += f", the last {md.code(finished[-1].path)}"
    if still_open:
        got += "; open when it stopped: " + ", ".join(md.code(s.path) for s in still_open[-5:])
    return f"> **This run did not finish**{how} {got}. Readings stop where the event log stops."


def _summary(summary: Summary) -> str:
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
    rows.append(["findings", f"{tally} (see [Fixes](#fixes))"])
    return "## Summary\n\n" + md.table(["measure", "value"], rows)


def _projected(headline: ProjectionHeadline) -> str:
    view = headline.view
    if view.failed is not None:  # what it finished is in the details, never a headline figure
        return f"{_phrase(view.failed.phrase)} ([how]({md.anchor(projection_heading(view.target))}))"
    if view.withheld is not None:  # the traced projection does not bear it out: its figures in the details
        return f"{md.text(view.withheld)} ([how]({md.anchor(projection_heading(view.target))}))"
    value = (f"{units.size(view.peak_rss)} peak RSS" if view.peak_rss is not None
             else _deferred(view, headline.traced) if view.unexplained is not None else "RSS not projected")
    if view.peak_stage:
        value += f" in stage {md.code(view.peak_stage)}"
    if view.live_tensor_peak is not None:
        value += f"; live tensors {units.size(view.live_tensor_peak)}"
    if view.caveat:
        value += f"; **{md.text(view.caveat)}**"
    if view.unchecked:
        value += f"; **{md.text(view.unchecked)}**"
    return value + f" ([how]({md.anchor(projection_heading(view.target))}))"


def _unstaged_summary(time: UnstagedTime, place: PeakPlace) -> str:
    share = f" ({time.seconds / time.run_s:.1%} of the run)" if time.run_s else ""
    text = f"{units.seconds(time.seconds)} in {time.intervals:,} intervals no stage covers{share}"
    if place.kind == "unstaged":
        text += f"; the run's peak is in one: {_phrase(place.phrase)}"
        if place.interval is not None:
            text += (f" ({units.seconds(_length(place.interval))}, "
                     f"see [what was alive](#what-was-alive-at-the-peak))")
    return text


def _stages(stages: Stages) -> str:
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
                 "and the one with the highest live-tensor peak. Every call is in the run record.")
    if stages.unstaged_rows:
        note += (" *(unstaged)* rows are time no stage covers at that depth, shown where their "
                 "peak or length matters.")
    more = ""
    left = stages.left_out
    if left:
        calls = sum(max(r.count, 1) for r in left)
        more = (f"\n\n{len(left):,} more rows ({calls:,} stages or intervals) are left out to keep "
                f"the table to {MAX_STAGE_ROWS} rows; every stage is in the run record. "
                f"Shown: the row holding the peak with its parents, then the shallowest rows, "
                f"highest peaks first within a depth, each with its parents.")
    table = md.table(headers, rows, right=set(range(2, len(headers) - folded)))
    return "## Stages\n\n" + note + "\n\n" + table + more + _unstaged_note(stages.unstaged)


def _stage_row(line: StageLine, live: bool, heap: bool, cuda: bool, folded: bool) -> list[str]:
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


def _highest_calls(line: StageLine) -> str:
    text = md.code(line.highest_call) if line.highest_call is not None else "-"  # folded: calls only
    if line.highest_live_call is not None:
        text += f"; {md.code(line.highest_live_call)} ({units.size(line.row.highest('live_tensors')[0])})"
    return text


def _unstaged_note(time: UnstagedTime | None) -> str:
    if time is None:
        return ""
    share = f", {time.seconds / time.run_s:.1%} of the run" if time.run_s else ""
    return (f"\n\nUnstaged time in all: {units.seconds(time.seconds)} in {time.intervals:,} intervals{share} "
            "(each is in the run record).")


def _deferred(view: ProjectionView, traced: ProjectionView | None) -> str:
    """The headline of a scaled projection its drivers do not explain: the traced projection's
    figure for the same target, and that it stands in for the scaled one."""
    miss = view.unexplained or {}
    what = f" ({md.text(miss['what'])})" if miss.get("what") else ""
    text = (f"not explained by its drivers (miss {units.size(miss.get('bytes'))} in stage "
            f"{md.code(miss.get('stage', '?'))}{what}): see traced")
    if traced is None:
        return text + " (no traced projection in this record: a run without --no-trace makes one)"
    if traced.failed is not None:
        return f"{text}, which {_phrase(traced.failed.phrase)}"
    figure = (f"{units.size(traced.peak_rss)} peak RSS" if traced.peak_rss is not None
              else f"live tensors {units.size(traced.live_tensor_peak)}")
    return f"{text}: the traced figure stands for it, {figure} in stage {md.code(traced.peak_stage or '?')}"


def _timeline(plot: str | None) -> str:
    if not plot:
        return ""
    return ("## Timeline\n\n"
            f"![RSS over time]({quote(plot, errors='surrogateescape')})\n\n"
            "RSS over the run, stage by stage, each stage's peak drawn inside it (the time of a peak "
            "inside a stage is not recorded).")


_OVERHEAD = {"boundaries_s": "stage starts and ends", "census_s": "tensor census", "labels_s": "naming staged calls",
             "finish_s": "finishing (last readings, memray trace)"}  # the audit's own time, by what it was spent on


def _minimum(minimum: Minimum) -> str:
    head = "## Theoretical minimum and gap"
    if not minimum.items:
        return (f"{head}\n\nNo minimum was declared for this run (the job that ran the algorithm can declare one "
                "in the run record).")
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


def environment_section(environment: Environment, head: str = "## Environment") -> str:
    """The environment section (the training-step report shows its first configuration's)."""
    env, machine = environment.software, environment.machine
    rows = [["python", md.text(_or(env.python, "-"))], ["torch", md.text(env.torch or "-")],
            ["transformers", md.text(env.transformers or "-")],
            ["threads", md.text(_or(env.threads, "-"))],
            ["device", md.text(environment.device)]]
    if env.malloc is not None:  # None: a record from before it was kept
        rows.insert(4, ["malloc", md.text(malloc_setting(env.malloc, environment.malloc_threshold_fixed))])
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
        rows.append(["audit overhead", ", ".join(f"{md.text(_OVERHEAD.get(k, k.removesuffix('_s').replace('_', ' ')))} "
                                                 f"{units.seconds(v)}" for k, v in overhead.items())])
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


def malloc_setting(settings: dict[str, str], threshold_fixed: bool) -> str:
    """glibc malloc's settings of the run, and what they mean for its mmap threshold
    (`threshold_fixed`: the report model's `malloc_threshold_fixed`)."""
    if not settings:
        return "glibc defaults: the mmap threshold follows the largest block freed (up to 32 MiB)"
    given = ", ".join(f"{name}={value}" for name, value in sorted(settings.items()))
    return given + (": the mmap threshold stays fixed" if threshold_fixed
                    else ": the mmap threshold follows the largest block freed")


def _or(value: object, absent: str) -> object:
    """`value`, or what a reader sees for a reading the record does not have."""
    return absent if value is None else value
