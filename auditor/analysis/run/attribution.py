"""Attribution: where the RSS of a stage goes, by component and by category.

A stage's census is taken at its end, so attribution explains the stage's **end** RSS:

    components (census)                                 sum = census total
    tensors held by autograd / not reachable            live-tensor meter minus census (when metered)
    RSS beyond the census (allocator slack, ...)        RSS at the end minus census total
    ------------------------------------------------------------------------------------
    RSS at the end of the stage                         = census total + beyond the census

"RSS beyond the census" is never dropped, even when it is negative (a census larger than
RSS means pages counted as tensor bytes were never touched). Where the live-tensor meter is
present, it splits into the tensors the census cannot reach and the rest.

"Weights", as the ratios in the report use the word, are the parameters: the components of
category "weights" other than module buffers (`*.buffers`: attention masks, rotary tables),
which algorithms do not copy. On a real model the two differ by a few percent; on a tiny test
model the causal-mask buffers can outweigh the parameters.

Projection columns come from the record's `projections` list
(auditor.analysis.projection.views). Everything here is a pure function of the run record.
"""
from __future__ import annotations

from dataclasses import dataclass

from auditor.analysis.run.stages import census_order, final_stage, peak_stage
from auditor.record.schema import RunRecord, Stage

WEIGHTS = "weights"
BEYOND_CENSUS = "RSS beyond the census (allocator slack, interpreter, libraries)"
UNSEEN_TENSORS = "tensors held by autograd / not reachable (live-tensor meter minus census)"
BEYOND_LIVE = "RSS beyond live tensors (allocator slack, interpreter, libraries)"


@dataclass
class ComponentRow:
    name: str
    category: str
    bytes: int
    share: float | None  # of the stage's RSS at its end


@dataclass
class Attribution:
    """One stage's end RSS, attributed."""
    stage: str
    status: str
    rss_end: int | None
    rss_peak: int | None
    rows: list[ComponentRow]              # largest first
    categories: list[tuple[str, int]]     # (category, bytes), largest first
    census: int                           # sum of the components
    beyond_census: int | None             # rss_end - census
    live_tensors_end: int | None          # the live-tensor meter at the stage end, when present
    unseen: int | None                    # live_tensors_end - census, when metered
    beyond_live: int | None               # rss_end - live_tensors_end, when metered
    weights: int                          # parameters (category weights, buffers excluded)
    buffers: int                          # module buffers (category weights)

    def share(self, value: int | None) -> float | None:
        if value is None or not self.rss_end:
            return None
        return value / self.rss_end


def is_buffer(name: str) -> bool:
    return name == "buffers" or name.endswith(".buffers")


def weights_bytes(stage: Stage) -> int | None:
    """Parameters at the stage end (category weights, module buffers excluded); None without a census."""
    components = stage.components
    if components is None:
        return None
    weights = [(n, c.bytes) for n, c in components.items() if c.category == WEIGHTS]
    parameters = sum(b for n, b in weights if not is_buffer(n))
    return parameters if parameters else sum(b for _, b in weights)


def run_weights(record: RunRecord) -> int | None:
    """The weights for the run's ratios: at the peak stage, else at the last census."""
    for entry in (peak_stage(record), final_stage(record)):
        if entry is not None and entry.components is not None:
            return weights_bytes(entry)
    return None


def largest_weights(record: RunRecord) -> int | None:
    """The most parameters any census saw: the weights to compare with when the stage at hand
    has none in its census (a helper's stage, a census after the model was freed)."""
    seen = [weights_bytes(s) for s in census_order(record)]
    return max((w for w in seen if w), default=None)


def attribute(stage: Stage) -> Attribution | None:
    """The stage's end RSS by component and category; None when the stage has no census."""
    components = stage.components
    if components is None:
        return None
    rss_end = stage.rss.end
    census = sum(c.bytes for c in components.values())

    def share(value: int) -> float | None:
        return value / rss_end if rss_end else None

    rows = sorted((ComponentRow(name, c.category or "other", c.bytes, share(c.bytes))
                   for name, c in components.items()), key=lambda r: (-r.bytes, r.name))
    totals: dict[str, int] = {}
    for row in rows:
        totals[row.category] = totals.get(row.category, 0) + row.bytes
    live_end = stage.live_tensors.end if stage.live_tensors else None
    weights = weights_bytes(stage) or 0
    buffers = sum(c.bytes for n, c in components.items() if c.category == WEIGHTS and is_buffer(n))
    return Attribution(
        stage=stage.path, status=stage.status, rss_end=rss_end,
        rss_peak=stage.rss.peak, rows=rows,
        categories=sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])), census=census,
        beyond_census=None if rss_end is None else rss_end - census,
        live_tensors_end=live_end,
        unseen=None if live_end is None else live_end - census,
        beyond_live=None if live_end is None or rss_end is None else rss_end - live_end,
        weights=weights, buffers=buffers)


def attributions(record: RunRecord) -> list[Attribution]:
    """Every stage with a census, in census order."""
    return [a for a in (attribute(s) for s in census_order(record)) if a is not None]
