"""(i) Child processes that held memory of their own, outside every figure of the record.

    found = child_memory(record)          # the rule (auditor.analysis.findings.rules lists it)
    text = projection_caveat(record)      # what a projection of this run leaves out, or None

A child process is not audited (`auditor.capture.probes.child_processes`): what it holds is in none of
the record's figures, yet the machine must hold it beside the audited process. The rule judges
the children's own memory (USS: pages no other process maps) at the readings the record has
(top-level stage ends and the run's end), against this process's peak RSS and the weights.

A forked child (fork without exec: a `multiprocessing.Process` or DataLoader worker under the
fork start method) starts owning none of its parent's pages; each page the parent writes after
the fork is then copied, and the child keeps the old one as its own. So its own memory grows
with what the parent writes after the fork: with the model where the parent writes the model's
tensors. One record holds one model size: the rule says the ratio to the weights it saw and
gives no figure at another size.

A traced projection runs the program on fake tensors: its children fork no real memory, so no
projected figure counts them; `projection_caveat` says so where the real run's children held
memory.
"""
from __future__ import annotations

from dataclasses import dataclass

from auditor.analysis.findings.finding import Finding
from auditor.analysis.projection.views import projection_views
from auditor.analysis.run.attribution import largest_weights, weights_bytes
from auditor.analysis.run.stages import census_order, ended
from auditor.facts import units
from auditor.record.schema import Children, RunRecord

CHILD_SHARE = 0.10   # the children's own memory at a reading, vs this process's peak RSS: medium
CHILD_HIGH = 0.50    # ... high
GREW = 0.05          # growth between readings told only beyond this share of the largest

FORKED_REMEDY = ("A forked child keeps its own copy of every page this process writes after the fork "
                 "(copy on write). Start it before the model is built (it then shares none of the model), "
                 "start it with the spawn start method (`multiprocessing.get_context(\"spawn\").Process`, "
                 "or `DataLoader(..., multiprocessing_context=\"spawn\")`: a fresh interpreter that holds only "
                 "what it imports), or run a logger in a thread (`threading.Thread`, or "
                 "`logging.handlers.QueueListener`), which shares this process's memory and copies nothing.")


@dataclass(frozen=True)
class Held:
    """The running children at one reading."""
    where: str                # "at the end of stage `load`", "as the run ended"
    stage: str | None         # the stage that ended (None: the run's end)
    at_s: float | None
    alive: int
    forked: int | None
    rss: int | None
    uss: int | None


def readings(children: Children, end_s: float | None = None) -> list[Held]:
    """The record's readings of the running children, in time order, the run's end last."""
    found = [Held(f"at the end of stage `{r.stage}`", r.stage, r.at_s, r.alive, r.forked, r.rss, r.uss)
             for r in children.at_stage_ends or [] if r.alive]
    if children.alive_at_end:
        found.append(Held("as the run ended", None, end_s, children.alive_at_end, children.alive_forked_at_end,
                          children.alive_rss_at_end, children.alive_uss_at_end))
    return found


def own_memory(record: RunRecord) -> tuple[int, str, Held | None] | None:
    """The most the children held at a reading: (bytes, basis "uss" | "rss" | "ended peak rss",
    the reading or None for an ended child's peak); None where the record says nothing."""
    children = record.process.children
    if children is None:
        return None
    held = readings(children, record.duration_s)
    own = [h for h in held if h.uss is not None]
    if own:
        top = max(own, key=lambda h: h.uss or 0)
        return (top.uss or 0), "uss", top
    with_rss = [h for h in held if h.rss]
    if with_rss:
        top = max(with_rss, key=lambda h: h.rss or 0)
        if (top.rss or 0) >= (children.largest_ended_peak_rss or 0):
            return (top.rss or 0), "rss", top
    if children.largest_ended_peak_rss:
        return children.largest_ended_peak_rss, "ended peak rss", None
    return None


def child_memory(record: RunRecord) -> list[Finding]:
    """(i) The children held >= CHILD_SHARE of this process's peak RSS of their own at a reading."""
    peak = record.peak.rss
    children = record.process.children
    found = own_memory(record)
    if not peak or children is None or found is None:
        return []
    own, basis, top = found
    share = own / peak
    if share < CHILD_SHARE:
        return []
    weights = largest_weights(record)
    evidence: dict = {"bytes": own, "basis": basis, "share_of_peak": round(share, 4), "rss_peak": peak,
                      "stage": top.stage if top is not None else None,
                      "ratio_to_weights": round(own / weights, 4) if weights else None,
                      "weights": weights, "forked": top.forked if top is not None else None}
    statement = _held(own, basis, top, children) + f": {share:.0%} of this process's peak RSS {units.size(peak)}"
    statement += (f" and {own / weights:.2f}x the weights ({units.size(weights)})" if weights else
                  " (the record has no census: the weights' size is not known)")
    statement += "; none of this report's figures counts it" + _growth(record, children, evidence)
    forked = bool(top is not None and top.forked)
    if forked:
        statement += _copy_on_write(record, children, weights, evidence)
    if top is not None:
        statement += (". Read at top-level stage ends and as the run ended: what a child held between readings is "
                      "not known" if children.at_stage_ends else ". Read as the run ended only")
    if projection_views(record):
        statement += ("; no projection in this record counts it (a projection models this process alone, and a "
                      "traced run's fake tensors fork no real memory)")
    return [Finding("child-memory", "high" if share >= CHILD_HIGH else "medium", statement + ".", evidence,
                    remedy=FORKED_REMEDY if forked else "")]


def projection_caveat(record: RunRecord) -> str | None:
    """One sentence for a projection of this (real) run: the children it leaves out, where they
    held memory; None where the record saw no child hold any."""
    found = own_memory(record)
    children = record.process.children
    if found is None or children is None or is_tiny(found[0]):
        return None
    own, basis, top = found
    forked = (" A forked child's own memory grows with the pages the parent writes after the fork: at a larger "
              "target, expect more where the parent writes the model's tensors after the fork."
              if top is not None and top.forked else "")
    return (f"Child processes are left out: in the run as audited, {_held(own, basis, top, children)}, "
            f"beside its own peak; the traced run runs on fake tensors, whose children fork no real memory, "
            f"so no projected figure counts them.{forked}")


def is_tiny(size: int) -> bool:
    """Below a page table's noise: a child that held next to nothing of its own."""
    return size < 1 << 20


def _held(own: int, basis: str, top: Held | None, children: Children) -> str:
    """'child processes held X of their own memory (USS) at the end of stage `s` (1 running, forked)'."""
    if top is None:
        return (f"a child process that ended during the run peaked at {units.size(own)} RSS (its own memory "
                f"is not known: the record has only the kernel's peak RSS for it, which for a forked child also "
                f"counts the pages it shares with this process)")
    running = f"{top.alive} running" + (f", {top.forked} of them forked without exec" if top.forked else "")
    if basis == "uss":
        return (f"child processes held {units.size(own)} of their own memory (USS: pages no other process maps) "
                f"{top.where} ({running})")
    why = ("psutil's `memory_full_info` is not available here or could not read them" if top.uss is None
           else "")
    return (f"child processes held {units.size(own)} RSS {top.where} ({running}; their own memory is not "
            f"known: {why}, and a forked child's RSS also counts the pages it shares with this process)")


def _growth(record: RunRecord, children: Children, evidence: dict) -> str:
    """How the children's own memory changed from the first reading to the largest, where the
    record has more than one."""
    own = [h for h in readings(children, record.duration_s) if h.uss is not None]
    if len(own) < 2:
        return ""
    first, top = own[0], max(own, key=lambda h: h.uss or 0)
    if (top.uss or 0) - (first.uss or 0) < GREW * (top.uss or 0):
        return ""  # the same within a reading's noise: no growth to tell
    evidence["first_reading"] = {"stage": first.stage, "bytes": first.uss}
    return f"; it grew from {units.size(first.uss or 0)} {first.where} to {units.size(top.uss or 0)} {top.where}"


def _copy_on_write(record: RunRecord, children: Children, weights: int | None, evidence: dict) -> str:
    """What the record shows of copy on write: when the first forked child was seen, whether this
    process held the weights by then, and what that means at another model size."""
    first = next((h for h in readings(children, record.duration_s) if h.forked), None)
    text = ""
    stage = next((s for s in record.stages if first is not None and s.parent is None and s.path == first.stage
                  and s.end_s is not None and first.at_s is not None and abs(s.end_s - first.at_s) < 1e-5), None)
    if first is not None and stage is not None:
        # not running at the top-level stage end before (a reading would show it): forked after it,
        # so after every census that ended before this stage began
        before = [s for s in census_order(record) if ended(s) <= stage.start_s]
        held = max((weights_bytes(s) or 0 for s in before), default=0)
        evidence["first_seen_stage"] = first.stage
        evidence["weights_before_fork"] = held or None
        text = (f". The first forked child was running {first.where}, and at no top-level stage end before"
                + (f"; this process held {units.size(held)} of weights before that stage began, so it was forked "
                   f"after the model was built" if held else ""))
    text += (". A forked child comes to own each page this process writes after the fork, so its own memory grows "
             "with what this process writes then")
    if weights:
        text += (" (with the model where it writes the model's tensors); this record holds one model size, so it "
                 "gives no figure at another")
    return text
