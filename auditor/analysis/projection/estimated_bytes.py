"""How much of a traced run's figures rests on estimated data-dependent sizes.

A size estimated in a traced run (auditor.capture.tracing.data_dependent) reaches memory by many roads: the
selection's own output, what is computed from it, and, most often, what the program allocates
with a count it read back (`torch.empty(int(mask.sum()))`), which no tensor links to the
estimate. So the part of each figure that rests on estimates is measured, not traced: the
same traced run is made again with every data-dependent size empty (`estimate_sizes=False`),
and the difference is the estimated part: per census component at each stage's end, and in
what was alive at each stage's live-tensor peak (`at_peak`, grouped by owner: each owner's bytes
beyond its bytes at the lower-bound run's peak of the same stage). The two peaks can fall at
different moments, so the rise of the peak itself (`peak_rise`) is kept apart: it is smaller
when the lower bound peaks elsewhere, on a transient the estimates do not touch.

    traced.annotations["estimated_bytes"] = estimated_bytes(traced, lower_bound)
"""
from __future__ import annotations

from auditor.analysis.projection.scaled import stage_keys
from auditor.record.derived import DataDependentSite, Projection
from auditor.record.schema import RunRecord, Stage

ByKey = dict[tuple[str, int], Stage]  # stage_keys


def estimated_bytes(traced: RunRecord, lower: RunRecord) -> dict:
    """{"stages": [{path, live_tensors, components: {name: bytes}}], "sites": [...]} for the
    stages of `traced` that `lower` (its lower-bound twin) also has, in `traced`'s order."""
    below, keyed = stage_keys(lower), stage_keys(traced)
    stages = []
    for key, stage in keyed.items():
        twin = below.get(key)
        if twin is None:
            continue
        held, held_twin = _holder(key, keyed, below)
        low_components = twin.components or {}
        components = {name: item.bytes - (low_components[name].bytes if name in low_components else 0)
                      for name, item in (stage.components or {}).items()}
        stages.append({"path": stage.path,
                       "live_tensors": min(_at_peak_rise(held, held_twin), _peak(stage)),
                       "peak_rise": max(_peak(stage) - _peak(twin), 0),
                       "components": {name: b for name, b in components.items() if b > 0}})
    return {"stages": stages, "sites": sites(traced),
            "method": "traced run less the same run with every data-dependent size empty"}


def sites(traced: RunRecord) -> list[DataDependentSite]:
    """The traced run's data-dependent sites (ratio, source: observed / declared / unknown)."""
    return list((traced.annotations.get("traced") or {}).get("estimated_sizes") or [])


def has_estimates(traced: RunRecord) -> bool:
    """Whether any data-dependent size in the traced run was sized by an estimate."""
    return any(s.get("source") != "unknown" and s.get("output_numel") for s in sites(traced))


def _holder(key: tuple[str, int], keyed: ByKey, below: ByKey) -> tuple[Stage, Stage]:
    """The innermost stage inside `key`'s that holds its live-tensor peak (the same moment), and
    its lower-bound twin: a parent's peak compared at its own level would set one moment's
    temporaries against another's."""
    path, peak = key[0], _peak(keyed[key])
    inner = [k for k, s in keyed.items() if k[0].startswith(path + "/") and _peak(s) == peak and k in below]
    chosen = max(inner, key=lambda k: k[0].count("/"), default=key)
    return keyed[chosen], below[chosen]


def _at_peak_rise(stage: Stage, twin: Stage) -> int:
    """Bytes alive at `stage`'s live-tensor peak beyond what the same owners held at `twin`'s."""
    mine, theirs = _by_owner(stage), _by_owner(twin)
    return sum(max(b - theirs.get(owner, 0), 0) for owner, b in mine.items())


def _by_owner(stage: Stage) -> dict[tuple[str | None, str], int]:
    at_peak = stage.live_tensors.at_peak if stage.live_tensors else None
    owners: dict[tuple[str | None, str], int] = {}
    for row in at_peak.rows if at_peak is not None else []:
        key = (row.owner, row.category)
        owners[key] = owners.get(key, 0) + row.bytes
    return owners


def _peak(stage: Stage) -> int:
    return (stage.live_tensors.peak if stage.live_tensors else None) or 0


def estimate_note(projection: Projection) -> str | None:
    """What a traced projection's peak rests on, in words: "of the peak's live tensors, 8.1 GiB
    rest on data-dependent sizes estimated from observed ratios at 3 sites; unknown (sized
    empty) at 1: `a.py:3 f` (aten::nonzero)". None for a projection without such sites."""
    from auditor.facts.units import size
    found = (projection.get("data_dependent") or {}).get("sites") or []
    if not found:
        return None
    used = [s for s in found if s.get("source") in ("observed", "declared") and s.get("output_numel")]
    unknown = [s for s in found if s.get("source") == "unknown"]
    parts = []
    if used:
        sources = " and ".join(f"{kind} ratios at {n} site{'s' if n > 1 else ''}" for kind, n in
                               (("observed", sum(s["source"] == "observed" for s in used)),
                                ("declared", sum(s["source"] == "declared" for s in used))) if n)
        estimated = (projection.get("peak") or {}).get("estimated")
        amount = size(estimated) if estimated is not None else "an unmeasured part"
        parts.append(f"of the peak's live tensors, {amount} rest on data-dependent sizes "
                     f"estimated from {sources}")
        replayed = sum(s.get("replayed_calls") or 0 for s in used)
        if replayed:
            parts.append(f"{replayed:,} of their {sum(s['calls'] for s in used):,} calls sized as the "
                         "real run's calls at the same relative position, each path's ratio kept "
                         "(auditor.capture.tracing.size_profiles)")
    conflicts = sum(s.get("conflicts") or 0 for s in found)
    if conflicts:
        parts.append(f"{conflicts} operator calls where an estimate disagreed with a size the "
                     "program computed took the program's")
    if unknown:
        named = ", ".join(f"`{s['site']}` ({s['op']})" for s in unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        parts.append(f"data-dependent sizes unknown (sized empty, so these figures are a lower "
                     f"bound) at {len(unknown)} site{'s' if len(unknown) > 1 else ''}: {named}{more}")
    return "; ".join(parts)
