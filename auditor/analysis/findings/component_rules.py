"""The rules on components, each over the censuses at stage ends: (a) a component holding a copy
of the weights, (b) dense gradients for the whole model, (d) tensors retained after the algorithm
returns, (h) tensors alive only through a reference cycle. Tensor bytes are exact, so their
thresholds carry no noise band (the retained rule's does where it falls back to the peak RSS).
auditor.analysis.findings.rules lists them.

"Weights" are the parameters at each stage's census (auditor.analysis.run.attribution).
"""
from __future__ import annotations

from collections.abc import Callable

from auditor.analysis.findings.finding import Finding
from auditor.analysis.findings.noise_band import BORDERLINE, rss_band, tensor_band
from auditor.analysis.run.attribution import is_buffer, largest_weights, weights_bytes
from auditor.analysis.run.stages import census_order
from auditor.facts import units
from auditor.facts.allocation_sites import DDP_BUCKETS, communication_buffer
from auditor.record.schema import Component, RunRecord, Stage

FULL_COPY_RATIO = 0.95        # (a) a copy of at least this share of the weights is a full copy (high),
PARTIAL_COPY_SHARE = 0.20     #     of at least this share a partial one (medium), at any census;
FULL_COPY_MIN_STAGES = 2      #     without provenance: FULL_COPY_RATIO of the weights' bytes at this
                              #     many consecutive stage ends, said to rest on size only
NEVER_COPIES = frozenset({"buffers"})  # a model's own buffers (causal masks): its state, not a copy
MODEL_STATE = frozenset({"weights", "buffers"})  # the model itself: never "retained" (rule (d))
SIZE_ONLY = ("(by size only: no live-tensor meter in this record followed copies, so nothing "
             "says it was copied from the weights)")
DENSE_GRADIENT_RATIO = 0.90   # (b) gradients / gradient records at least this fraction of the weights
RETAINED_RATIO = 0.10         # (d) tensors beyond the weights at the last stage end, vs the weights
                              #     (vs the peak RSS when the record knows no weights); also (h)

DDP_BUCKETS_REMEDY = ("DDP keeps a bucket copy of every gradient for its all-reduce: "
                      "`DistributedDataParallel(model, gradient_as_bucket_view=True)` makes the gradients "
                      "views into the buckets, so the two are one buffer with the same values (code that "
                      "calls `detach_()` on a gradient cannot use it, torch's documentation says).")

PER_PARAMETER = frozenset({"weights", "gradients", "gradient records"})  # rules (a) and (b) own these
GRADIENT_CATEGORIES = ("gradients", "gradient records")
ACTIVATIONS = "activations and temporaries"
CYCLES = "unreachable.cycles"            # the census's component for tensors only a cycle keeps
CYCLE_CATEGORY = "retained by a reference cycle"


# -- (a) copies of the weights ----------------------------------------------------------

def full_copies(record: RunRecord) -> list[Finding]:
    """Components made by copying the weights, from the live-tensor meter's provenance
    (auditor.capture.census.provenance): one census is enough, and nothing else is a copy however large. A
    record without it (no meter, or an older one) falls back to size, and says so."""
    snapshots = census_order(record)
    if not _follows_copies(record):
        return copies_by_size(snapshots, lambda name: True)
    # DDP's gradient buckets are copies of the gradients, not of the weights: found by size
    return (_copies_by_provenance(snapshots)
            + copies_by_size(snapshots, lambda name: communication_buffer(name) == DDP_BUCKETS))


def _follows_copies(record: RunRecord) -> bool:
    meter = (record.probes or {}).get("live_tensors")
    return meter is not None and meter.state == "on" and bool(meter.copies)


def _copies_by_provenance(snapshots: list[Stage]) -> list[Finding]:
    found = []
    for name in _component_names(snapshots):
        hits: list[tuple[Stage, Component, int]] = []
        for stage in snapshots:
            item = (stage.components or {}).get(name)
            weights = weights_bytes(stage)
            if (item and item.category not in PER_PARAMETER and item.weights_copied and weights
                    and _exact(PARTIAL_COPY_SHARE * weights, item.weights_copied)):
                hits.append((stage, item, weights))
        if not hits:
            continue
        stage, top, weights = max(hits, key=lambda h: (h[1].weights_copied or 0) / h[2])
        first, last = hits[0][0], hits[-1][0]
        copied, held = top.weights_copied or 0, top.copy_bytes or 0
        share = copied / weights
        full = _exact(FULL_COPY_RATIO * weights, copied)
        tensors = _parameter_tensors(stage)
        of = (f"{top.parameters_copied} of the {tensors} parameter tensors" if top.parameters_copied and tensors
              else "parameter tensors")
        precision = ("" if abs(held - copied) <= 0.01 * copied else
                     f", {held / copied:.0%} of the bytes they copy: another precision")
        span = (f"from stage `{first.path}` to the end" if last is snapshots[-1]
                else f"at the end of stage `{first.path}` (gone after it)" if first is last
                else f"from stage `{first.path}` {_until(last, snapshots)}")
        found.append(Finding("full-copy", "high" if full else "medium",
                             f"`{name}` ({top.category}) holds a copy of {share:.0%} of the weights "
                             f"({units.size(held)} copied from {of}{precision}) {span}.",
                             {"component": name, "category": top.category, "bytes": held,
                              "weights_copied": copied, "share_of_weights": round(share, 4),
                              "parameters_copied": top.parameters_copied, "parameter_tensors": tensors,
                              "ratio_to_weights": round(top.bytes / weights, 4), "basis": "provenance",
                              "from_stage": first.path, "to_stage": last.path, "stages": len(hits),
                              "to_the_end": last is snapshots[-1]}))
    return found


def _parameter_tensors(stage: Stage) -> int:
    """Parameter storages at the stage end (weights components other than module buffers)."""
    return sum(c.tensors or 0 for n, c in (stage.components or {}).items()
               if c.category == "weights" and not is_buffer(n))


def copies_by_size(snapshots: list[Stage], wanted: Callable[[str], bool]) -> list[Finding]:
    """Without provenance: a component as large as the weights at consecutive stage ends."""
    found = []
    for name in filter(wanted, _component_names(snapshots)):
        runs: list[list[tuple[Stage, int, float, str]]] = []
        current: list[tuple[Stage, int, float, str]] = []
        for stage in snapshots:
            item = (stage.components or {}).get(name)
            weights = weights_bytes(stage)
            if (item and item.category not in PER_PARAMETER | NEVER_COPIES and weights
                    and _exact(FULL_COPY_RATIO * weights, item.bytes)):
                current.append((stage, item.bytes, item.bytes / weights, item.category))
            elif current:
                runs.append(current)
                current = []
        if current:
            runs.append(current)
        longest = max(runs, key=len, default=[])
        if len(longest) < FULL_COPY_MIN_STAGES:
            continue
        first, last = longest[0][0], longest[-1][0]
        top = max(longest, key=lambda r: r[1])
        held = (f"a full copy of the weights ({units.size(top[1])}, {top[2]:.2f}x)" if top[2] < 1.5
                else f"{top[2]:.2f}x the size of the weights ({units.size(top[1])})")
        if top[3] == ACTIVATIONS:  # not a copy: buffers of inputs or activations as large as the weights
            held = f"as many bytes as the weights or more ({units.size(top[1])}, {top[2]:.2f}x)"
        buckets = communication_buffer(name) == DDP_BUCKETS
        found.append(Finding("full-copy", "high",
                             f"`{name}` ({top[3]}) holds {held} from stage `{first.path}` "
                             f"{_until(last, snapshots)}" + ("." if buckets else f" {SIZE_ONLY}."),
                             {"component": name, "category": top[3], "bytes": top[1],
                              "ratio_to_weights": round(top[2], 4), "from_stage": first.path,
                              "to_stage": last.path, "stages": len(longest),
                              "to_the_end": last is snapshots[-1], "basis": "size"},
                             remedy=DDP_BUCKETS_REMEDY if buckets else ""))
    return found


# -- (b) dense gradients for the whole model ----------------------------------------------

def dense_gradients(record: RunRecord) -> list[Finding]:
    snapshots = census_order(record)
    found = []
    for name in _component_names(snapshots):
        hits = []
        for stage in snapshots:
            item = (stage.components or {}).get(name)
            weights = weights_bytes(stage)
            if (item and item.category in GRADIENT_CATEGORIES and weights
                    and _exact(DENSE_GRADIENT_RATIO * weights, item.bytes)):
                hits.append((stage, item.bytes, item.bytes / weights, item.category))
        if not hits:
            continue
        top = max(hits, key=lambda h: h[1])
        first, last = hits[0][0], hits[-1][0]
        span = (f"at the end of stage `{first.path}`" if len(hits) == 1
                else f"from stage `{first.path}` {_until(last, snapshots)}")
        found.append(Finding("dense-gradients", "high",
                             f"`{name}` is a dense {top[3]} buffer for the whole model "
                             f"({units.size(top[1])}, {top[2]:.2f}x the weights) {span}.",
                             {"component": name, "category": top[3], "bytes": top[1],
                              "ratio_to_weights": round(top[2], 4), "from_stage": first.path,
                              "to_stage": last.path, "stages": len(hits)}))
    return found


# -- (d) memory retained after the algorithm returns ---------------------------------------

def retained(record: RunRecord) -> list[Finding]:
    ends = census_order(record)
    last = ends[-1]
    weights = largest_weights(record)
    peak = record.peak.rss
    base, base_words = (weights, "the weights") if weights else (peak, "the peak RSS")
    if not base:
        return []
    kept = sorted(((n, c) for n, c in (last.components or {}).items()  # a census: never None here
                   if c.category not in MODEL_STATE and n != CYCLES and c.category != CYCLE_CATEGORY),
                  key=lambda kv: -kv[1].bytes)
    total = sum(c.bytes for _, c in kept)
    label = f"{RETAINED_RATIO:.0%} of {base_words}"
    band = tensor_band(RETAINED_RATIO * base, label) if weights else rss_band(record, RETAINED_RATIO * base, label)
    side = band.side(total)
    if side == "below":
        return []
    listed = [(n, c) for n, c in kept if c.bytes >= 0.01 * total]
    left_by = {n: _left_by(record, ends, n) for n, _ in listed}
    parts = ", ".join(f"`{n}` {units.size(c.bytes)} ({c.category}"
                      + (f", left by `{left_by[n]}`" if left_by[n] else "") + ")" for n, c in listed[:6])
    if len(listed) > 6:
        parts += f" and {len(listed) - 6} more"
    start, end = record.process.rss_at_start, record.process.rss_at_end
    rss = (f"; RSS at the end is {units.size(end)} against {units.size(start)} at the start "
           f"({units.signed_size(end - start)})" if start is not None and end is not None else "")
    severity = "high" if weights and total >= weights else "medium"
    if side == "inside":
        severity, rss = BORDERLINE, rss + band.borderline("what stays alive")
    else:
        rss += band.beyond()
    return [Finding("retained-at-end", severity,
                    f"After the last stage (`{last.path}`) {units.size(total)} of tensors beyond "
                    f"the weights stay alive ({total / base:.2f}x {base_words}): {parts}{rss}.",
                    {"stage": last.path, "bytes": total, "band": band.evidence(),
                     "ratio_to_weights": round(total / weights, 4) if weights else None,
                     "components": {n: c.bytes for n, c in listed},
                     "left_by": {n: s for n, s in left_by.items() if s},
                     "rss_at_start": start, "rss_at_end": end})]


def _left_by(record: RunRecord, ends: list[Stage], name: str) -> str | None:
    """The top-level stage at whose end (or inside which) the component first appeared."""
    first = next((s for s in ends if name in (s.components or {})), None)
    if first is None:
        return None
    by_path = {s.path: s for s in record.stages}
    stage = first
    while stage.parent is not None and stage.parent in by_path:
        stage = by_path[stage.parent]
    return stage.path


# -- (h) tensors alive only through a reference cycle ---------------------------------------

def reference_cycles(record: RunRecord) -> list[Finding]:
    """Tensors the census found reachable only through an unreachable reference cycle: alive
    after the call that made them returned, until the cycle collector next runs."""
    ends = census_order(record)
    seen: list[tuple[Stage, Component]] = [(s, c) for s in ends for n, c in (s.components or {}).items()
                                           if n == CYCLES or c.category == CYCLE_CATEGORY]
    if not seen:  # any size: a leak is a leak, and the census only checks storages of 1 MiB or more
        return []
    stage, top = max(seen, key=lambda sc: sc[1].bytes)
    first, last = seen[0][0], seen[-1][0]
    weights = largest_weights(record)
    how = "returned" if first.call is not None else "ended"
    span = ("seen at that stage end only" if first is last
            else f"seen from that stage end {_until(last, ends)}")
    severity = "high" if weights and _exact(RETAINED_RATIO * weights, top.bytes) else "medium"
    return [Finding("reference-cycle", severity,
                    f"{units.size(top.bytes)} of tensors stay alive after `{first.path}` {how} "
                    f"only through a reference cycle (`{CYCLES}`, {span}): freed only by the cycle collector, "
                    f"whenever it next runs, not when the call returns.",
                    {"component": CYCLES, "stage": stage.path, "bytes": top.bytes,
                     "from_stage": first.path, "to_stage": last.path,
                     "ratio_to_weights": round(top.bytes / weights, 4) if weights else None})]


def _exact(threshold: float, value: int) -> bool:
    """A tensor-bytes rule's ">=": exact bytes, the same in identical runs, so no noise band."""
    return tensor_band(threshold, "").side(value) == "above"


def _component_names(snapshots: list[Stage]) -> list[str]:
    names: dict[str, None] = {}
    for stage in snapshots:
        names.update(dict.fromkeys(stage.components or {}))
    return list(names)


def _until(last: Stage, snapshots: list[Stage]) -> str:
    return "to the end" if last is snapshots[-1] else f"to stage `{last.path}` (gone after it)"
