"""The noise band around a finding's threshold: how far an identical run may move the figure.

    band = rss_band(record, 0.25 * record.peak.rss, "25% of the peak")
    band.side(value)     # "above" | "inside" | "below"
    band.words()         # "25% of the peak ± 110.4 MiB, 441.6 MiB to 662.3 MiB: <why that margin>"

Two identical runs do not read the same RSS: glibc keeps freed blocks in its heaps or returns
them depending on timing, so the peak RSS and everything measured from RSS readings move. Measured
by benchmarks/findings_stability.py (reports/findings-stability.md): five audits of GradProbe on
TinyStories-33M and the committed main record read peak RSS from 2,111 to 2,208 MiB (4.5% of the
peak apart), the RSS above the live-tensor peak from 20.3% to 23.8% of the peak (4.5% in bytes), a
stage's transient (its peak above its start and end) up to 3.9% of the peak apart; five runs of a
Hessian pruner moved by 1.1%. The fresh `make audit` issue 30 quotes read 25.1% beyond the census.
Tensor bytes (census components, the weights) were the same to the byte in every run.

So each rule compares its figure with its threshold and a margin (`Band`):
- a figure from RSS readings (RSS beyond tensors, a transient, a stage's peak against the run's,
  anything compared with the peak RSS): the larger of RSS_BAND of the peak (the most any RSS
  figure moved above, rounded up) and what the run's own record says glibc may keep or return
  between two runs (`allocator_slack`: each thread's heap may keep up to its trim threshold,
  twice its mmap threshold, freed at its top; the slack the projections model in
  auditor.facts.allocator_retention). The main job's slack: 2 threads x 2 x 24.5 MiB = 98.2 MiB, the
  ~100 MiB its peak moved.
- tensor bytes: exact, no band (identical runs measured the same bytes).

A figure more than the margin beyond its threshold keeps its rule's severity, more than the margin
below it is silent, and inside the band it is "borderline", with the figure, the band and its
source in the finding's words: the same in every run whose noise stays inside the band.
"""
from __future__ import annotations

from dataclasses import dataclass

from auditor.facts import units
from auditor.facts.allocator_retention import threshold_fixed
from auditor.record.schema import RunRecord

RSS_BAND = 0.05   # of the peak RSS: RSS figures moved by up to 4.5% of it between identical runs (measured)
MEASURED_AT = "reports/findings-stability.md"
BORDERLINE = "borderline"


@dataclass(frozen=True)
class Band:
    threshold: float     # bytes the figure is compared with
    margin: float        # bytes either side of it that identical runs may move the figure
    label: str           # the threshold in the rule's words ("25% of the peak")
    source: str          # why this margin, in plain words

    def side(self, value: float) -> str:
        """"above" beyond the band, "below" under it, "inside" within it (edges included); with
        no band, "above" from the threshold on (the rules' ">=" on exact bytes)."""
        if not self.margin:
            return "above" if value >= self.threshold else "below"
        if value > self.threshold + self.margin:
            return "above"
        if value < self.threshold - self.margin:
            return "below"
        return "inside"

    def words(self) -> str:
        if not self.margin:
            return f"{self.label}, no noise band: {self.source}"
        low, high = max(self.threshold - self.margin, 0), self.threshold + self.margin
        return (f"{self.label} ± {units.size(self.margin)}, {units.size(low)} to {units.size(high)}: "
                f"{self.source}")

    def borderline(self, what: str) -> str:
        """The clause a borderline finding ends with."""
        return f"; borderline: {what} is inside the noise band of its threshold, {self.words()}"

    def beyond(self) -> str:
        """The clause a finding beyond the band ends with (nothing for exact bytes)."""
        return f"; beyond the noise band of its threshold, {self.words()}" if self.margin else ""

    def evidence(self) -> dict:
        return {"threshold": round(self.threshold), "margin": round(self.margin), "source": self.source}


def allocator_slack(record: RunRecord) -> tuple[int, str] | None:
    """What glibc may keep freed in its heaps or return, from one run to the next: threads x the
    trim threshold (twice the highest mmap threshold the live-tensor meter saw), where the record
    says the threshold was free to move; None where the record cannot say."""
    malloc, threads = record.environment.malloc, record.environment.threads
    seen = [s.live_tensors.allocator_threshold for s in record.stages
            if s.live_tensors is not None and s.live_tensors.allocator_threshold]
    if malloc is None or threshold_fixed(malloc) or not seen or not threads:
        return None
    slack = threads * 2 * max(seen)
    return slack, (f"glibc may keep up to {units.size(slack)} freed in its heaps or return it from one run "
                   f"to the next, {threads} threads x twice its {units.size(max(seen))} mmap threshold")


def rss_band(record: RunRecord, threshold: float, label: str) -> Band:
    """The band for a figure from RSS readings, or one compared with the peak RSS."""
    peak = record.peak.rss or 0
    measured = RSS_BAND * peak
    slack = allocator_slack(record)
    if slack is not None and slack[0] > measured:
        return Band(threshold, slack[0], label, slack[1])
    return Band(threshold, measured, label,
                f"{RSS_BAND:.0%} of the peak, the most RSS figures moved between identical runs "
                f"in {MEASURED_AT}")


def tensor_band(threshold: float, label: str) -> Band:
    return Band(threshold, 0, label, f"tensor bytes are exact, the same in identical runs in {MEASURED_AT}")
