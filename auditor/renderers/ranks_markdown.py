"""The merged report of a multi-rank run: ranks, the global peak, every rank's stages side by
side, imbalance across ranks, communication buffers. What it says is computed by
auditor.analysis.ranks.merged (`merge_ranks(folder)` -> MergedRanks, this report's model); this
module only formats it."""
from __future__ import annotations

from auditor.analysis.ranks.merged import Launcher, MergedRanks, RankSummary, Spread
from auditor.facts import units
from auditor.renderers import markdown_text as md
from auditor.renderers.markdown import children_held

COMMUNICATION_NOTE = (
    "Counted, alive at a stage's live-tensor peak among the rows that peak keeps (its 25 largest "
    "groups), each storage once: the buffers a library allocates for its collectives, named by the "
    "library call that made them (DDP's gradient buckets; FSDP2's all-gather buffers, one flat "
    "buffer per layer group holding its gathered parameters, and reduce-scatter buffers, its "
    "unsharded gradients in one flat buffer; DTensor's redistributions; functional collectives), "
    "and the storages a c10d operator creates itself that no such call names (collective outputs). "
    "Not counted here: FSDP2's unsharded parameters and its reduce-scatter output, which becomes the "
    "sharded gradients (weights and gradients), in-place collectives (`dist.all_reduce(t)` creates no "
    "storage), buffers the program allocates for a collective (its own tensors, named by the line "
    "that allocated them), and the backend's own memory (gloo's on CPU, NCCL's on GPU), which is no "
    "tensor: only RSS shows it.")
PARTIAL_NOTE = (
    "*(rank N partial)*: rank N was killed before it finished, so its figure there is what it "
    "reached before it stopped, a lower bound: the max/min and spread over the ranks are not final.")


def render(merged: MergedRanks) -> str:
    parts = [_title(merged), _summary(merged), _ranks(merged), _side_by_side(merged),
             _imbalance(merged), _communication(merged)]
    return "\n\n".join(part for part in parts if part) + "\n"


def _title(merged: MergedRanks) -> str:
    count = len(merged.ranks)
    lines = [f"# Multi-rank memory report: {md.text(merged.name)} ({count} rank{'s' * (count != 1)})"]
    if merged.command:
        lines.append(f"\nRank 0's command: {md.code(merged.command)}")
    if merged.launcher:
        lines.append("\n" + _launcher(merged.launcher))
    if merged.unfinished:
        lines.append(f"\n**Unfinished: rank {_list(merged.unfinished)}** (killed, still going, or its log could not be "
                     "written): rendered from its event log; stages never finished are marked open.")
    if merged.missing_ranks:
        lines.append(f"\n**No record from rank {_list(merged.missing_ranks)}** of world size "
                     f"{_list(merged.world_size)}.")
    for rank, why in merged.unreadable.items():
        lines.append(f"\n**No readable record from rank {rank}**: {why}. The other ranks are merged "
                     "without it.")
    return "\n".join(lines)


def _launcher(launcher: Launcher) -> str:
    state = "" if launcher.finished else " (it did not finish: figures so far)"
    return (f"Spawned by the script's own process with torch.multiprocessing (start method "
            f"{md.text(launcher.start_method or 'unknown')}), audited apart{state}: peak RSS "
            f"{units.size(launcher.rss_peak)}, {units.size(launcher.rss_at_start)} at start; not "
            f"counted in the ranks' figures. Its own report: "
            f"{md.code('auditor report ' + launcher.record)}.")


def _summary(merged: MergedRanks) -> str:
    lines = ["## Summary", ""]
    peak, live = merged.peak, merged.live_peak
    if peak:
        where = peak.place or (f"in stage {md.code(peak.stage)}" if peak.stage else "outside every stage")
        lines.append(f"- Global peak RSS: **{units.size(peak.bytes)} on rank {peak.rank}**, {where}.")
    if live:
        where = live.place or (f"in stage {md.code(live.stage)}" if live.stage else "outside every stage")
        lines.append(f"- Highest live tensors: {units.size(live.bytes)} on rank {live.rank}, {where}.")
    for imbalance, what in ((merged.imbalance.rss, "peak RSS"), (merged.imbalance.live, "peak live tensors")):
        if imbalance and imbalance.ranks > 1:
            which = (f"highest rank {imbalance.max_rank}, lowest rank {imbalance.min_rank}"
                     if imbalance.spread else "the same on every rank")
            if imbalance.partial:
                one = len(imbalance.partial) == 1
                which += (f"; rank {_list(imbalance.partial)} unfinished: "
                          f"{'its figure is' if one else 'their figures are'} partial, "
                          f"{'a lower bound' if one else 'lower bounds'}")
            lines.append(f"- Imbalance of {what} across ranks: max/min {_ratio(imbalance)}, spread "
                         f"{units.size(imbalance.spread)} ({which}).")
    return "\n".join(lines)


def _ranks(merged: MergedRanks) -> str:
    headers = ["rank", "host", "local rank", "world size", "status", "peak RSS", "in stage",
               "peak live tensors", "in stage", "RSS at start", "time"]
    rows = [[str(r.rank), md.text(r.host or "-"), _value(r.local_rank), _value(r.world_size),
             r.status + (f" (open: {md.code(', '.join(r.open_stages))})" if r.open_stages else ""),
             units.size(r.rss_peak), _rss_place(r), units.size(r.live_peak), _live_place(r),
             units.size(r.rss_at_start), units.seconds(r.duration_s)]
            for r in merged.ranks]
    sources, backends = merged.identity_sources, merged.backends
    note = (f"\n\nRank, world size and local rank read from {' and '.join(sources)} "
            "(auditor.capture.ranks says when each is read)" if sources else "")
    note += (f"; process group backend {', '.join(backends)}." if backends else "." if note else "")
    errors = "\n".join(f"- Rank {r.rank} {r.status}: {md.text(r.error)}" for r in merged.ranks if r.error)
    children = "\n".join(f"- Rank {r.rank}'s child processes held memory outside its figures (not audited): "
                         f"{children_held(r.children)}." for r in merged.ranks if r.children is not None)
    errors = "\n".join(part for part in (errors, children) if part)
    return ("## Ranks\n\n" + md.table(headers, rows, right=(0, 2, 3, 5, 7, 9, 10)) + note
            + (f"\n\n{errors}" if errors else ""))


def _rss_place(rank: RankSummary) -> str:
    """Where the rank's RSS peak was, as the summary and the rank's own report place it."""
    if rank.rss_peak_in_stage:
        return md.code(rank.rss_peak_in_stage)
    return rank.rss_peak_place if rank.rss_peak is not None else "-"


def _live_place(rank: RankSummary) -> str:
    if rank.live_peak_stage:
        return md.code(rank.live_peak_stage)
    return rank.live_peak_place or "-"


def _side_by_side(merged: MergedRanks) -> str:
    if not merged.stages:
        return ("## Stages side by side\n\nNo rank's record has stages: each rank's peaks above are "
                "its whole run's. Name the program's callables to stage them (`auditor run --stage "
                "module:function`).")
    ranks = [r.rank for r in merged.ranks]
    headers = ["stage"] + [f"rank {n} {what}" for n in ranks for what in ("RSS peak", "live peak")]
    rows = []
    for row in merged.stages:
        cells = [md.code(row.path)]
        for n in ranks:
            reading = row.ranks.get(n)
            if reading is None:
                cells += ["(not run)", "-"]
                continue
            mark = " (open)" if reading.status == "open" else " (failed)" if reading.status == "failed" else ""
            cells += [_top(units.size(reading.rss_peak), row.rss, n) + mark,
                      _top(units.size(reading.live_peak), row.live, n)]
        rows.append(cells)
    return ("## Stages side by side\n\nEach stage's peak on each rank (RSS: the process's "
            "high-water mark while the stage ran; live: tensor storage bytes). **Bold**: the "
            "rank highest in that stage.\n\n"
            + md.table(headers, rows, right=range(1, len(headers))))


def _imbalance(merged: MergedRanks) -> str:
    headers = ["stage", "RSS max/min", "RSS spread", "highest", "live max/min", "live spread", "highest"]
    rows = [[md.code(row.path), *_spread_cells(row.rss), *_spread_cells(row.live)] for row in merged.stages]
    rows.append(["**the run**", *_spread_cells(merged.imbalance.rss), *_spread_cells(merged.imbalance.live)])
    spreads = [merged.imbalance.rss, merged.imbalance.live] + [s for row in merged.stages for s in (row.rss, row.live)]
    partial = any(s is not None and s.ranks > 1 and s.partial for s in spreads)
    return ("## Imbalance across ranks\n\nPer stage, over the ranks that ran it: the highest "
            "peak over the lowest, and their difference.\n\n"
            + md.table(headers, rows, right=(1, 2, 4, 5)) + (f"\n\n{PARTIAL_NOTE}" if partial else ""))


def _communication(merged: MergedRanks) -> str:
    comm = merged.communication
    if not comm.metered:
        return ("## Communication buffers\n\nNot measured: the live-tensor meter was off "
                "(`--live-tensors`). " + COMMUNICATION_NOTE)
    if not merged.stages:
        body = ("The run has no stages: the buffers are counted at stages' live-tensor peaks, so none "
                "were counted (the live-tensor meter was on).")
    elif not comm.stages:
        body = "No communication buffer (as counted below) was alive at any stage's live-tensor peak."
    else:  # a stage and kind per row, a rank per column
        ranks = sorted({e.rank for e in comm.stages})
        found = {(e.stage, e.rank, kind): size for e in comm.stages
                 for kind, size in (e.kinds or {"communication buffers": e.bytes}).items()}
        rows = list(dict.fromkeys((stage, kind) for stage, _, kind in found))
        body = ("Bytes alive at each stage's live-tensor peak that a collective created or a library "
                "allocated for its collectives, by what made them:\n\n"
                + md.table(["stage", "buffers", *[f"rank {n}" for n in ranks]],
                           [[md.code(stage), md.text(kind),
                             *[units.size(found.get((stage, n, kind), 0)) for n in ranks]]
                            for stage, kind in rows], right=range(2, len(ranks) + 2)))
    largest = comm.largest_wrapper
    if largest is not None:
        body += ("\n\nThe stages' live-tensor peaks (side by side above) also count the "
                 "`AsyncCollectiveTensor` wrappers "
                 "functional collectives return (their storage has a size but no memory of its own), "
                 f"up to {units.size(largest.bytes)} (stage {md.code(largest.stage)}, rank "
                 f"{largest.rank}); they are left out of this table.")
    return "## Communication buffers\n\n" + body + "\n\n" + COMMUNICATION_NOTE


def _spread_cells(spread: Spread | None) -> list[str]:
    if not spread or spread.ranks < 2:
        return ["-", "-", "-"]
    highest = f"rank {spread.max_rank}" if spread.spread else "equal"
    partial = f" (rank {_list(spread.partial)} partial)" if spread.partial else ""
    return [_ratio(spread), units.size(spread.spread) + partial, highest]


def _ratio(spread: Spread) -> str:
    return "-" if spread.ratio is None else f"{spread.ratio:,.2f}x"


def _top(cell: str, spread: Spread | None, rank: int) -> str:
    highest = spread is not None and spread.ranks > 1 and spread.max_rank == rank and spread.spread > 0
    return f"**{cell}**" if highest else cell


def _value(value: int | None) -> str:
    return "-" if value is None else str(value)


def _list(values: list[int]) -> str:
    return ", ".join(str(v) for v in values)
