"""The memory report: one markdown file (GitHub-flavoured) and its timeline PNG beside it.

    write_report(record, "runs/x/report.md", run_folder="runs/x")

Sections, in order: summary, stages, components (at the peak stage; also just before it
when its peak is at its start, and at the last stage when it is another), timeline, top
allocation sites at the peak, findings (with the rules checked), theoretical minimum and
gap, environment. Everything comes from the run record;
the only files read are the ones it names (the flamegraph is linked, not read).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from urllib.parse import quote

from auditor import units
from auditor.analysis import findings as findings_module
from auditor.analysis import source_paths
from auditor.analysis.components import (BEYOND_CENSUS, BEYOND_LIVE, UNSEEN_TENSORS, ProjectionView,
                                         attribute, census_before, census_order, final_stage,
                                         is_traced, live_tensor_peak, peak_at_start, peak_stage,
                                         projection_views, run_weights, stage_depths)
from auditor.probes.memray_trace import passes_through

SITE_STACK_FRAMES = 3
MAX_STAGE_ROWS = 300
INDENT = "&emsp;"


def write_report(record: dict, out: str | os.PathLike, run_folder: str | os.PathLike | None = None) -> Path:
    """Write the markdown report to `out` and its timeline PNG next to it; returns `out`.

    `run_folder` is where the record's own files (flamegraph) live, for relative links."""
    from auditor.renderers.timeline_plot import write_png
    out = Path(out)
    plot = out.with_name(out.stem + "-timeline.png")
    text = render(record, plot=plot.name, report_folder=out.parent,  # first: a record the
                  run_folder=Path(run_folder) if run_folder is not None else None)  # renderer
    write_png(record, plot)                                          # refuses leaves no PNG
    try:
        out.write_text(text, encoding="utf-8")
    except BaseException:
        plot.unlink(missing_ok=True)
        raise
    return out


def render(record: dict, *, plot: str | None = None, report_folder: Path | None = None,
           run_folder: Path | None = None) -> str:
    """The report's markdown. `plot`: the PNG's path relative to the report (None: no image)."""
    outcomes = findings_module.evaluate(record)
    found = findings_module.ordered([f for o in outcomes for f in o.findings])
    views = projection_views(record)
    parts = [
        f"# Memory report: {_text(record.get('name', 'run'))}",
        _banner(record),
        _summary(record, found, views),
        _stages(record),
        _components_section(record, views),
        _timeline(plot),
        _sites(record, report_folder, run_folder),
        _findings(found, outcomes, source_paths.code_root(record)),
        _minimum(record),
        _environment(record),
    ]
    return "\n\n".join(p for p in parts if p).rstrip() + "\n"


# -- pieces --------------------------------------------------------------------------------

def _text(value) -> str:
    """Plain text safe inside a table cell."""
    text = str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
    for char, entity in (("<", "&lt;"), (">", "&gt;"), ("*", "\\*"), ("[", "\\["), ("]", "\\]")):
        text = text.replace(char, entity)
    return text


def _code(value) -> str:
    """Inline code safe inside a table cell."""
    return "`" + str(value).replace("`", "'").replace("|", "\\|").replace("\n", " ") + "`"


def _table(headers: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> str:
    align = ["---:" if i in right else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _banner(record: dict) -> str:
    lines = []
    exit_ = record.get("exit") or {}
    if exit_.get("status") == "unfinished":
        lines.append(_unfinished(record, exit_))
    elif exit_.get("status") not in (None, "ok"):
        error = f": {_text(exit_['error'])}" if exit_.get("error") else ""
        lines.append(f"> **This run did not end ok ({_text(exit_['status'])}){error}.** Readings stop where it stopped.")
    log = record.get("event_log") or {}
    if log.get("state") == "incomplete":
        lines.append(f"> **The event log is incomplete** ({_text(log.get('reason', 'reason unknown'))}; "
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
    how = f" ({_text(exit_['error'])})" if exit_.get("error") else ""
    got = f"{len(finished):,} of {len(stages):,} stages finished"
    if finished:
        got += f", the last {_code(finished[-1]['path'])}"
    if still_open:
        got += "; open when it stopped: " + ", ".join(_code(s["path"]) for s in still_open[-5:])
    return (f"> **This run did not finish**{how}: it was killed or interrupted, or its record "
            f"could not be written. {got}. Readings stop where the event log stops.")


def _summary(record: dict, found, views: list[ProjectionView]) -> str:
    peak = record.get("peak") or {}
    process = record.get("process") or {}
    weights = run_weights(record)
    holder = peak_stage(record)
    rows = [["run", _text(record.get("name", "-"))]]
    where = f" in stage {_code(peak['stage'])}" if peak.get("stage") else " (outside every stage)"
    rows.append(["peak RSS", f"**{units.size(peak.get('rss'))}**{where}"])
    rows.append(["RSS at start / end", f"{units.size(process.get('rss_at_start'))} / "
                                       f"{units.size(process.get('rss_at_end'))}"])
    if weights:
        buffers = attribute(holder).buffers if holder is not None and holder.get("components") is not None else 0
        note = f"; module buffers {units.size(buffers)} not counted" if buffers else ""
        rows.append(["peak / weights", f"**{units.ratio(peak.get('rss'), weights)}** the weights "
                                       f"({units.size(weights)} of parameters at the peak stage{note})"])
    else:
        rows.append(["peak / weights", "no census: the weights are unknown (run with census on)"])
    live = live_tensor_peak(record)
    if live:
        rows.append(["peak live tensors", f"{units.size(live[0])} in stage {_code(live[1])}"
                                          f" ({units.size((peak.get('rss') or 0) - live[0])} below peak RSS)"])
    else:
        largest = max(((s.get("tensors") or {}).get("live_bytes") or 0 for s in record["stages"]), default=0)
        extra = f"; largest census at a stage end: {units.size(largest)}" if largest else ""
        rows.append(["peak live tensors", f"not measured (no live-tensor meter in this record){extra}"])
    for view in views:
        value = (f"{units.size(view.peak_rss)} peak RSS" if view.peak_rss is not None
                 else "RSS not projected")
        if view.peak_stage:
            value += f" in stage {_code(view.peak_stage)}"
        if view.live_tensor_peak is not None:
            value += f"; live tensors {units.size(view.live_tensor_peak)}"
        rows.append([f"projected ({_text(view.label)})", value])
    if not views:
        rows.append(["projections", "none in this record"])
    counts = {s: sum(1 for f in found if f.severity == s) for s in findings_module.SEVERITIES}
    tally = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "none"
    rows.append(["findings", f"{tally} (see [Findings](#findings))"])
    return "## Summary\n\n" + _table(["measure", "value"], rows)


def _stages(record: dict) -> str:
    stages = record["stages"]
    if not stages:
        return "## Stages\n\nThe record has no stages."
    depths = stage_depths(record)
    live = any(s.get("live_tensors") for s in stages)
    heap = any(s.get("py_heap") for s in stages)
    cuda = any(s.get("cuda") for s in stages)
    headers = ["stage", "status", "duration", "RSS end", "delta", "peak inside", "peak - start"]
    headers += ["live tensors peak"] * live + ["Python heap end", "Python heap peak"] * heap
    headers += ["CUDA allocated", "CUDA reserved", "CUDA peak allocated"] * cuda
    peak_id, peak_path = (record.get("peak") or {}).get("stage_id"), (record.get("peak") or {}).get("stage")
    shown, note_more = stages, ""
    if len(stages) > MAX_STAGE_ROWS:  # the highest peaks and their parents, in run order
        ranked = sorted(stages, key=lambda s: (s.get("rss") or {}).get("peak") or 0, reverse=True)
        keep = {s["path"] for s in ranked[:MAX_STAGE_ROWS]}
        for path in list(keep):
            while "/" in path:
                path = path.rpartition("/")[0]
                keep.add(path)
        shown = [s for s in stages if s["path"] in keep]
        note_more = (f"\n\n{len(stages) - len(shown):,} more stages with lower peaks are in the "
                     f"run record; shown: the {MAX_STAGE_ROWS} highest peaks and their parents.")
    rows = []
    for s in shown:
        rss = s.get("rss") or {}
        is_peak = (s.get("id") == peak_id) if peak_id is not None else s["path"] == peak_path
        name = INDENT * depths.get(s["path"], 0) + (f"**{_text(s['name'])}**" if is_peak else _text(s["name"]))
        status = s.get("status", "ok")
        if status == "failed":
            status = "**FAILED**" + (f": {_text(s['error'])}" if s.get("error") else "")
        elif status == "open":
            status = "**open** (never finished)"
        duration = None if s.get("end_s") is None else s["end_s"] - s["start_s"]
        end, start, top = rss.get("end"), rss.get("start"), rss.get("peak")
        row = [name, status, units.seconds(duration), units.size(end),
               units.signed_size(None if end is None else end - start), units.size(top),
               units.signed_size(None if top is None else top - start)]
        if live:
            row.append(units.size((s.get("live_tensors") or {}).get("peak")))
        if heap:
            h = s.get("py_heap") or {}
            row += [units.size(h.get("end")), units.size(h.get("peak"))]
        if cuda:
            c = s.get("cuda") or {}
            row += [units.size(c.get("allocated_end")), units.size(c.get("reserved_end")),
                    units.size(c.get("peak_allocated"))]
        rows.append(row)
    note = ("Stages in start order, indented under their parent; the stage holding the run's "
            "peak is in bold. *delta* = RSS end - start; *peak inside* is the highest RSS at any "
            "instant of the stage.")
    return "## Stages\n\n" + note + "\n\n" + _table(headers, rows, right=set(range(2, len(headers)))) + note_more


def _components_section(record: dict, views: list[ProjectionView]) -> str:
    holder, last = peak_stage(record), final_stage(record)
    if holder is None:
        return "## Components\n\nNo stage holds the run's peak."
    if not census_order(record):
        return ("## Components\n\nNo tensor census in this record (run with census on to see "
                "which structure holds the memory).")
    parts = ["## Components"]
    before = census_before(record, holder) if peak_at_start(holder) else None
    if before is not None:  # the peak stage frees what made the peak: show it before too
        parts.append(_component_tables(record, before, views, "just before the peak stage",
                                       f"The peak stage {_code(holder['path'])} reached its peak near its "
                                       f"start and ended {units.size(holder['rss']['peak'] - holder['rss']['end'])} "
                                       f"lower, so the census taken just before it began shows what "
                                       f"made the peak."))
    parts.append(_component_tables(record, holder, views, "at the peak stage"))
    if last is not None and last is not holder:
        parts.append(_component_tables(record, last, views, "at the last stage"))
    return "\n\n".join(parts)


def _component_tables(record: dict, stage: dict, views: list[ProjectionView], which: str,
                      why: str = "") -> str:
    title = f"### Components {which}: {_code(stage['path'])}"
    a = attribute(stage)
    if a is None:
        return f"{title}\n\nThis stage has no census."
    rss = stage["rss"]
    lead = (f"Census at the end of the stage: RSS {units.size(a.rss_end)}; the peak inside the stage "
            f"was {units.size(a.rss_peak)} ({units.signed_size(None if a.rss_peak is None or a.rss_end is None else a.rss_peak - a.rss_end)} "
            f"from its end: transients, see the timeline and the allocation sites). "
            f"Share = of RSS at the stage end.")
    if why:
        lead = f"{why} {lead}"
    projected = [(v, v.stages.get(stage["path"])) for v in views]
    headers = ["component", "category", "bytes", "share"] + [f"projected, {_text(v.label)}" for v, _ in projected]

    def proj(get) -> list[str]:
        return [units.size(get(p)) if p is not None else "-" for _, p in projected]

    rows = [[_code(r.name), _text(r.category), units.size(r.bytes), units.share(r.bytes, a.rss_end)]
            + proj(lambda p, n=r.name: p.components.get(n)) for r in a.rows]
    rows.append(["**census total**", "", f"**{units.size(a.census)}**", units.share(a.census, a.rss_end)]
                + proj(lambda p: sum(v for v in p.components.values() if v is not None)))
    rows.append([_text(BEYOND_CENSUS), "", units.size(a.beyond_census), units.share(a.beyond_census, a.rss_end)]
                + proj(lambda p: None if p.unseen is None and p.beyond_tensors is None
                       else (p.unseen or 0) + (p.beyond_tensors or 0)))
    if a.unseen is not None:
        rows.append([INDENT + "of which " + _text(UNSEEN_TENSORS), "", units.size(a.unseen),
                     units.share(a.unseen, a.rss_end)] + proj(lambda p: p.unseen))
        rows.append([INDENT + "of which " + _text(BEYOND_LIVE), "", units.size(a.beyond_live),
                     units.share(a.beyond_live, a.rss_end)] + proj(lambda p: p.beyond_tensors))
    rows.append(["**RSS at the stage end**", "", f"**{units.size(a.rss_end)}**",
                 units.share(a.rss_end, a.rss_end)] + proj(lambda p: None))
    if a.rss_peak is not None and a.rss_end is not None:
        rows.append(["transient inside the stage (peak - end)", "", units.size(a.rss_peak - a.rss_end), ""]
                    + proj(lambda p: p.transient))
        rows.append(["**peak inside the stage**", "", f"**{units.size(rss['peak'])}**", ""]
                    + proj(lambda p: p.rss_peak))
    table = _table(headers, rows, right=set(range(2, len(headers))))
    cat_headers = ["category", "bytes", "share", "x weights"] + [f"projected, {_text(v.label)}" for v, _ in projected]
    cat_rows = []
    for category, total in a.categories:
        names = [r.name for r in a.rows if r.category == category]
        cat_rows.append([_text(category), units.size(total), units.share(total, a.rss_end),
                         units.ratio(total, a.weights)]
                        + proj(lambda p, ns=names: sum(p.components.get(n) or 0 for n in ns)))
    cat_rows.append([_text(BEYOND_CENSUS), units.size(a.beyond_census),
                     units.share(a.beyond_census, a.rss_end), units.ratio(a.beyond_census, a.weights)]
                    + ["" for _ in projected])
    cat_rows.append(["**RSS at the stage end**", f"**{units.size(a.rss_end)}**",
                     units.share(a.rss_end, a.rss_end), units.ratio(a.rss_end, a.weights)]
                    + ["" for _ in projected])
    categories = _table(cat_headers, cat_rows, right=set(range(1, len(cat_headers))))
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


def _sites(record: dict, report_folder: Path | None, run_folder: Path | None) -> str:
    memray = record.get("memray")
    probe = (record.get("probes") or {}).get("memray") or {}
    head = "## Top allocation sites at the peak"
    if not memray:
        why = probe.get("reason") or ("memray was off for this run (`auditor run --memray`; `auditor gradprobe` traces unless given --no-memray)"
                                      if probe.get("state") in (None, "off") else f"memray {probe.get('state')}")
        return f"{head}\n\nNo memray trace: {_text(why)}."
    sites = memray.get("sites") or []
    root = source_paths.code_root(record)
    lead = (f"memray's high-water mark: {units.size(memray.get('peak_memory'))} of native allocations "
            f"({'stage ' + _code(memray['stage']) if memray.get('stage') else 'outside any stage'}), {memray.get('total_allocations', 0):,} allocations in the run. "
            "Sites alive at that instant, grouped by their innermost frame in user code:")
    rows = []
    for index, site in enumerate(sites, 1):
        where = source_paths.shown_path(site.get("location", "?"), root)
        if site.get("code"):  # the source line, read when the trace was summarized
            where = f"{where}: {site['code']}"
        rows.append([str(index), _code(where),
                     _code(site["function"]) if site.get("function") else "-",
                     units.size(site.get("bytes")), f"{site.get('allocations', 0):,}", _stack(site, root)])
    table = _table(["#", "location and line", "function", "bytes", "allocations", "stack (innermost first)"],
                   rows, right={0, 3, 4}) if rows else "No allocation was alive at the high-water mark."
    return f"{head}\n\n{lead}\n\n{table}\n\n{_flamegraph_link(memray, report_folder, run_folder)}"


def _flamegraph_link(memray: dict, report_folder: Path | None, run_folder: Path | None) -> str:
    name = memray.get("flamegraph")
    if not name:
        return "No flamegraph was written for this run."
    if run_folder is None or report_folder is None:
        return f"Flamegraph: {_code(name)} in the run folder."
    target = Path(run_folder) / name
    if _kept_out_of_git(target):  # a link would break for everyone reading the committed report
        folder = os.path.relpath(Path(run_folder).resolve(), Path(report_folder).resolve())
        return (f"Flamegraph: {_code(name)} in the run folder {_code(folder)}, where the command wrote it; "
                "git ignores it (megabytes), so it exists only where the command ran.")
    if not target.exists():
        return f"Flamegraph: {_code(name)} was not found in the run folder {_code(run_folder)}."
    return f"Flamegraph of the allocations alive at the peak: [{_text(name)}]({_relative_link(target, report_folder)})."


def _kept_out_of_git(path: Path) -> bool:
    """True when `path` lies in a git work tree that ignores it (False without git)."""
    try:
        done = subprocess.run(["git", "check-ignore", "-q", path.name], cwd=path.parent,
                              capture_output=True, timeout=10) if path.parent.is_dir() else None
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done is not None and done.returncode == 0


def _relative_link(target: Path, report_folder: Path) -> str:
    """A markdown link target to `target`, relative to the folder holding the report."""
    relative = Path(os.path.relpath(Path(target).resolve(), Path(report_folder).resolve())).as_posix()
    return quote(relative)


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
    return ("native: " if native else "") + _text(text)


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
            evidence = ", ".join(f"{k.replace('_', ' ')} {_code(v)}" for k, v in shown.items()
                                 if k in ("stage", "component", "from_stage", "to_stage", "memray_site") and v)
            lines.append(f"- **{f.severity}** ({f.rule}): {f.statement}" + (f" Evidence: {evidence}." if evidence else ""))
        body = "\n".join(lines)
    else:
        body = "No rule fired on this record."
    rows = []
    for o in outcomes:
        result = (f"not checked: {_text(o.not_checked)}" if o.not_checked
                  else f"fired ({len(o.findings)})" if o.findings else "silent")
        rows.append([_code(o.rule.id), _text(o.rule.title), _text(o.rule.threshold), result])
    rules = _table(["rule", "looks for", "threshold", "result"], rows)
    return f"{head}\n\nDetected from the record by the rules below, not written by hand.\n\n{body}\n\nRules checked:\n\n{rules}"


def _minimum(record: dict) -> str:
    head = "## Theoretical minimum and gap"
    minimum = record.get("minimum")
    if not isinstance(minimum, dict) or not minimum.get("items"):
        return f"{head}\n\nNo minimum was declared for this run (the job that ran the algorithm puts it in the record's `minimum` field)."
    items = minimum["items"]
    total = minimum.get("total")
    if total is None:
        total = sum(i.get("bytes") or 0 for i in items)
    rows = [[_text(i.get("name", "?")), units.size(i.get("bytes")), _text(i.get("why", ""))] for i in items]
    rows.append(["**total**", f"**{units.size(total)}**", ""])
    peak = (record.get("peak") or {}).get("rss")
    gap_rows = [["peak RSS", units.size(peak), units.signed_size(None if peak is None else peak - total),
                 units.ratio(peak, total)]]
    live = live_tensor_peak(record)
    if live:
        gap_rows.append(["peak live tensors", units.size(live[0]), units.signed_size(live[0] - total),
                         units.ratio(live[0], total)])
    else:
        gap_rows.append(["peak live tensors", "not measured", "-", "-"])
    note = f"\n\n{_text(minimum['note'])}" if minimum.get("note") else ""
    return (f"{head}\n\n" + _table(["item", "bytes", "why"], rows, right={1}) + note + "\n\n"
            + _table(["measured", "bytes", "gap to the minimum", "x minimum"], gap_rows, right={1, 2, 3}))


def _environment(record: dict) -> str:
    env = record.get("environment") or {}
    machine = record.get("machine") or {}
    rows = [["python", _text(env.get("python", "-"))], ["torch", _text(env.get("torch") or "-")],
            ["transformers", _text(env.get("transformers") or "-")],
            ["threads", _text(env.get("threads") if env.get("threads") is not None else "-")],
            ["device", _text(record.get("device", "-"))]]
    if machine:
        rows.append(["machine", _text(f"{machine.get('platform', '?')}, {machine.get('cpus', '?')} CPUs, "
                                      f"{units.size(machine.get('memory_total'))} memory")])
    command = source_paths.shown_command(record.get("command", "-"), source_paths.code_root(record))
    rows += [["command", _code(command)], ["started at", _text(record.get("started_at", "-"))]]
    if record.get("finished_at"):
        rows.append(["finished at", _text(record["finished_at"])])
    if record.get("duration_s") is not None:
        rows.append(["audited time", units.seconds(record["duration_s"]) + " (census time excluded)"])
    exit_ = record.get("exit") or {}
    if exit_:
        rows.append(["exit", _text(exit_.get("status", "-") + (f": {exit_['error']}" if exit_.get("error") else ""))])
    overhead = record.get("audit_overhead_s") or {}
    if overhead:
        rows.append(["audit overhead", ", ".join(f"{_text(k)} {units.seconds(v)}" for k, v in overhead.items())])
    probe_rows = []
    for name, probe in (record.get("probes") or {}).items():
        probe = probe if isinstance(probe, dict) else {"state": probe}
        detail = probe.get("reason") or probe.get("method") or ""
        probe_rows.append([_text(name), _text(probe.get("state", "-")), _text(detail)])
    if not any(s.get("live_tensors") for s in record["stages"]) and "live_tensors" not in (record.get("probes") or {}):
        probe_rows.append(["live tensors", "absent", "no live-tensor meter readings in this record"])
    parts = ["## Environment", _table(["setting", "value"], rows)]
    if probe_rows:
        parts.append("Probes:\n\n" + _table(["probe", "state", "method or reason"], probe_rows))
    warnings = record.get("warnings") or []
    parts.append("Warnings:\n\n" + "\n".join(f"- {_text(w)}" for w in warnings) if warnings else "Warnings: none.")
    return "\n\n".join(parts)

