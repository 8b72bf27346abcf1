"""The memory report: one markdown file (GitHub-flavoured) and its timeline PNG beside it.

    write_report(record, "runs/x/report.md", run_folder="runs/x")

Sections, in order: summary, stages (repeated calls folded into one row, unstaged time
where it matters), components (over the whole run with their plot; what was alive at the
high-water moments; the census at the peak stage, also just before it when its peak is at
its start, and at the last stage when it is another), timeline, top allocation sites at the
peak, findings (with remedies and the rules checked), theoretical minimum and gap,
environment. Everything comes from the run record; the only files read are the ones it names
(the flamegraph is linked, not read).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from urllib.parse import quote

from auditor import units
from auditor.analysis import findings as findings_module
from auditor.analysis import source_paths, stage_groups, unstaged
from auditor.analysis.component_history import history
from auditor.analysis.components import (BEYOND_CENSUS, BEYOND_LIVE, UNSEEN_TENSORS, ProjectionView,
                                         at_peak_categories, attribute, census_before, census_order,
                                         final_stage, is_traced, largest_weights, live_tensor_high, peak_at_start,
                                         peak_stage, projection_views, run_weights)
from auditor.allocation_sites import passes_through
from auditor.renderers import markdown_text as md
from auditor.renderers.projection_markdown import projection_sections, unexplained

SITE_STACK_FRAMES = 3
MAX_STAGE_ROWS = 300      # rows of the stage table, after folding repeated calls
MAX_COMPONENT_ROWS = 40   # folded components over the run
MAX_INSTANCES = 200       # instances listed under them
LIVE_PEAK_STAGES = 3      # stages whose live-tensor high is shown besides the peak stage's
INDENT = "&emsp;"


def write_report(record: dict, out: str | os.PathLike, run_folder: str | os.PathLike | None = None) -> Path:
    """Write the markdown report to `out` and its PNGs next to it (the timeline; the components
    over the run when the record has a census); returns `out`.

    `run_folder` is where the record's own files (flamegraph) live, for relative links."""
    from auditor.renderers import components_plot
    from auditor.renderers.timeline_plot import write_png
    out = Path(out)
    plot = out.with_name(out.stem + "-timeline.png")
    parts = out.with_name(out.stem + "-components.png")
    has_census = bool(census_order(record))
    text = render(record, plot=plot.name, report_folder=out.parent,  # first: a record the
                  run_folder=Path(run_folder) if run_folder is not None else None,  # renderer
                  components_plot=parts.name if has_census else None)  # refuses leaves no PNG
    try:
        write_png(record, plot)
        if has_census:
            components_plot.write_png(record, parts)
        out.write_text(text, encoding="utf-8")
    except BaseException:
        plot.unlink(missing_ok=True)
        parts.unlink(missing_ok=True)
        raise
    return out


def render(record: dict, *, plot: str | None = None, report_folder: Path | None = None,
           run_folder: Path | None = None, components_plot: str | None = None) -> str:
    """The report's markdown. `plot`, `components_plot`: the PNGs' paths relative to the report
    (None: no image)."""
    outcomes = findings_module.evaluate(record)
    found = findings_module.ordered([f for o in outcomes for f in o.findings])
    views = projection_views(record)
    parts = [
        f"# Memory report: {md.text(record.get('name', 'run'))}",
        _banner(record),
        _summary(record, found, views),
        _stages(record),
        _components_section(record, views, components_plot),
        projection_sections(record),
        _timeline(plot),
        sites_section(record, report_folder, run_folder),
        _findings(found, outcomes, source_paths.code_root(record)),
        _minimum(record),
        environment_section(record),
    ]
    return "\n\n".join(p for p in parts if p).rstrip() + "\n"


# -- pieces --------------------------------------------------------------------------------

def _banner(record: dict) -> str:
    lines = []
    exit_ = record.get("exit") or {}
    if exit_.get("status") == "unfinished":
        lines.append(_unfinished(record, exit_))
    elif exit_.get("status") not in (None, "ok"):
        error = f": {md.text(exit_['error'])}" if exit_.get("error") else ""
        lines.append(f"> **This run did not end ok ({md.text(exit_['status'])}){error}.** Readings stop where it stopped.")
    log = record.get("event_log") or {}
    if log.get("state") == "incomplete":
        lines.append(f"> **The event log is incomplete** ({md.text(log.get('reason', 'reason unknown'))}; "
                     f"{log.get('lines', 0):,} events written): this record was kept in memory and "
                     "written once there was space.")
    if is_traced(record):
        lines.append("> **A traced run on fake tensors.** Components and live tensors are the workload's; "
                     "RSS readings are the tracing process's, not the workload's.")
    return "\n>\n".join(lines)


def _unfinished(record: dict, exit_: dict) -> str:
    """What a reader of a killed run needs first: that it did not finish, and how far it got."""
    stages = record["stages"]
    finished = [s for s in stages if s.get("status") != "open"]
    still_open = [s for s in stages if s.get("status") == "open"]
    how = f" ({md.text(exit_['error'])})" if exit_.get("error") else ""
    got = f"{len(finished):,} of {len(stages):,} stages finished"
    if finished:
        got += f", the last {md.code(finished[-1]['path'])}"
    if still_open:
        got += "; open when it stopped: " + ", ".join(md.code(s["path"]) for s in still_open[-5:])
    return (f"> **This run did not finish**{how}: it was killed or interrupted, or its record "
            f"could not be written. {got}. Readings stop where the event log stops.")


def _summary(record: dict, found, views: list[ProjectionView]) -> str:
    peak = record.get("peak") or {}
    process = record.get("process") or {}
    weights, weights_at = run_weights(record), "at the peak stage"
    if not weights and largest_weights(record):  # the peak stage's census holds none
        weights, weights_at = largest_weights(record), "the most a census saw"
    holder = peak_stage(record)
    rows = [["run", md.text(record.get("name", "-"))]]
    place = unstaged.peak_place(record)
    where = f" {_phrase(place.phrase)}" if place.kind != "unknown" else f" ({_phrase(place.phrase)})"
    rows.append(["peak RSS", f"**{units.size(peak.get('rss'))}**{where}"])
    rows.append(["RSS at start / end", f"{units.size(process.get('rss_at_start'))} / "
                                       f"{units.size(process.get('rss_at_end'))}"])
    if weights:
        attribution = attribute(holder) if holder is not None else None
        buffers = attribution.buffers if attribution is not None else 0
        note = f"; module buffers {units.size(buffers)} not counted" if buffers else ""
        rows.append(["peak / weights", f"**{units.ratio(peak.get('rss'), weights)}** the weights "
                                       f"({units.size(weights)} of parameters {weights_at}{note})"])
    else:
        rows.append(["peak / weights", "no census: the weights are unknown (run with census on)"])
    live = live_tensor_high(record)
    if live:
        rows.append(["peak live tensors", f"{units.size(live[0])} {live[1]}"
                                          f" ({units.size((peak.get('rss') or 0) - live[0])} below peak RSS)"])
    else:
        largest = max(((s.get("tensors") or {}).get("live_bytes") or 0 for s in record["stages"]), default=0)
        extra = f"; largest census at a stage end: {units.size(largest)}" if largest else ""
        rows.append(["peak live tensors", f"not measured (no live-tensor meter in this record){extra}"])
    for view in views:
        value = (f"{units.size(view.peak_rss)} peak RSS" if view.peak_rss is not None
                 else _deferred(view, views) if view.unexplained is not None else "RSS not projected")
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
        rows.append([f"projected ({md.text(view.label)})", value])
    if not views:
        rows.append(["projections", "none in this record"])
    if "unstaged" in record:
        rows.append(["unstaged time", _unstaged_summary(record, place)])
    counts = {s: sum(1 for f in found if f.severity == s) for s in findings_module.SEVERITIES}
    tally = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "none"
    rows.append(["findings", f"{tally} (see [Findings](#findings))"])
    return "## Summary\n\n" + md.table(["measure", "value"], rows)


def _phrase(text: str) -> str:
    """A phrase with `code` spans (from analysis) made safe for a table cell."""
    pieces = text.split("`")
    return "".join(md.code(p) if i % 2 else md.text(p) for i, p in enumerate(pieces))


def _unstaged_summary(record: dict, place: unstaged.PeakPlace) -> str:
    count, seconds = unstaged.total(record)
    run_s = record.get("duration_s")
    share = f" ({seconds / run_s:.1%} of the run)" if run_s else ""
    text = f"{units.seconds(seconds)} in {count:,} intervals no stage covers{share}"
    if place.kind == "unstaged":
        text += f"; the run's peak is in one: {_phrase(place.phrase)}"
        if place.interval is not None:
            text += (f" ({units.seconds(place.interval['end_s'] - place.interval['start_s'])}, "
                     f"see [Components](#components))")
    return text


def _stages(record: dict) -> str:
    stages = record["stages"]
    if not stages:
        return "## Stages\n\nThe record has no stages." + _unstaged_note(record)
    shown_intervals = unstaged.notable(record)
    rows_all = stage_groups.stage_rows(record, shown_intervals)
    kept, left = stage_groups.limit(rows_all, MAX_STAGE_ROWS, record)
    live = any(s.get("live_tensors") for s in stages)
    heap = any(s.get("py_heap") for s in stages)
    cuda = any(s.get("cuda") for s in stages)
    folded = any(r.kind == "folded" for r in rows_all)
    headers = ["stage", "status", "duration", "RSS end", "delta", "peak inside", "peak - start"]
    headers += ["live tensors peak"] * live + ["Python heap end", "Python heap peak"] * heap
    headers += ["CUDA allocated", "CUDA reserved", "CUDA peak allocated"] * cuda
    headers += ["highest call (RSS; live tensors)"] * folded
    rows = [_stage_row(r, record, live, heap, cuda, folded) for r in kept]
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
    if shown_intervals:
        note += (" *(unstaged)* rows are time no stage covers at that depth, shown where their "
                 "peak or length matters.")
    more = ""
    if left:
        calls = sum(max(r.count, 1) for r in left)
        more = (f"\n\n{len(left):,} more rows ({calls:,} stages or intervals) are left out to keep "
                f"the table to {MAX_STAGE_ROWS} rows; every stage is in the run record's `stages`. "
                f"Shown: the row holding the peak with its parents, then the shallowest rows, "
                f"highest peaks first within a depth, each with its parents.")
    table = md.table(headers, rows, right=set(range(2, len(headers) - folded)))
    return "## Stages\n\n" + note + "\n\n" + table + more + _unstaged_note(record)


def _stage_row(row: stage_groups.StageRow, record: dict, live: bool, heap: bool, cuda: bool,
               folded: bool) -> list[str]:
    name = md.text(row.label) + (f" × {row.count:,}" if row.kind == "folded" else "")
    if row.kind == "unstaged":
        name = f"*{_phrase(row.label)}*"
    name = INDENT * row.depth + (f"**{name}**" if stage_groups.holds(row, record) else name)
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
        cells += [units.size((last.get("py_heap") or {}).get("end")), units.size(_most(row, "py_heap", "peak"))]
    if cuda:
        c = last.get("cuda") or {}
        cells += [units.size(c.get("allocated_end")), units.size(c.get("reserved_end")),
                  units.size(_most(row, "cuda", "peak_allocated"))]
    if folded:
        cells.append(_highest_calls(row) if row.kind == "folded" else "")
    return cells


def _most(row: stage_groups.StageRow, key: str, field: str) -> int | None:
    values = [(e.get(key) or {}).get(field) for e in row.entries]
    return max((v for v in values if v is not None), default=None)


def _status(row: stage_groups.StageRow) -> str:
    if row.kind == "unstaged":
        return "-"
    if row.count == 1:
        stage = row.stages[0]
        status = stage.get("status", "ok")
        if status == "failed":
            return "**FAILED**" + (f": {md.text(stage['error'])}" if stage.get("error") else "")
        return "**open** (never finished)" if status == "open" else md.text(status)
    counts = row.statuses
    if set(counts) == {"ok"}:
        return "ok"
    words = {"ok": "ok", "failed": "**FAILED**", "open": "**open**"}
    return ", ".join(f"{words.get(k, md.text(k))} {n:,}" for k, n in counts.items())


def _highest_calls(row: stage_groups.StageRow) -> str:
    rss, at = row.highest("rss")
    live, live_at = row.highest("live_tensors")
    text = f"{md.code(stage_groups.call_name(at))}" if at is not None else "-"
    if live_at is not None:
        text += f"; {md.code(stage_groups.call_name(live_at))} ({units.size(live)})"
    return text


def _unstaged_note(record: dict) -> str:
    if "unstaged" not in record:
        return ""
    count, seconds = unstaged.total(record)
    run_s = record.get("duration_s")
    share = f", {seconds / run_s:.1%} of the run" if run_s else ""
    return (f"\n\nUnstaged time in all: {units.seconds(seconds)} in {count:,} intervals{share} "
            f"(each is in the run record's `unstaged`).")


def _components_section(record: dict, views: list[ProjectionView], plot: str | None = None) -> str:
    parts = ["## Components"]
    has_census = bool(census_order(record))
    if has_census:
        parts.append(_over_the_run(record, plot))
    else:
        parts.append("No tensor census in this record (run with census on to see which structure "
                     "holds the memory).")
    place = unstaged.peak_place(record)
    if place.kind == "unstaged":
        parts.append(_unstaged_peak(record, place))
    parts += _live_highs(record, place)
    holder, last = peak_stage(record), final_stage(record)
    if not has_census:
        return "\n\n".join(parts)
    if holder is None:
        parts.append("No stage holds the run's peak, so there is no peak stage census to show.")
        return "\n\n".join(parts)
    before = census_before(record, holder) if peak_at_start(holder) else None
    if before is not None:  # the peak stage frees what made the peak: show it before too
        parts.append(_component_tables(record, before, views, "just before the peak stage",
                                       f"The peak stage {md.code(holder['path'])} reached its peak near its "
                                       f"start and ended {units.size(holder['rss']['peak'] - holder['rss']['end'])} "
                                       f"lower, so the census taken just before it began shows what "
                                       f"made the peak."))
    parts.append(_component_tables(record, holder, views, "at the peak stage"))
    if last is not None and last is not holder:
        parts.append(_component_tables(record, last, views, "at the last stage"))
    return "\n\n".join(parts)


def _over_the_run(record: dict, plot: str | None) -> str:
    items = history(record)
    ends = len(census_order(record))
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


def _unstaged_peak(record: dict, place: unstaged.PeakPlace) -> str:
    title = f"### What was alive at the run's peak, {_phrase(place.phrase)}"
    interval = place.interval
    if interval is None:
        return f"{title}\n\nThe record has no interval matching the peak's place."
    rss = interval["rss"]
    lead = (f"The run's peak RSS ({units.size(rss.get('peak'))}) fell in time no stage covers "
            f"({units.seconds(interval['end_s'] - interval['start_s'])}; RSS "
            f"{units.size(rss.get('start'))} at its start, {units.size(rss.get('end'))} at its end).")
    found = unstaged.composition(record, interval)
    if found is None:
        return f"{title}\n\n{lead} The record has no composition for it: no live-tensor meter and no census before it."
    kind, value = found
    if kind == "at_peak":
        return (f"{title}\n\n{lead} At the interval's live-tensor high (owners from the census at "
                f"the next stage end):\n\n{_at_peak_table(value)}")
    a = attribute(value)
    if a is None:
        return f"{title}\n\n{lead} The record has no composition for it: no live-tensor meter and no census before it."
    rows = [[md.code(r.name), md.text(r.category), units.size(r.bytes)] for r in a.rows]
    rows.append(["**census total**", "", f"**{units.size(a.census)}**"])
    return (f"{title}\n\n{lead} No live-tensor composition for it; the census at the end of "
            f"{md.code(value['path'])}, the last before it (an estimate of what was alive: the "
            f"interval may have made more):\n\n"
            + md.table(["component", "category", "bytes"], rows, right={2}))


def _live_highs(record: dict, place: unstaged.PeakPlace) -> list[str]:
    """'What was alive at the high-water moment' for the peak stage and the top live peaks."""
    chosen: list[dict] = []
    holder = next((s for s in record["stages"] if s["path"] == place.stage), None) if place.stage else None
    if holder is not None and (holder.get("live_tensors") or {}).get("at_peak"):
        chosen.append(holder)
    shown = (place.interval.get("live_tensors") or {}) if place.interval is not None else {}
    for stage in stage_groups.top_live_peaks(record, LIVE_PEAK_STAGES):
        same = (shown.get("at_peak") and place.interval is not None
                and stage["path"] == place.interval.get("parent")
                and stage["live_tensors"]["peak"] == shown.get("peak"))
        if not same and all(stage is not c for c in chosen):  # not the moment shown above again
            chosen.append(stage)
    parts = []
    for stage in chosen[:LIVE_PEAK_STAGES + 1]:
        meter = stage["live_tensors"]
        which = "the peak stage" if stage is holder else "a top live-tensor peak"
        call = stage_groups.call_name(stage)
        label = f" ({md.text(call)})" if call != stage["name"] else ""
        parts.append(f"### Alive at the live-tensor high of {md.code(stage['path'])}{label}, {which}\n\n"
                     f"What was alive at the moment the live-tensor meter was highest inside the stage "
                     f"({units.size(meter.get('peak'))}; {units.size(meter.get('start'))} at its start, "
                     f"{units.size(meter.get('end'))} at its end): every storage alive then, by owner "
                     f"(its census component at the stage end) and category; storages freed before "
                     f"the stage ended have no owner and are named by the operator and stage that "
                     f"made them.\n\n{_at_peak_table(meter['at_peak'])}")
    return parts


def _at_peak_table(at_peak: dict) -> str:
    total = at_peak.get("bytes")
    rows = []
    for row in at_peak.get("rows") or []:
        owner = md.code(row["owner"]) if row.get("owner") else "-"
        rows.append([owner, md.text(row.get("category") or "other"),
                     md.code(row["created_in"]) if row.get("created_in") else "before the audit or unstaged",
                     md.code(row["op"]) if row.get("op") else "-", f"{row.get('tensors', 0):,}",
                     units.size(row["bytes"]), units.share(row["bytes"], total),
                     "yes" if row.get("alive_at_end") else "no, freed before it"])
    if at_peak.get("rows_left_out"):
        rows.append([f"{at_peak['rows_left_out']:,} smaller groups", "", "", "", "",
                     units.size(at_peak.get("bytes_left_out")), units.share(at_peak.get("bytes_left_out"), total), ""])
    rows.append(["**total at the high**", "", "", "", "", f"**{units.size(total)}**", "", ""])
    table = md.table(["owner", "category", "created in", "op", "tensors", "bytes", "share", "alive at the end"],
                   rows, right={4, 5, 6})
    categories = "; ".join(f"{md.text(c)} {units.size(b)}" for c, b in at_peak_categories(at_peak))
    return f"{table}\n\nBy category: {categories or 'none'}."


def _deferred(view: ProjectionView, views: list[ProjectionView]) -> str:
    """The headline of a scaled projection its drivers do not explain: the traced projection's
    figure for the same target, and that it stands in for the scaled one."""
    miss = view.unexplained or {}
    what = f" ({md.text(miss['what'])})" if miss.get("what") else ""
    text = (f"not explained by its drivers (miss {units.size(miss.get('bytes'))} in stage "
            f"{md.code(miss.get('stage', '?'))}{what}): see traced")
    traced = next((v for v in views if v.method == "traced" and v.target == view.target
                   and v.target_dtype == view.target_dtype and v.live_tensor_peak is not None), None)
    if traced is None:
        return text + " (no traced projection in this record: a run without --no-trace makes one)"
    figure = (f"{units.size(traced.peak_rss)} peak RSS" if traced.peak_rss is not None
              else f"live tensors {units.size(traced.live_tensor_peak)}")
    return f"{text}: the traced figure stands for it, {figure} in stage {md.code(traced.peak_stage or '?')}"


def _component_tables(record: dict, stage: dict, views: list[ProjectionView], which: str,
                      why: str = "") -> str:
    title = f"### Components {which}: {md.code(stage['path'])}"
    a = attribute(stage)
    if a is None:
        return f"{title}\n\nThis stage has no census."
    rss = stage["rss"]
    lead = (f"Census at the end of the stage, a moment after its work (for the algorithm's state "
            f"over the run see *Over the run*; for what made a peak, the live-tensor highs): "
            f"RSS {units.size(a.rss_end)}; the peak inside the stage "
            f"was {units.size(a.rss_peak)} ({units.signed_size(None if a.rss_peak is None or a.rss_end is None else a.rss_peak - a.rss_end)} "
            f"from its end: transients, see the timeline and the allocation sites). "
            f"Share = of RSS at the stage end.")
    if why:
        lead = f"{why} {lead}"
    projected = [(v, v.stages.get(stage["path"])) for v in views]
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
        rows.append(["**peak inside the stage**", "", f"**{units.size(rss['peak'])}**", ""]
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


def sites_section(record: dict, report_folder: Path | None, run_folder: Path | None,
                  head: str = "## Top allocation sites at the peak") -> str:
    """memray's sites alive at its high-water mark (the training-step report titles it its own way)."""
    memray = record.get("memray")
    probe = (record.get("probes") or {}).get("memray") or {}
    if not memray:
        why = probe.get("reason") or ("memray was off for this run (`auditor run --memray`; `auditor gradprobe` traces unless given --no-memray)"
                                      if probe.get("state") in (None, "off") else f"memray {probe.get('state')}")
        return f"{head}\n\nNo memray trace: {md.text(why)}."
    sites = memray.get("sites") or []
    root = source_paths.code_root(record)
    lead = (f"memray's high-water mark: {units.size(memray.get('peak_memory'))} of native allocations "
            f"({_memray_stage(memray)}), {memray.get('total_allocations', 0):,} allocations in the run. "
            "Sites alive at that instant, grouped by their innermost frame in user code:")
    if memray.get("auditor_bytes"):
        lead += (f" ({units.size(memray['auditor_bytes'])} allocated by the auditor itself and alive "
                 f"then are left out.)")
    rows = []
    for index, site in enumerate(sites, 1):
        where = source_paths.shown_path(site.get("location", "?"), root)
        if site.get("code"):  # the source line, read when the trace was summarized
            where = f"{where}: {site['code']}"
        rows.append([str(index), md.code(where),
                     md.code(site["function"]) if site.get("function") else "-",
                     units.size(site.get("bytes")), f"{site.get('allocations', 0):,}", _stack(site, root)])
    table = md.table(["#", "location and line", "function", "bytes", "allocations", "stack (innermost first)"],
                   rows, right={0, 3, 4}) if rows else "No allocation was alive at the high-water mark."
    return f"{head}\n\n{lead}\n\n{table}\n\n{_flamegraph_link(memray, report_folder, run_folder)}"


def _memray_stage(memray: dict) -> str:
    """The stage memray's high-water mark belongs to, and how it was found (older records: the
    run's RSS-peak stage, said so)."""
    basis = memray.get("stage_basis")
    at = f", about {units.seconds(memray['at_s'])} into the audit" if memray.get("at_s") is not None else ""
    if memray.get("stage"):
        where = f"in stage {md.code(memray['stage'])}"
    elif basis:
        where = "in no stage (unstaged time)"
    else:
        return "outside any stage"
    how = md.text(basis) if basis else "the run's RSS-peak stage (an older record: not located by time)"
    return f"{where}{at}; stage found by: {how}"


def _flamegraph_link(memray: dict, report_folder: Path | None, run_folder: Path | None) -> str:
    name = memray.get("flamegraph")
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


def _stack(site: dict, root: str | None) -> str:
    frames = site.get("python_stack") or []
    native = not frames
    if native:
        frames = site.get("native_stack") or []
    if not native:  # torch's call plumbing says nothing about who asked for the memory
        frames = [f for f in frames if not passes_through(*_function_and_file(f))]
    shown = []
    for frame in frames[:SITE_STACK_FRAMES]:
        frame = frame.removesuffix(" (<unknown>)")  # native frames without a known file
        function, _, where = frame.partition(" at ")
        function = function if len(function) <= 60 else function[:57] + "..."
        shown.append(f"{function} ({source_paths.shown_path(where, root)})" if where else function)
    if not shown:
        return "-"
    text = " ← ".join(shown) + (" ← …" if len(frames) > SITE_STACK_FRAMES else "")
    return ("native: " if native else "") + md.text(text)


def _function_and_file(frame: str) -> tuple[str, str]:
    function, _, where = frame.partition(" at ")
    return function, where.rsplit(":", 1)[0]


def _findings(found, outcomes, code_root: str | None) -> str:
    head = "## Findings"
    if found:
        lines = []
        for f in found:
            shown = {**f.evidence, "memray_site": source_paths.shown_path(f.evidence["memray_site"], code_root)
                     } if f.evidence.get("memray_site") else f.evidence
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


def _minimum(record: dict) -> str:
    head = "## Theoretical minimum and gap"
    minimum = record.get("minimum")
    if not isinstance(minimum, dict) or not minimum.get("items"):
        return f"{head}\n\nNo minimum was declared for this run (the job that ran the algorithm puts it in the record's `minimum` field)."
    items = minimum["items"]
    total = minimum.get("total")
    if total is None:
        total = sum(i.get("bytes") or 0 for i in items)
    rows = [[md.text(i.get("name", "?")), units.size(i.get("bytes")), md.text(i.get("why", ""))] for i in items]
    rows.append(["**total**", f"**{units.size(total)}**", ""])
    peak = (record.get("peak") or {}).get("rss")
    gap_rows = [["peak RSS", units.size(peak), units.signed_size(None if peak is None else peak - total),
                 units.ratio(peak, total)]]
    live = live_tensor_high(record)
    if live:
        gap_rows.append(["peak live tensors", units.size(live[0]), units.signed_size(live[0] - total),
                         units.ratio(live[0], total)])
    else:
        gap_rows.append(["peak live tensors", "not measured", "-", "-"])
    note = f"\n\n{md.text(minimum['note'])}" if minimum.get("note") else ""
    return (f"{head}\n\n" + md.table(["item", "bytes", "why"], rows, right={1}) + note + "\n\n"
            + md.table(["measured", "bytes", "gap to the minimum", "x minimum"], gap_rows, right={1, 2, 3}))


def environment_section(record: dict, head: str = "## Environment") -> str:
    env = record.get("environment") or {}
    machine = record.get("machine") or {}
    rows = [["python", md.text(env.get("python", "-"))], ["torch", md.text(env.get("torch") or "-")],
            ["transformers", md.text(env.get("transformers") or "-")],
            ["threads", md.text(env.get("threads") if env.get("threads") is not None else "-")],
            ["device", md.text(record.get("device", "-"))]]
    if machine:
        rows.append(["machine", md.text(f"{machine.get('platform', '?')}, {machine.get('cpus', '?')} CPUs, "
                                      f"{units.size(machine.get('memory_total'))} memory")])
    command = source_paths.shown_command(record.get("command", "-"), source_paths.code_root(record))
    rows += [["command", md.code(command)], ["started at", md.text(record.get("started_at", "-"))]]
    if record.get("finished_at"):
        rows.append(["finished at", md.text(record["finished_at"])])
    if record.get("duration_s") is not None:
        rows.append(["audited time", units.seconds(record["duration_s"]) + " (census time excluded)"])
    exit_ = record.get("exit") or {}
    if exit_:
        rows.append(["exit", md.text(exit_.get("status", "-") + (f": {exit_['error']}" if exit_.get("error") else ""))])
    overhead = record.get("audit_overhead_s") or {}
    if overhead:
        rows.append(["audit overhead", ", ".join(f"{md.text(k)} {units.seconds(v)}" for k, v in overhead.items())])
    probe_rows = []
    for name, probe in (record.get("probes") or {}).items():
        probe = probe if isinstance(probe, dict) else {"state": probe}
        detail = probe.get("reason") or probe.get("method") or ""
        probe_rows.append([md.text(name), md.text(probe.get("state", "-")), md.text(detail)])
    if not any(s.get("live_tensors") for s in record["stages"]) and "live_tensors" not in (record.get("probes") or {}):
        probe_rows.append(["live tensors", "absent", "no live-tensor meter readings in this record"])
    parts = [head, md.table(["setting", "value"], rows)]
    if probe_rows:
        parts.append("Probes:\n\n" + md.table(["probe", "state", "method or reason"], probe_rows))
    warnings = record.get("warnings") or []
    parts.append("Warnings:\n\n" + "\n".join(f"- {md.text(w)}" for w in warnings) if warnings else "Warnings: none.")
    return "\n\n".join(parts)

