"""The run report's component details, folded under `<details>`: every component over the run
(with each instance and the components plot), what was alive at each live-tensor high, and the
census just before the peak stage and at the last stage (the peak stage's own census is the
report's answer table unless the run's peak fell between stages, auditor.renderers.answer_markdown).
Formats auditor.report_models.run's `components` only.
"""
from __future__ import annotations

from urllib.parse import quote

from auditor.analysis.run.attribution import BEYOND_CENSUS, BEYOND_LIVE, UNSEEN_TENSORS
from auditor.analysis.run.component_history import ComponentHistory
from auditor.facts import units
from auditor.record.schema import Stage, Unstaged
from auditor.renderers import markdown_text as md
from auditor.renderers.markdown_text import INDENT, folded
from auditor.renderers.markdown_text import phrase as _phrase
from auditor.renderers.projection_markdown import unexplained
from auditor.report_models.run import AliveAt, Components, LiveHigh, StageCensus, UnstagedPeak

MAX_COMPONENT_ROWS = 40   # folded components over the run
MAX_INSTANCES = 200       # instances listed under them


def details(components: Components, plot: str | None = None) -> list[str]:
    """The folded blocks: over the run, the live-tensor highs, the censuses besides the peak stage's."""
    blocks = []
    if components.has_census:
        blocks.append(folded(f"Components over the run ({len(components.over_the_run):,}), each instance",
                             _over_the_run(components.over_the_run, components.census_ends, plot)))
    highs = components.live_highs
    if highs:
        blocks.append(folded(f"What was alive at each live-tensor high ({len(highs)} stages)",
                             "\n\n".join(_live_high(high) for high in highs)))
    # the peak stage's census is the answer table, unless the run's peak fell between stages
    others = [c for c in components.censuses
              if c.moment != "at the peak stage" or components.unstaged_peak is not None]
    if others and components.peak_stage is not None:
        holder = components.peak_stage
        blocks.append(folded("Census " + " and ".join(c.moment for c in others),
                             "\n\n".join(_component_tables(c, _what_made_the_peak(holder)
                                                            if c.moment == "just before the peak stage" else "")
                                          for c in others)))
    return blocks


def length(interval: Unstaged) -> float:
    """How long an unstaged interval lasted (it is recorded at its end, so it has one)."""
    assert interval.end_s is not None
    return interval.end_s - interval.start_s


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
    image = (f"\n\n![components at each stage end]({_link(plot)})\n\nEach component's bytes at "
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


def unstaged_peak(peak: UnstagedPeak) -> str:
    place = peak.place
    title = f"### What was alive at the run's peak, {_phrase(place.phrase)}"
    interval = place.interval
    if interval is None:
        return f"{title}\n\nThe record has no interval matching the peak's place."
    rss = interval.rss
    lead = (f"The run's peak RSS ({units.size(rss.peak)}) fell in time no stage covers "
            f"({units.seconds(length(interval))}; RSS "
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


def _live_high(high: LiveHigh) -> str:
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


def _at_peak_table(alive: AliveAt) -> str:
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


def _component_tables(census: StageCensus, why: str = "") -> str:
    stage, a, projected = census.stage, census.attribution, census.projected
    title = f"### Components {census.moment}: {md.code(stage.path)}"
    if a is None:
        return f"{title}\n\nThis stage has no census."
    rss = stage.rss
    lead = (f"Census at the end of the stage, a moment after its work (for the algorithm's state "
            f"over the run see *Over the run*; for what made a peak, the live-tensor highs): "
            f"RSS {units.size(a.rss_end)}; the peak inside the stage "
            f"was {units.size(a.rss_peak)} "
            f"({units.signed_size(None if a.rss_peak is None or a.rss_end is None else a.rss_peak - a.rss_end)} "
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


def _link(name: str) -> str:
    """A link to a file by its name's own bytes (a name that is not UTF-8 too)."""
    return quote(name, errors="surrogateescape")
