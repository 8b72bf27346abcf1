"""Findings: what a run record shows, detected by rules with stated thresholds.

    for finding in findings(record):
        finding.severity, finding.statement, finding.evidence

Each rule is a pure function of the record; none is written by hand for a particular run.
`RULES` lists them with their thresholds (the report prints them); `evaluate` says for each
what it found, or why it could not be checked (a probe absent).

"Weights" are the parameters at each stage's census (see `auditor.analysis.components`);
"peak" is the run's peak RSS.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from auditor import units
from auditor.analysis import source_paths
from auditor.analysis.components import (BEYOND_CENSUS, attribute, census_order, finished, is_traced,
                                         live_tensor_peak, peak_stage, weights_bytes)

FULL_COPY_RATIO = 0.95        # (a) a component at least this fraction of the weights ...
FULL_COPY_MIN_STAGES = 2      #     ... alive at this many consecutive stage ends
DENSE_GRADIENT_RATIO = 0.90   # (b) gradients / gradient records at least this fraction of the weights
TRANSIENT_SHARE = 0.10        # (c) peak inside - max(start, end) above this fraction of the peak
RETAINED_RATIO = 0.10         # (d) tensors beyond the weights at the last stage end, vs the weights
UNTRACKED_SHARE = 0.25        # (e) RSS beyond the census at the peak stage's end, vs the peak
TENSOR_GAP_SHARE = 0.25       # (f) peak RSS minus live-tensor peak, vs the peak

SEVERITIES = ("high", "medium", "low")
PER_PARAMETER = frozenset({"weights", "gradients", "gradient records"})  # rules (a) and (b) own these
GRADIENT_CATEGORIES = ("gradients", "gradient records")


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str            # "high" | "medium" | "low"
    statement: str           # one sentence, with its numbers
    evidence: dict = field(default_factory=dict)  # stage, component, bytes, ... (JSON-able)


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    threshold: str
    needs: tuple[str, ...]   # inputs: "census", "peak census", "live_tensors", "real rss"
    check: Callable[[dict], list[Finding]]


@dataclass(frozen=True)
class Outcome:
    rule: Rule
    findings: tuple[Finding, ...]
    not_checked: str | None  # why the rule could not be checked (an input absent), else None


def evaluate(record: dict) -> list[Outcome]:
    """Every rule applied to the record: what it found, or why it could not be checked."""
    outcomes = []
    for rule in RULES:
        why = missing_input(record, rule)
        outcomes.append(Outcome(rule, () if why else tuple(rule.check(record)), why))
    return outcomes


def findings(record: dict) -> list[Finding]:
    """Every finding the rules detect in the record, most severe first (rule order within)."""
    return ordered([f for outcome in evaluate(record) for f in outcome.findings])


def ordered(found: list[Finding]) -> list[Finding]:
    return sorted(found, key=lambda f: SEVERITIES.index(f.severity))


def missing_input(record: dict, rule: Rule) -> str | None:
    if "real rss" in rule.needs and is_traced(record):
        return "a traced run on fake tensors: its RSS is the tracing process's, not the workload's"
    if "census" in rule.needs and not census_order(record):
        return "no stage carries a tensor census (run with census on)"
    if "peak census" in rule.needs:
        holder = peak_stage(record)
        if holder is None or holder.get("components") is None:
            return "the stage holding the peak has no census"
    if "live_tensors" in rule.needs and live_tensor_peak(record) is None:
        return "no live-tensor meter in this record"
    return None


# -- (a) full copies of the weights -------------------------------------------------------

def _full_copies(record: dict) -> list[Finding]:
    snapshots = census_order(record)
    found = []
    for name in _component_names(snapshots):
        runs, current = [], []
        for stage in snapshots:
            item = (stage["components"] or {}).get(name)
            weights = weights_bytes(stage)
            if (item and item.get("category") not in PER_PARAMETER and weights
                    and item["bytes"] >= FULL_COPY_RATIO * weights):
                current.append((stage, item["bytes"], item["bytes"] / weights, item["category"]))
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
        found.append(Finding("full-copy", "high",
                             f"`{name}` ({top[3]}) holds {held} from stage `{first['path']}` "
                             f"{_until(last, snapshots)}.",
                             {"component": name, "category": top[3], "bytes": top[1],
                              "ratio_to_weights": round(top[2], 4), "from_stage": first["path"],
                              "to_stage": last["path"], "stages": len(longest),
                              "to_the_end": last is snapshots[-1]}))
    return found


# -- (b) dense gradients for the whole model ----------------------------------------------

def _dense_gradients(record: dict) -> list[Finding]:
    snapshots = census_order(record)
    found = []
    for name in _component_names(snapshots):
        hits = []
        for stage in snapshots:
            item = (stage["components"] or {}).get(name)
            weights = weights_bytes(stage)
            if (item and item.get("category") in GRADIENT_CATEGORIES and weights
                    and item["bytes"] >= DENSE_GRADIENT_RATIO * weights):
                hits.append((stage, item["bytes"], item["bytes"] / weights, item["category"]))
        if not hits:
            continue
        top = max(hits, key=lambda h: h[1])
        first, last = hits[0][0], hits[-1][0]
        span = (f"at the end of stage `{first['path']}`" if len(hits) == 1
                else f"from stage `{first['path']}` {_until(last, snapshots)}")
        found.append(Finding("dense-gradients", "high",
                             f"`{name}` is a dense {top[3]} buffer for the whole model "
                             f"({units.size(top[1])}, {top[2]:.2f}x the weights) {span}.",
                             {"component": name, "category": top[3], "bytes": top[1],
                              "ratio_to_weights": round(top[2], 4), "from_stage": first["path"],
                              "to_stage": last["path"], "stages": len(hits)}))
    return found


# -- (c) transient spikes ------------------------------------------------------------------

def _transients(record: dict) -> list[Finding]:
    run_peak = (record.get("peak") or {}).get("rss")
    if not run_peak:
        return []
    stages = finished(record)
    child_peaks: dict[str, set[int]] = {}
    for s in stages:
        if s.get("parent") is not None:
            child_peaks.setdefault(s["parent"], set()).add(s["rss"]["peak"])
    memray = record.get("memray") or {}
    found = []
    for stage in stages:
        rss = stage["rss"]
        transient = rss["peak"] - max(rss["start"], rss["end"])
        if transient <= TRANSIENT_SHARE * run_peak:
            continue
        if rss["peak"] in child_peaks.get(stage["path"], ()):
            continue  # the child holding the same peak reports it, more precisely
        holds_peak = rss["peak"] == run_peak
        statement = (f"Transient spike of {units.size(transient)} in stage `{stage['path']}` "
                     f"({transient / run_peak:.0%} of peak): RSS rose to {units.size(rss['peak'])} "
                     f"inside it, against {units.size(rss['start'])} at its start and "
                     f"{units.size(rss['end'])} at its end")
        evidence = {"stage": stage["path"], "transient": transient, "rss_peak": rss["peak"],
                    "share_of_peak": round(transient / run_peak, 4), "holds_run_peak": holds_peak}
        sites = memray.get("sites") or []
        if sites and memray.get("stage") == stage["path"]:
            site = sites[0]
            location = source_paths.shown_path(site["location"], source_paths.code_root(record))
            where = f"`{location}`" + (f" in `{site['function']}`" if site.get("function") else "")
            statement += (f"; memray's largest site alive at its high-water mark is {where} "
                          f"({units.size(site['bytes'])})")
            evidence["memray_site"] = site["location"]
        found.append(Finding("transient-spike", "high" if holds_peak else "medium",
                             statement + ".", evidence))
    return found


# -- (d) memory retained after the algorithm returns ---------------------------------------

def _retained(record: dict) -> list[Finding]:
    last = census_order(record)[-1]
    weights = weights_bytes(last)
    if not weights:
        return []
    kept = sorted(((n, c) for n, c in last["components"].items() if c.get("category") != "weights"),
                  key=lambda kv: -kv[1]["bytes"])
    total = sum(c["bytes"] for _, c in kept)
    if total < RETAINED_RATIO * weights:
        return []
    listed = [(n, c) for n, c in kept if c["bytes"] >= 0.01 * total]
    parts = ", ".join(f"`{n}` {units.size(c['bytes'])} ({c['category']})" for n, c in listed[:6])
    if len(listed) > 6:
        parts += f" and {len(listed) - 6} more"
    process = record.get("process") or {}
    start, end = process.get("rss_at_start"), process.get("rss_at_end")
    rss = (f"; RSS at the end is {units.size(end)} against {units.size(start)} at the start "
           f"({units.signed_size(end - start)})" if start is not None and end is not None else "")
    severity = "high" if total >= weights else "medium"
    return [Finding("retained-at-end", severity,
                    f"After the last stage (`{last['path']}`) {units.size(total)} of tensors beyond "
                    f"the weights stay alive ({total / weights:.2f}x the weights): {parts}{rss}.",
                    {"stage": last["path"], "bytes": total, "ratio_to_weights": round(total / weights, 4),
                     "components": {n: c["bytes"] for n, c in listed},
                     "rss_at_start": start, "rss_at_end": end})]


# -- (e) RSS the census does not explain ---------------------------------------------------

def _untracked(record: dict) -> list[Finding]:
    run_peak = (record.get("peak") or {}).get("rss")
    attribution = attribute(peak_stage(record))
    if not run_peak or attribution is None or attribution.beyond_census is None:
        return []
    beyond = attribution.beyond_census
    if beyond <= UNTRACKED_SHARE * run_peak:
        return []
    start = (record.get("process") or {}).get("rss_at_start")
    detail = ""
    if attribution.unseen is not None:
        detail = (f"; {units.size(attribution.unseen)} of it are tensors the census cannot reach "
                  f"(held by autograd) and {units.size(attribution.beyond_live)} is beyond live tensors")
    before = f"; the process held {units.size(start)} when the audit began" if start is not None else ""
    return [Finding("untracked-rss", "medium",
                    f"{units.size(beyond)} of RSS at the end of the peak stage `{attribution.stage}` is "
                    f"beyond the census ({beyond / run_peak:.0%} of peak {units.size(run_peak)}): "
                    f"allocator retention, the interpreter and libraries, or memory no tensor "
                    f"census sees{detail}{before}.",
                    {"stage": attribution.stage, "component": BEYOND_CENSUS, "bytes": beyond,
                     "share_of_peak": round(beyond / run_peak, 4)})]


# -- (f) peak RSS against the live-tensor peak ---------------------------------------------

def _tensor_gap(record: dict) -> list[Finding]:
    run_peak = (record.get("peak") or {}).get("rss")
    live, stage = live_tensor_peak(record)
    if not run_peak:
        return []
    gap = run_peak - live
    if gap <= TENSOR_GAP_SHARE * run_peak:
        return []
    return [Finding("rss-above-live-tensors", "low",
                    f"Peak RSS {units.size(run_peak)} (stage `{(record.get('peak') or {}).get('stage')}`) "
                    f"is {units.size(gap)} ({gap / run_peak:.0%}) above the live-tensor peak "
                    f"{units.size(live)} (stage `{stage}`): RSS also holds the interpreter, "
                    f"libraries and freed memory the allocator keeps, so size machines by RSS and "
                    f"count savings in live tensors.",
                    {"stage": stage, "rss_peak": run_peak, "live_tensor_peak": live, "gap": gap,
                     "share_of_peak": round(gap / run_peak, 4)})]


# -- (g) stages that failed, runs that did not finish --------------------------------------

def _failures(record: dict) -> list[Finding]:
    found = []
    for stage in record["stages"]:
        if stage.get("status") == "failed":
            found.append(Finding("failed-stage", "high",
                                 f"Stage `{stage['path']}` failed ({stage.get('error') or 'no error recorded'}): "
                                 f"its readings end where it failed.",
                                 {"stage": stage["path"], "error": stage.get("error")}))
        elif stage.get("status") == "open":
            found.append(Finding("failed-stage", "high",
                                 f"Stage `{stage['path']}` never finished: it has a start reading only.",
                                 {"stage": stage["path"]}))
    exit_ = record.get("exit") or {}
    if exit_.get("status") not in (None, "ok"):
        found.append(Finding("failed-stage", "high",
                             f"The run ended {exit_['status']}"
                             + (f" ({exit_['error']})" if exit_.get("error") else "")
                             + ": later stages and the final readings may be missing.",
                             {"exit": exit_.get("status"), "error": exit_.get("error")}))
    return found


def _component_names(snapshots: list[dict]) -> list[str]:
    names: dict[str, None] = {}
    for stage in snapshots:
        names.update(dict.fromkeys(stage["components"] or {}))
    return list(names)


def _until(last: dict, snapshots: list[dict]) -> str:
    return "to the end" if last is snapshots[-1] else f"to stage `{last['path']}` (gone after it)"


RULES: tuple[Rule, ...] = (
    Rule("full-copy", "A component holds a full copy of the weights",
         f"bytes >= {FULL_COPY_RATIO:.0%} of the weights at >= {FULL_COPY_MIN_STAGES} consecutive "
         "stage ends (categories other than weights, gradients, gradient records)",
         ("census",), _full_copies),
    Rule("dense-gradients", "Dense gradients or gradient records for the whole model",
         f"a gradients / gradient records component >= {DENSE_GRADIENT_RATIO:.0%} of the weights "
         "at a stage end", ("census",), _dense_gradients),
    Rule("transient-spike", "Transient spike inside a stage",
         f"peak inside - max(start, end) > {TRANSIENT_SHARE:.0%} of the run's peak RSS "
         "(reported at the deepest stage holding it)", ("real rss",), _transients),
    Rule("retained-at-end", "Memory retained after the algorithm returns",
         f"tensors other than weights at the last stage end >= {RETAINED_RATIO:.0%} of the weights",
         ("census",), _retained),
    Rule("untracked-rss", "RSS beyond the census",
         f"RSS at the end of the peak stage minus its census > {UNTRACKED_SHARE:.0%} of the peak",
         ("census", "peak census", "real rss"), _untracked),
    Rule("rss-above-live-tensors", "Peak RSS above the live-tensor peak",
         f"peak RSS - live-tensor peak > {TENSOR_GAP_SHARE:.0%} of the peak",
         ("live_tensors", "real rss"), _tensor_gap),
    Rule("failed-stage", "Failed or unfinished stages", "any stage failed or open, or the run "
         "did not end ok", (), _failures),
)
