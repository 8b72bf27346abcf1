"""The rules on stages: (c) a transient spike inside a stage, named by what grew in it, and (g)
stages that failed or never finished, and runs that did not end ok. The transient compares RSS
readings with a share of the peak inside the noise band (auditor.analysis.findings.noise_band);
auditor.analysis.findings.rules lists them.
"""
from __future__ import annotations

from auditor.analysis.findings.finding import Finding
from auditor.analysis.findings.noise_band import BORDERLINE, Band, rss_band
from auditor.analysis.run import source_paths, unstaged
from auditor.analysis.run.growers import growers
from auditor.analysis.run.stages import finished
from auditor.facts import units
from auditor.record.schema import RunRecord, Stage

TRANSIENT_SHARE = 0.10        # (c) peak inside - max(start, end) above this fraction of the peak
GROWERS_NAMED = 3


# -- (c) transient spikes ------------------------------------------------------------------

def transients(record: RunRecord) -> list[Finding]:
    run_peak = record.peak.rss
    if not run_peak:
        return []
    stages = finished(record)
    child_peaks: dict[str, set[int | None]] = {}
    for s in stages:
        if s.parent is not None:
            child_peaks.setdefault(s.parent, set()).add(s.rss.peak)
    memray = record.memray
    found = []
    for stage in stages:
        rss = stage.rss
        assert rss.start is not None and rss.end is not None and rss.peak is not None, "a finished stage's RSS"
        transient = rss.peak - max(rss.start, rss.end)
        band = rss_band(record, TRANSIENT_SHARE * run_peak, f"{TRANSIENT_SHARE:.0%} of the peak")
        side = band.side(transient)
        if side == "below":
            continue
        if rss.peak in child_peaks.get(stage.path, ()):
            continue  # the child holding the same peak reports it, more precisely
        holds_peak = rss.peak == run_peak
        holding = _holds_peak(record, stage, stages)
        statement = (f"Transient spike of {units.size(transient)} in stage `{stage.path}`"
                     f"{_own_time(record, stage)} "
                     f"({transient / run_peak:.0%} of peak): RSS rose to {units.size(rss.peak)} "
                     f"inside it, against {units.size(rss.start)} at its start and "
                     f"{units.size(rss.end)} at its end")
        evidence = {"stage": stage.path, "transient": transient, "rss_peak": rss.peak,
                    "share_of_peak": round(transient / run_peak, 4), "holds_run_peak": holds_peak,
                    "band": band.evidence()}
        statement += _what_grew(record, stage, evidence)
        sites = memray.sites if memray is not None else []
        if sites and memray is not None and memray.stage == stage.path:
            site = sites[0]
            location = source_paths.shown_path(site.location, source_paths.code_root(record))
            where = f"`{location}`" + (f" in `{site.function}`" if site.function else "")
            statement += (f"; memray's largest site alive at its high-water mark is {where} "
                          f"({units.size(site.bytes)})")
            evidence["memray_site"] = site.location
        if side == "inside":  # the band last: what the transient is comes first
            statement += band.borderline("the transient")
        elif holding.side(rss.peak) == "inside":
            statement += holding.borderline("its peak (which stage holds the run's peak)")
            evidence["peak_band"] = holding.evidence()
        else:
            statement += band.beyond()
        severity = (BORDERLINE if "inside" in (side, holding.side(rss.peak))
                    else "high" if holds_peak else "medium")
        found.append(Finding("transient-spike", severity, statement + ".", evidence))
    return found


def _holds_peak(record: RunRecord, stage: Stage, stages: list[Stage]) -> Band:
    """The band that says whether the stage holds the run's peak RSS under noise: its peak is
    compared with the run's (or, holding it, the highest other stage's not nested with it),
    within the RSS band: "inside" when another run could put the peak elsewhere."""
    run_peak = record.peak.rss or 0
    others = [s.rss.peak for s in stages if s.rss.peak is not None and s is not stage
              and not s.path.startswith(stage.path + "/") and not stage.path.startswith(s.path + "/")]
    rival = max(others, default=0) if stage.rss.peak == run_peak else run_peak
    return rss_band(record, rival, "the peak of the stage holding the run's peak"
                    if stage.rss.peak != run_peak else "the highest peak of another stage")


def _own_time(record: RunRecord, stage: Stage) -> str:
    """Where in the stage's own time (no child covering it) its peak was, when the record says."""
    for item in unstaged.intervals(record):
        if item.parent == stage.path and item.rss.peak == stage.rss.peak:
            return f", in its own time {unstaged.describe(item, inside_parent=True)}"
    return ""


def _what_grew(record: RunRecord, stage: Stage, evidence: dict) -> str:
    """The clause naming what grew inside the stage (never the weights unless they grew);
    fills evidence["growers"] {name: bytes}."""
    grown = growers(record, stage)
    if grown is None:
        return ("; the record cannot name what grew (no live-tensor composition at its high and "
                "no census before it)")
    if not grown:
        how = ("nothing created inside it was alive at its live-tensor high" if
               stage.live_tensors is not None and stage.live_tensors.at_peak is not None else
               "no component grew between the census before it and the one at its end: "
               "temporaries made and freed inside it")
        return f"; {how}"
    named = grown[:GROWERS_NAMED]
    evidence["growers"] = {g.name: g.bytes for g in named}
    parts = ", ".join(f"{_quoted(g.name)} {units.size(g.bytes)} ({g.category}"
                      + ("" if g.kept else ", freed before its end") + ")" for g in named)
    more = f" and {len(grown) - len(named)} more" if len(grown) > len(named) else ""
    if named[0].basis == "at_peak":
        return f"; made inside it and alive at its live-tensor high: {parts}{more}"
    return (f"; what it added by its end (census before it to the one at its end; what was "
            f"freed before the end is not in a census): {parts}{more}")


def _quoted(name: str) -> str:
    return name if "`" in name else f"`{name}`"


# -- (g) stages that failed, runs that did not finish --------------------------------------

def failures(record: RunRecord) -> list[Finding]:
    found = []
    for stage in record.stages:
        if stage.status == "failed":
            found.append(Finding("failed-stage", "high",
                                 f"Stage `{stage.path}` failed ({_head(stage.error or 'no error recorded')}): "
                                 f"its readings end where it failed.",
                                 {"stage": stage.path, "error": stage.error}))
        elif stage.status == "open":
            found.append(Finding("failed-stage", "high",
                                 f"Stage `{stage.path}` never finished: it has a start reading only.",
                                 {"stage": stage.path}))
    exit_ = record.exit
    if exit_ is not None and exit_.status != "ok":
        found.append(Finding("failed-stage", "high",
                             f"The run ended {exit_.status}"
                             + (f" ({_head(exit_.error)})" if exit_.error else "")
                             + ": later stages and the final readings may be missing.",
                             {"exit": exit_.status, "error": exit_.error}))
    return found


LONGEST_ERROR = 2000  # characters of an error a finding quotes (a program's message can be megabytes)


def _head(error: str) -> str:
    if len(error) <= LONGEST_ERROR:
        return error
    return f"{error[:LONGEST_ERROR]}... ({len(error) - LONGEST_ERROR:,} characters more, in the run record)"
