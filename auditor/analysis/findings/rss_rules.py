"""The rules on RSS beyond tensors: (e) RSS the census does not explain at the peak stage's end,
(f) peak RSS above the live-tensor peak. Both compare a figure from RSS readings with a share of
the peak, inside a noise band (auditor.analysis.findings.noise_band); auditor.analysis.findings.rules lists them.
"""
from __future__ import annotations

from auditor.analysis.findings.finding import Finding
from auditor.analysis.findings.noise_band import BORDERLINE, rss_band
from auditor.analysis.run import unstaged
from auditor.analysis.run.attribution import BEYOND_CENSUS, attribute
from auditor.analysis.run.live_tensor_peak import live_tensor_high, live_tensor_peak
from auditor.analysis.run.stages import peak_stage
from auditor.facts import units
from auditor.facts.allocator_retention import MMAP_THRESHOLD_START, threshold_fixed
from auditor.record.schema import RunRecord

UNTRACKED_SHARE = 0.25        # (e) RSS beyond the census at the peak stage's end, vs the peak
TENSOR_GAP_SHARE = 0.25       # (f) peak RSS minus live-tensor peak, vs the peak
RETENTION_SHARE = 0.10        # (f) its growth after glibc's mmap threshold rose, vs the peak: named


# -- (e) RSS the census does not explain ---------------------------------------------------

def untracked(record: RunRecord) -> list[Finding]:
    run_peak = record.peak.rss
    at_peak = peak_stage(record)
    attribution = attribute(at_peak) if at_peak is not None else None
    if not run_peak or attribution is None or attribution.beyond_census is None:
        return []
    beyond = attribution.beyond_census
    band = rss_band(record, UNTRACKED_SHARE * run_peak, f"{UNTRACKED_SHARE:.0%} of the peak")
    side = band.side(beyond)
    if side == "below":
        return []
    start = record.process.rss_at_start
    detail = ""
    if attribution.unseen is not None:
        detail = (f"; {units.size(attribution.unseen)} of it are tensors the census cannot reach "
                  f"(held by autograd) and {units.size(attribution.beyond_live)} is beyond live tensors")
    before = f"; the process held {units.size(start)} when the audit began" if start is not None else ""
    where = (band.borderline("RSS beyond the census") if side == "inside"
             else band.beyond())
    return [Finding("untracked-rss", BORDERLINE if side == "inside" else "medium",
                    f"{units.size(beyond)} of RSS at the end of the peak stage `{attribution.stage}` is "
                    f"beyond the census ({beyond / run_peak:.1%} of peak {units.size(run_peak)}): "
                    f"allocator retention, the interpreter and libraries, or memory no tensor "
                    f"census sees{detail}{before}{where}.",
                    {"stage": attribution.stage, "component": BEYOND_CENSUS, "bytes": beyond,
                     "share_of_peak": round(beyond / run_peak, 4), "band": band.evidence()})]


# -- (f) peak RSS against the live-tensor peak ---------------------------------------------

def tensor_gap(record: RunRecord) -> list[Finding]:
    run_peak = record.peak.rss
    high, metered = live_tensor_high(record), live_tensor_peak(record)
    if not run_peak or high is None:
        return []
    live, where = high
    stage = metered[1] if metered is not None else None
    gap = run_peak - live
    band = rss_band(record, TENSOR_GAP_SHARE * run_peak, f"{TENSOR_GAP_SHARE:.0%} of the peak")
    side = band.side(gap)
    if side == "below":
        return []
    severity = BORDERLINE if side == "inside" else "low"
    evidence = {"stage": stage, "rss_peak": run_peak, "live_tensor_peak": live, "gap": gap,
                "share_of_peak": round(gap / run_peak, 4), "band": band.evidence()}
    statement = (f"Peak RSS {units.size(run_peak)} ({unstaged.peak_place(record).phrase}) "
                 f"is {units.size(gap)} ({gap / run_peak:.1%}) above the live-tensor peak "
                 f"{units.size(live)} ({where}): RSS also holds the interpreter, "
                 f"libraries and freed memory the allocator keeps")
    noise = band.borderline("the gap") if side == "inside" else band.beyond()
    risen = _risen_threshold(record)
    grown = max(gap, risen[3]) - risen[2] if risen is not None else 0
    # named when its growth is not below the band (inside it too: the same words either way)
    if risen is None or rss_band(record, RETENTION_SHARE * run_peak, "").side(grown) == "below":
        return [Finding("rss-above-live-tensors", severity, statement + ", so size machines by RSS and "
                        f"count savings in live tensors{noise}.", evidence)]
    threshold, in_stage = risen[:2]
    return [Finding("rss-above-live-tensors", severity,
                    f"{statement}{noise}. glibc's malloc ran with its defaults, its mmap threshold rose to "
                    f"{units.size(threshold)} in `{in_stage}` (it follows the largest block freed), and "
                    f"RSS beyond live tensors grew by {units.size(grown)} from that stage's start: blocks "
                    f"below the threshold come from the heap, which keeps the space they leave.",
                    {**evidence, "mmap_threshold": threshold, "grown_since": grown},
                    remedy=("Keep glibc's mmap threshold where it starts: run with "
                            "`MALLOC_MMAP_THRESHOLD_=131072` (blocks of 128 KiB and more are then "
                            "mapped and returned when freed; reports/rank-projection-cpu.md measures "
                            "sharded GradProbe ranks with and without it), or call `malloc_trim(0)` "
                            "after a phase that frees large blocks. Size machines by RSS as run."))]


def _risen_threshold(record: RunRecord) -> tuple[int, str, int, int] | None:
    """Where the record says glibc's malloc ran with its mmap threshold free to move and the
    live-tensor meter followed it up: the highest threshold, the first stage that raised the
    threshold, the RSS beyond live tensors when that stage began, and the most beyond them at
    the end of that stage or a later one (the heap keeps freed holes: RSS stays as tensors go)."""
    malloc = record.environment.malloc
    if malloc is None or threshold_fixed(malloc):  # None: a record from before it was kept
        return None
    seen = [(s.live_tensors.allocator_threshold, s.path, s.rss.start - s.live_tensors.start,
             s.rss.end - s.live_tensors.end)
            for s in record.stages if s.live_tensors is not None and s.live_tensors.allocator_threshold
            and s.rss.start is not None and s.live_tensors.start is not None
            and s.rss.end is not None and s.live_tensors.end is not None]
    rose = next((n for n, row in enumerate(seen) if row[0] > MMAP_THRESHOLD_START), None)
    if rose is None:
        return None
    _, in_stage, beyond_at_start, _ = seen[rose]
    return (max(row[0] for row in seen), in_stage, beyond_at_start, max(row[3] for row in seen[rose:]))
