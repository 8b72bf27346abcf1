"""Per-rank projection of a sharded run at target world sizes, and how many devices it needs.

    worlds = project_ranks(real_ranks, {2: traced_2, 4: traced_4})   # records by rank
    fewest_devices(worlds, 80 * GiB)          # the smallest world size whose worst rank fits
    projection = rank_projection(worlds, [24, 40, 80])   # the report: worlds and device counts
    held_out_findings([held_out_row(2, rank, real_record), ...])   # a held-out check, read off

Each is a typed model (ProjectedWorld, RankProjection, RankErrors, HeldOutFindings...) that
auditor.renderers.rank_projection_markdown only formats; `to_json`/`from_json` keep the JSON
the jobs write (projection-*.json, validation.json, rank-projection.json) as it was.

Each traced rank (auditor.jobs.rank_projection: rank r of N on torch's fake process group, on the
target's fake tensors) is projected as a single traced run is (auditor.analysis.projection.traced):
its live tensors are the traced run's, exact but for the bytes that rest on data-dependent size
estimates (`estimated`); its RSS adds what the paired real rank's process held beyond its live
tensors (interpreter, libraries, gloo, allocator slack) stage by stage, plus the allocator's
retention growth. The paired real rank is the same rank where the audited run had it, else its
highest rank other than 0 (rank 0 may do more; the others run one program on their own rows).
That RSS holds where glibc's mmap threshold stays fixed while the ranks run (the paired record's
malloc settings say so: `threshold_fixed`). Under glibc's default the main thread's heap keeps
the space of freed gathered layers and gradients, more than the retention model gives; how much
more is bounded by how much the heap served (`rss_may_add`: auditor.facts.allocator_retention's
heap_may_keep, from the traced and the audited rank's heap high water). Where that bound is
more than RSS_LIMIT of the figure, or the records do not say, projected RSS is a lower estimate
(reports/rank-projection-cpu.md measures both regimes, and a size whose largest blocks are
mmapped, as a 7B model's are).

Two peaks per rank: the whole program's, and the sharded part's (the prune, after FSDP2 sharded
the model): the audited program builds the whole model on every rank and holds it while
`fully_shard` copies out its shards, which a device run avoids by building it elsewhere (meta or
the host); the device count is read from the sharded part.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from auditor.facts import allocator_retention
from auditor.facts.units import GiB
from auditor.record.derived import DataDependent, ProjectedStage
from auditor.record.schema import RunRecord, Stage

SHARDED_FROM = ("prune",)  # the stages (and their children) once the model is sharded
RSS_LIMIT = 0.05  # the RSS target of single-process traced projection: what "holds" means here
LIVE_LIMIT = 0.02  # its live-tensor target; an upper bound holds to it too (a real rank's few
                   # bytes of small tensors beside the unit's buffer: 148 bytes over it in one run)


# -- the model -----------------------------------------------------------------------------

@dataclass
class RankPeak:
    """A rank's traced peaks over some stages, and their upper bounds with one more FSDP unit's
    flat buffer held (what a real gloo rank was seen to hold beyond the traced run at a peak)."""
    live_tensors: int
    live_stage: str
    estimated: int             # of live_tensors, the bytes resting on data-dependent size estimates
    live_tensors_upper: int
    rss: int
    rss_stage: str
    rss_upper: int
    # what glibc's default heap may keep beyond `rss` (0 with the threshold fixed; None: the
    # records do not say)
    rss_may_add: int | None = None


@dataclass
class ProjectedRank:
    rank: int
    traced_as: int             # the rank traced for it (one of its shard class)
    paired_real_rank: int      # the audited rank whose RSS beyond live tensors it adds
    retained_buffer: int       # the largest FSDP unit's flat buffer
    whole: RankPeak            # the whole program, the model built whole included
    sharded: RankPeak          # the sharded part (SHARDED_FROM): what the device count reads
    # traced_projection's per-stage rows; None when read from JSON (they stay in the traced records)
    stages: list[ProjectedStage] | None
    data_dependent: DataDependent  # traced_projection.data_dependent's sites
    # whether glibc's mmap threshold was fixed while the paired rank ran (its record's malloc
    # settings): projected RSS holds then; under the dynamic default it is a lower estimate.
    # None: the record does not say (kept since), so it is not known to hold.
    threshold_fixed: bool | None = None

    @property
    def rss_is_lower_estimate(self) -> bool:
        """Whether real RSS may be above the sharded part's projected RSS by more than RSS_LIMIT."""
        return lower_estimate(self.threshold_fixed, self.sharded.rss, self.sharded.rss_may_add)

    @classmethod
    def from_json(cls, data: dict) -> ProjectedRank:
        return cls(**{**data, "whole": RankPeak(**data["whole"]), "sharded": RankPeak(**data["sharded"]),
                      "stages": None})


@dataclass
class ProjectedWorld:
    world_size: int
    ranks: list[ProjectedRank]
    worst: ProjectedRank       # the highest sharded upper bound
    # whether the estimated bytes were measured at this size (a second trace); None: not said, measured
    estimates_measured: bool | None = None

    def to_json(self) -> dict:
        """As the jobs write it: the peaks, without the per-stage rows."""
        data = asdict(self)
        for rank in (*data["ranks"], data["worst"]):
            del rank["stages"]
        if self.estimates_measured is None:
            del data["estimates_measured"]
        return data

    @classmethod
    def from_json(cls, data: dict) -> ProjectedWorld:
        return cls(data["world_size"], [ProjectedRank.from_json(r) for r in data["ranks"]],
                   ProjectedRank.from_json(data["worst"]), data.get("estimates_measured"))


@dataclass
class DeviceCount:
    """How many ranks a device size needs: the fewest projected world sizes whose worst rank's
    sharded part fits it, by three figures (None: none of the projected sizes fits)."""
    budget_gib: float
    fewest: int | None         # by the live tensors' upper bound (the answer)
    worst: RankPeak | None     # that world size's worst rank's sharded part
    fewest_by_traced: int | None  # by the traced live-tensor peak alone
    fewest_by_rss: int | None  # by projected RSS + one unit's buffer (a CPU host per rank)


@dataclass
class RankProjection:
    """The per-rank projection report: each rank at each world size, then the device counts."""
    worlds: list[ProjectedWorld]   # by world size, ascending
    devices: list[DeviceCount]     # one per device size asked


@dataclass
class RealPeaks:
    live_tensors: int
    rss: int


@dataclass
class RankErrors:
    """A projected rank against the real run of that rank: signed errors, (projected - real) / real."""
    live_tensors: float
    sharded_live_tensors: float
    every_stage: float         # the largest in size over the stages both have
    every_stage_worst: str | None  # its stage
    within_upper: bool         # the real peaks (whole and sharded) within the upper bounds (+LIVE_LIMIT)
    rss: float
    sharded_rss: float
    real: RealPeaks

    @classmethod
    def from_json(cls, data: dict) -> RankErrors:
        return cls(**{**data, "real": RealPeaks(**data["real"])})


@dataclass
class HeldOutRow:
    """A row of the held-out check: a projected rank beside the real run of the same rank."""
    world_size: int
    rank: int
    errors: RankErrors
    projected_live: int        # the whole run's traced peak live tensors
    projected_rss: int         # its projected peak RSS
    threshold_fixed: bool | None = None  # ProjectedRank's: glibc's mmap threshold fixed while the ranks ran
    rss_may_add: int | None = None  # what glibc's heap may keep beyond projected_rss (RankPeak's)

    @property
    def rss_is_lower_estimate(self) -> bool:
        return lower_estimate(self.threshold_fixed, self.projected_rss, self.rss_may_add)

    @classmethod
    def from_json(cls, data: dict) -> HeldOutRow:
        return cls(**{**data, "errors": RankErrors.from_json(data["errors"])})


@dataclass
class WorstRank:
    error: float
    rank: int
    world_size: int


@dataclass
class HeldOutFindings:
    """What a held-out check's rows show: the worst rank on each figure, against the targets."""
    live_limit: float
    rss_limit: float
    live: WorstRank            # peak live tensors over the run
    every_stage: WorstRank
    rss: WorstRank
    rss_range: tuple[float, float]     # the RSS errors, lowest and highest
    beyond_live: tuple[int, int]       # the real ranks' RSS beyond their live tensors, least and most
    outside_upper: list[HeldOutRow]    # rows whose real peaks exceed the upper bounds
    # rows whose real RSS is above projected RSS + rss_may_add by more than rss_limit; None: some
    # row's rss_may_add is not known
    outside_may_add: list[HeldOutRow] | None
    live_met: bool
    every_stage_met: bool
    rss_met: bool
    threshold_fixed: bool      # glibc's mmap threshold fixed in every run compared
    rss_lower_estimate: bool   # some row's projected RSS is one (HeldOutRow.rss_is_lower_estimate)


# -- building it ---------------------------------------------------------------------------

def paired_rank(rank: int, real: dict[int, RunRecord]) -> int:
    if rank in real:
        return rank
    others = [r for r in real if r != 0]
    return max(others) if others else 0


def project_ranks(real: dict[int, RunRecord], traced: dict[int, dict[int, RunRecord]]) -> list[ProjectedWorld]:
    """One entry per world size (ascending): each rank's projection and the worst rank's."""
    worlds = []
    for world_size in sorted(traced):
        ranks = [project_rank(rank, record, real) for rank, record in sorted(traced[world_size].items())]
        worlds.append(ProjectedWorld(world_size, ranks, max(ranks, key=lambda r: r.sharded.live_tensors_upper)))
    return worlds


def project_rank(rank: int, traced_record: RunRecord, real: dict[int, RunRecord]) -> ProjectedRank:
    from auditor.analysis.projection.traced import project_traced
    paired = paired_rank(rank, real)
    projection = project_traced(real[paired], traced_record)
    stages = projection["stages"]
    fixed = threshold_fixed(real[paired])
    for row in stages:
        row["rss_may_add"] = 0 if fixed else _heap_may_keep(real[paired], traced_record, row["path"])
    sharded = [s for s in stages if s["path"].split("/")[0] in SHARDED_FROM]
    retained = max((traced_record.annotations.get("gather_buffers") or {}).values(), default=0)
    return ProjectedRank(rank=rank, traced_as=traced_record.annotations.get("traced_as", rank),
                         paired_real_rank=paired, retained_buffer=retained, whole=_peak(stages, retained),
                         sharded=_peak(sharded, retained), stages=stages,
                         data_dependent=projection["data_dependent"], threshold_fixed=fixed)


def lower_estimate(fixed: bool | None, rss: int, may_add: int | None) -> bool:
    """Whether a projected RSS is a lower estimate: glibc's threshold was not fixed and its heap
    may keep more than RSS_LIMIT of it beyond it (or the records do not say how much)."""
    return not fixed and (may_add is None or may_add > RSS_LIMIT * rss)


def threshold_fixed(record: RunRecord) -> bool | None:
    """Whether glibc's mmap threshold stayed fixed in the run of `record` (None: not recorded)."""
    malloc = record.environment.malloc
    return None if malloc is None else allocator_retention.threshold_fixed(malloc)


def _heap_may_keep(audited: RunRecord, traced: RunRecord, path: str) -> int | None:
    """allocator_retention.heap_may_keep from the audited rank's heap high water to the traced
    rank's, when `path` ended; None where a record does not keep it."""
    target, start = _heap_high_water(traced, path), _heap_high_water(audited, path)
    return None if target is None or start is None else allocator_retention.heap_may_keep(start, target)


def _heap_high_water(record: RunRecord, path: str) -> int | None:
    """The heap high water when `path` first ended; for a stage the record does not have (a
    later call of a loop), the run's (it only grows)."""
    for stage in record.stages:
        if stage.path == path and stage.status != "open" and stage.live_tensors is not None:
            return stage.live_tensors.heap_high_water
    return max((s.live_tensors.heap_high_water for s in record.stages
                if s.live_tensors is not None and s.live_tensors.heap_high_water is not None), default=None)


def _peak(stages: list[ProjectedStage], retained: int) -> RankPeak:
    live = max(stages, key=lambda s: s["tensor_peak"])
    rss = max(stages, key=lambda s: s["rss_peak"])
    return RankPeak(live_tensors=live["tensor_peak"], live_stage=live["path"], estimated=live["estimated"],
                    live_tensors_upper=live["tensor_peak"] + retained,
                    rss=rss["rss_peak"], rss_stage=rss["path"], rss_upper=rss["rss_peak"] + retained,
                    rss_may_add=rss.get("rss_may_add"))


def fewest_devices(worlds: list[ProjectedWorld], budget: int, figure: str = "live_tensors_upper") -> int | None:
    """The smallest projected world size whose worst rank's sharded peak (`figure`: live_tensors,
    rss or their `_upper` bounds) fits `budget` bytes; None when none of them does."""
    for world in worlds:
        if max(getattr(r.sharded, figure) for r in world.ranks) <= budget:
            return world.world_size
    return None


def devices(worlds: list[ProjectedWorld], budgets_gib: list[float]) -> list[DeviceCount]:
    """The fewest ranks for each device size (GiB)."""
    counts = []
    for gib in budgets_gib:
        budget = round(gib * GiB)
        chosen = fewest_devices(worlds, budget)
        worst = next((w.worst.sharded for w in worlds if w.world_size == chosen), None)
        counts.append(DeviceCount(gib, chosen, worst, fewest_devices(worlds, budget, "live_tensors"),
                                  fewest_devices(worlds, budget, "rss_upper")))
    return counts


def rank_projection(worlds: list[ProjectedWorld], budgets_gib: list[float]) -> RankProjection:
    return RankProjection(worlds, devices(worlds, budgets_gib))


def compare_rank(projected: ProjectedRank, real_record: RunRecord) -> RankErrors:
    """A projected rank against the real run of the same rank at the target (held-out check):
    peak live tensors over the run and every stage's, peak RSS, as signed errors."""
    assert projected.stages is not None, "a projection made here, not read from JSON"
    real_stages: dict[str, Stage] = {}
    for s in real_record.stages:
        if s.status != "open":
            real_stages.setdefault(s.path, s)
    seen: set[str] = set()
    worst: tuple[float, str | None] = (0.0, None)
    for row in projected.stages:
        real = real_stages.get(row["path"])
        real_peak = _live_peak(real) if real is not None else None
        if row["path"] in seen or not real_peak:
            continue
        seen.add(row["path"])
        error = _error(row["tensor_peak"], real_peak)
        if abs(error) > abs(worst[0]):
            worst = (error, row["path"])
    real_live = max(_live_peak(s) or 0 for s in real_stages.values())
    real_rss = max(_rss_peak(s) for s in real_stages.values())
    whole, sharded = projected.whole, projected.sharded
    return RankErrors(
        live_tensors=_error(whole.live_tensors, real_live),
        sharded_live_tensors=_error(sharded.live_tensors, _real_sharded(real_stages, "live")),
        every_stage=worst[0], every_stage_worst=worst[1],
        within_upper=real_live <= whole.live_tensors_upper * (1 + LIVE_LIMIT)
        and _real_sharded(real_stages, "live") <= sharded.live_tensors_upper * (1 + LIVE_LIMIT),
        rss=_error(max(whole.rss, sharded.rss), real_rss),
        sharded_rss=_error(sharded.rss, _real_sharded(real_stages, "rss")),
        real=RealPeaks(real_live, real_rss))


def held_out_row(world_size: int, projected: ProjectedRank, real_record: RunRecord) -> HeldOutRow:
    peak = max(projected.whole, projected.sharded, key=lambda p: p.rss)
    return HeldOutRow(world_size, projected.rank, compare_rank(projected, real_record),
                      projected.whole.live_tensors, peak.rss,
                      projected.threshold_fixed and threshold_fixed(real_record), peak.rss_may_add)


def held_out_findings(rows: list[HeldOutRow], live_limit: float = LIVE_LIMIT,
                      rss_limit: float = RSS_LIMIT) -> HeldOutFindings:
    """What the held-out rows show, read off them: the worst rank on each figure, against the
    single-process traced targets (`live_limit`, `rss_limit`: the largest error in size that meets them)."""
    def worst(figure: str) -> WorstRank:
        row = max(rows, key=lambda r: abs(getattr(r.errors, figure)))
        return WorstRank(getattr(row.errors, figure), row.rank, row.world_size)

    live, stage, rss = worst("live_tensors"), worst("every_stage"), worst("rss")
    beyond = [r.errors.real.rss - r.errors.real.live_tensors for r in rows]
    known = all(r.rss_may_add is not None for r in rows)
    outside = [r for r in rows if r.errors.real.rss > (r.projected_rss + (r.rss_may_add or 0)) * (1 + rss_limit)]
    return HeldOutFindings(
        live_limit=live_limit, rss_limit=rss_limit, live=live, every_stage=stage, rss=rss,
        rss_range=(min(r.errors.rss for r in rows), max(r.errors.rss for r in rows)),
        beyond_live=(min(beyond), max(beyond)), outside_upper=[r for r in rows if not r.errors.within_upper],
        outside_may_add=outside if known else None,
        live_met=abs(live.error) <= live_limit, every_stage_met=abs(stage.error) <= live_limit,
        rss_met=abs(rss.error) <= rss_limit, threshold_fixed=all(r.threshold_fixed for r in rows),
        rss_lower_estimate=any(r.rss_is_lower_estimate for r in rows))


def _real_sharded(stages: dict[str, Stage], figure: str) -> int:
    chosen = [s for path, s in stages.items() if path.split("/")[0] in SHARDED_FROM]
    if figure == "rss":
        return max(_rss_peak(s) for s in chosen)
    return max(_live_peak(s) or 0 for s in chosen)


def _live_peak(stage: Stage) -> int | None:
    return stage.live_tensors.peak if stage.live_tensors else None


def _rss_peak(stage: Stage) -> int:
    assert stage.rss.peak is not None, "a finished stage's RSS peak"
    return stage.rss.peak


def _error(projected: int, real: int) -> float:
    return (projected - real) / real if real else 0.0
