"""Markdown of a per-rank projection: each rank's projected peaks at each world size, how many
devices of N GiB it needs, and a held-out check's errors. What it says is computed by
auditor.analysis.ranks.projection (RankProjection, HeldOutRow, HeldOutFindings); this module only
formats it."""
from __future__ import annotations

from auditor.analysis.ranks.projection import (
    RSS_LIMIT,
    HeldOutFindings,
    HeldOutRow,
    ProjectedRank,
    ProjectedWorld,
    RankProjection,
    WorstRank,
)
from auditor.facts.allocator_retention import HEAP_KEEPS_AT_MOST
from auditor.facts.units import size
from auditor.report_models.rank_retention import RankRetention, Repeatability, RetentionSweep

BASIS = ("Basis: *live tensors* are the traced run's (rank r of N on torch's fake process group, "
         "FakeTensorMode at the target's shapes): exact but for the bytes resting on data-dependent "
         "size estimates (column *of which estimated*: boolean indexing at candidates, sized by the "
         "audited real rank's ratios). *RSS* adds what the paired real rank's process held beyond its "
         "live tensors in the same stage (interpreter, libraries, gloo, allocator slack) and the "
         "allocator's retention growth. That holds where glibc's mmap threshold stays fixed while the "
         "ranks run, the audited ones included (`MALLOC_MMAP_THRESHOLD_=131072` in their environment: "
         "freed blocks of 128 KiB and more go back to the system). Under glibc's default the threshold "
         "rises to the largest block freed (at most 32 MiB), the main thread's heap keeps the space "
         "that freed gathered layers and gradients below it leave, and real ranks hold more than the "
         f"retention model gives: up to {HEAP_KEEPS_AT_MOST} times the growth of the heap's high water (the "
         "most bytes of tensors below the threshold alive at once, traced against audited), printed beside "
         f"the figure as *heap may keep*. Where that is more than {RSS_LIMIT:.0%} of the figure (or the records do not "
         "keep it) the figure is a lower estimate, marked so; a model whose largest blocks are above "
         "32 MiB, as a 7B model's are, has them mmapped and given back (reports/rank-projection-cpu.md "
         "measures each case against real gloo ranks, and where the rest goes). A rank marked *as r* was not traced "
         "itself: its shards have the shapes of rank r's, which was (ranks other than 0 with equal "
         "shards run the same program on the same shapes).")


def ranks_table(worlds: list[ProjectedWorld]) -> list[str]:
    lines = ["| ranks | rank | traced | whole run: peak live tensors | in stage | sharded part: peak live "
             "tensors | in stage | of which estimated | + one unit's buffer (upper bound) | sharded part: "
             "projected peak RSS | in stage |", "|---:|---:|---|---:|---|---:|---|---:|---:|---:|---|"]
    for world in worlds:
        measured = world.estimates_measured is not False
        for r in world.ranks:
            whole, part = r.whole, r.sharded
            traced = "itself" if r.traced_as == r.rank else f"as {r.traced_as}"
            lines.append(f"| {world.world_size} | {r.rank} | {traced} | {size(whole.live_tensors)} | "
                         f"`{whole.live_stage}` | {size(part.live_tensors)} | `{part.live_stage}` | "
                         f"{size(part.estimated) if measured else 'not measured'} | "
                         f"{size(part.live_tensors_upper)} | {rss_text(r)} | `{part.rss_stage}` |")
    return lines


def rss_text(rank: ProjectedRank) -> str:
    """The sharded part's projected RSS, with what glibc's heap may keep beyond it."""
    may_add = rank.sharded.rss_may_add
    text = size(rank.sharded.rss)
    if rank.rss_is_lower_estimate:
        return text + (" (lower estimate)" if not may_add else f" (lower estimate: heap may keep {size(may_add)} more)")
    return text + (f" (heap may keep {size(may_add)} more)" if may_add else "")


def devices_table(projection: RankProjection) -> list[str]:
    worlds = projection.worlds
    sizes = ", ".join(str(w.world_size) for w in worlds)
    lines = [f"| device memory | fewest ranks (of {sizes}): worst rank's sharded peak live tensors, upper bound, "
             "fits | that rank's upper bound | traced peak alone | fewest ranks by traced peak alone | "
             "fewest ranks by projected RSS + buffer (a CPU host per rank) |", "|---:|---:|---:|---:|---:|---:|"]
    beyond = f"more than {worlds[-1].world_size}"
    lower = " (by a lower estimate)" if any(r.rss_is_lower_estimate for w in worlds for r in w.ranks) else ""
    for count in projection.devices:
        worst = count.worst
        lines.append(f"| {count.budget_gib:g} GiB | {count.fewest or beyond} | "
                     f"{size(worst.live_tensors_upper) if worst else '-'} | "
                     f"{size(worst.live_tensors) if worst else '-'} | "
                     f"{count.fewest_by_traced or beyond} | {count.fewest_by_rss or beyond}{lower} |")
    return lines


def render(projection: RankProjection, *, small, target, command: list[str] | None = None) -> str:
    """The `auditor project-ranks` report: each rank at each world size, then the device counts;
    `small`, `target`: the GradProbe settings audited and projected to (their architecture and
    overrides name them)."""
    import shlex
    worlds = projection.worlds

    def label(settings) -> str:
        extra = ", ".join(f"{k} {v}" for k, v in settings.overrides.items())
        return f"`{settings.architecture}`" + (f" ({extra})" if extra else "")
    out = [f"# Sharded GradProbe (FSDP2), rank by rank: {label(small)} projected to {label(target)}", ""]
    if command:
        out += ["```", shlex.join(command), "```", ""]
    out += [BASIS, "", "Two peaks per rank: the whole run's, at `build model` or `shard model` (the job builds "
            "the whole model on every rank before FSDP2 copies out its shards), and the sharded part's "
            "(`prune` and its phases), which a device run that builds its model on meta or on the host "
            "has alone; device counts read the sharded part.", "",
            f"## Each rank at {', '.join(str(w.world_size) for w in worlds)} ranks", "",
            *ranks_table(worlds), "", "## How many devices", "",
            "The fewest ranks whose worst rank's sharded part fits each device size. GPU figures are "
            "live tensors: the CUDA context and the caching allocator's slack come on top.", "",
            *devices_table(projection), ""]
    return "\n".join(out)


def validation_findings(found: HeldOutFindings) -> list[str]:
    """What the held-out rows show (auditor.analysis.ranks.projection.held_out_findings), in words."""
    def where(worst: WorstRank) -> str:
        return f"rank {worst.rank} of {worst.world_size}"

    def met(ok: bool) -> str:
        return "met" if ok else "**missed**"

    live, stage, rss = found.live, found.every_stage, found.rss
    (low, high), (least, most) = found.rss_range, found.beyond_live
    outside = [f"rank {r.rank} of {r.world_size}" for r in found.outside_upper]
    if found.outside_may_add is None:
        bound = "- What glibc's heap may keep: not known (the records do not keep the heap's high water)."
    else:
        missed = [f"rank {r.rank} of {r.world_size}" for r in found.outside_may_add]
        bound = (f"- Real peak RSS within the projected + what glibc's heap may keep (+{found.rss_limit:.0%}): "
                 + ("every rank." if not missed else "**not on " + ", ".join(missed) + "**."))
    return ["What the held-out check above found (read off its rows):",
            f"- Peak live tensors: worst {live.error:+.2%} ({where(live)}); every stage: worst {stage.error:+.2%} "
            f"({where(stage)}). Target ±{found.live_limit:.0%}: {met(found.live_met)} "
            f"({met(found.every_stage_met)} on every stage).",
            f"- Real sharded part within the traced upper bound (+ one unit's buffer, +{found.live_limit:.0%}): "
            + ("every rank." if not outside else "not on " + ", ".join(outside) + "."),
            f"- Peak RSS: {low:+.2%} to {high:+.2%} (worst {where(rss)}). Target ±{found.rss_limit:.0%}: "
            f"{met(found.rss_met)}. The real ranks' RSS beyond their live tensors was "
            f"{size(least)} to {size(most)}; the projection adds the audited rank's, stage by "
            "stage, and the allocator's retention growth" + (
                ", with glibc's mmap threshold fixed in every run (audited, traced and real ranks)."
                if found.threshold_fixed else
                " under glibc's default malloc; where the rest goes is measured below (*Where the "
                "missing RSS is*)." + (f" Where glibc's heap may keep more than {found.rss_limit:.0%} of the "
                                       "projected RSS (or the records do not say), RSS is a lower estimate."
                                       if found.rss_lower_estimate else "")),
            bound]


def retention_section(retention: RankRetention) -> list[str]:
    """benchmarks/rank_rss_retention.py's rows: the real rank's RSS beyond live tensors, and glibc's
    account of its malloc arenas, at both sizes, with the default malloc and a fixed threshold."""
    lines = ["| size | malloc | gradient pass at peak | peak RSS | live tensors | RSS beyond them (range over the "
             "runs) | main arena: held / free | other threads' arenas: held / free | mmapped |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in retention.rows:
        low, high = r.beyond_range
        lines.append(f"| {r.size} | {r.malloc} | `{r.stage}` | {size(r.rss)} | {size(r.live)} | "
                     f"{size(r.beyond)} ({size(low)} to {size(high)}) | "
                     f"{size(r.main_held)} / {size(r.main_free)} | "
                     f"{size(r.others_held)} / {size(r.others_free)} | "
                     f"{size(r.mmapped)} |")
    fixed = retention.fixed
    return ["## Where the missing RSS is", "",
            f"Rank 0 of the held-out check's 2-rank run, {retention.runs} runs of each: at the small and "
            "the held-out size, with glibc's default "
            f"malloc and with its mmap threshold fixed (*{fixed}*: MALLOC_MMAP_THRESHOLD_=131072, which also "
            "stops it from following the blocks freed). Arenas are glibc's `malloc_info` after the prune: "
            "the main arena "
            "is the main thread's (the program's tensors and objects), the others are other threads' (gloo's "
            "workers). Each row is the run of median peak RSS.", "", *lines, "",
            f"- From the small to the held-out size, RSS beyond live tensors grew by "
            f"{size(retention.growth_default)} with the default malloc and by "
            f"{size(retention.growth_fixed)} with the threshold fixed.",
            *_repeatability(retention.repeatability),
            f"- The main arena held {size(retention.main_free['held-out'])} free at the held-out size "
            f"({size(retention.main_free['small'])} at the small one); the other threads' arenas, gloo's included, "
            f"held {size(retention.others_held['held-out'])} in all ({size(retention.others_held['small'])}).",
            "- So the gap is the main thread's heap: once the threshold has risen to the size of the blocks "
            "freed, gathered layers and gradients come from the heap, and the space they leave is kept. The "
            "projection's retention growth (auditor.facts.allocator_retention: 1.5 x threads x the threshold's rise, "
            "measured on single-process runs) is far below what this sharded program keeps; it is not refitted "
            "to these runs, which are the held-out check. What the heap may keep beyond it is bounded instead by "
            "how much the heap served (*heap may keep*, from the sweep below). With the threshold fixed in every "
            "rank there is little to model, and the projection holds (the held-out check with the threshold "
            "fixed, above, where the report has one).", "",
            f"`{retention.command}`"]


def _repeatability(r: Repeatability) -> list[str]:
    """How far the same rank's RSS spread over repeated runs, with each malloc, against the RSS target."""
    verdict = (f" Under glibc's default the same run varies by more than the {RSS_LIMIT:.0%} the projection is "
               "held to; with the threshold fixed it does not." if r.beyond_target else "")
    return [f"- The same rank run {r.runs} times at the held-out size: its RSS beyond live tensors spread "
            f"over {size(r.default_spread)} with the default malloc ({r.default_share:.1%} of its peak RSS) and over "
            f"{size(r.fixed_spread)} with the threshold fixed ({r.fixed_share:.1%}).{verdict}"]


def sweep_section(sweep: RetentionSweep) -> list[str]:
    """benchmarks/rank_rss_retention.py --sweep's rows, of one or more runs of it: rank 0's RSS
    beyond live tensors after sharding and at the prune's peak, size by size, with each malloc."""
    lines = ["| run | hidden | ranks | malloc | mmap threshold after the prune | prune: peak live tensors | peak RSS | "
             "RSS beyond live tensors: after sharding | at the prune's peak | the prune added | "
             "added / live tensors | heap high water | added beyond the fixed run / heap high water |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sweep.rows:
        water = r.heap_high_water
        lines.append(f"| {r.run} | {r.hidden} | {r.ranks} | {r.malloc} | {size(r.threshold)} | "
                     f"{size(r.live)} | "
                     f"{size(r.rss)} | {size(r.beyond_after_sharding)} | {size(r.beyond)} | {size(r.added)} | "
                     f"{r.added_share:.2f} | {size(water) if water is not None else 'not kept'} | "
                     f"{'-' if r.kept is None else f'{r.kept:.2f}'} |")
    said = [f"- {a.malloc}: the prune added {size(a.least)} to {size(a.most)} "
            f"beyond its live tensors, {a.least_share:.2f} to {a.most_share:.2f} times them."
            for a in sweep.added]
    if sweep.kept is not None:
        least, most_kept = sweep.kept
        said.append(f"- The default malloc kept {least:.2f} to {most_kept:.2f} times its heap high water more "
                    "than the same run with the threshold fixed (its high water: the most bytes of tensors below "
                    "the threshold alive at once, from the live-tensor meter). The projection takes "
                    f"{HEAP_KEEPS_AT_MOST} times the high water's growth as what glibc's heap may keep beyond it"
                    + ("" if most_kept <= HEAP_KEEPS_AT_MOST else
                       f" (**below the {most_kept:.2f} measured here**)") + ".")
    most = sweep.most_below_largest
    if most is not None:
        said.append(f"- With the default malloc the prune added most at hidden {most.hidden} on {most.ranks} "
                    f"ranks in run {most.run} (threshold {size(most.threshold)}; "
                    f"the sweep's largest size is hidden {sweep.largest}), "
                    "so what is added follows how glibc's threshold meets the program's block sizes, not the size "
                    "alone.")
    commands = sweep.commands
    each = "once" if len(commands) == 1 else f"in {len(commands)} runs of the sweep, once in each"
    return ["### RSS beyond live tensors, size by size", "",
            "Rank 0 of a real run at five sizes from the small (hidden 128) to the held-out one (hidden 512), "
            f"{each}: its RSS beyond live tensors when `shard model` ended and at the prune's peak. What the "
            "prune adds beyond its tensors is what a projection has to carry from the audited size to the "
            "target.", "", *lines, "", *said, "",
            *([f"`{commands[0]}`"] if len(commands) == 1 else
              [f"- run {n}: `{command}`" for n, command in enumerate(commands, 1)])]


def validation_table(rows: list[HeldOutRow]) -> list[str]:
    lines = ["| ranks | rank | real peak live tensors | projected (traced) | error | every stage (worst) | "
             "sharded part: error | real within the upper bound | real peak RSS | projected | error | "
             "heap may keep |", "|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---:|"]
    for row in rows:
        e = row.errors
        lines.append(f"| {row.world_size} | {row.rank} | {size(e.real.live_tensors)} | "
                     f"{size(row.projected_live)} | {e.live_tensors:+.2%} | {e.every_stage:+.2%} "
                     f"(`{e.every_stage_worst}`) | {e.sharded_live_tensors:+.2%} | "
                     f"{'yes' if e.within_upper else '**no**'} | {size(e.real.rss)} | "
                     f"{size(row.projected_rss)} | {e.rss:+.2%} | "
                     f"{'not known' if row.rss_may_add is None else size(row.rss_may_add)} |")
    return lines
