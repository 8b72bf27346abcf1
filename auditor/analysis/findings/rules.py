"""Findings: what a run record shows, detected by rules with stated thresholds.

    for finding in findings(record):
        finding.severity, finding.statement, finding.evidence

Each rule is a pure function of the record; none is written by hand for a particular run.
`RULES` lists them with their thresholds (the report prints them); `evaluate` says for each
what it found, or why it could not be checked (a probe absent).

"Weights" are the parameters at each stage's census (see `auditor.analysis.run.attribution`);
"peak" is the run's peak RSS.

Each rule also says how to remove what it found (`Rule.remedy`, in plain words; a finding may
word it for its evidence) and what that would save (`Finding.saving`): the bytes of the
evidence at the audited scale and, where the record has projections, the same components'
projected bytes at each target. A saving is an upper bound ("up to"): the remedy removes what
the evidence names, and whatever the algorithm still needs of it comes back. Where the job
that ran the algorithm put measured variants in the record (`validated_remedies`), the
findings they answer cite them (`Finding.validated`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from auditor.analysis.findings.child_processes import CHILD_HIGH, CHILD_SHARE, child_memory
from auditor.analysis.findings.component_rules import (
    CYCLES,
    DENSE_GRADIENT_RATIO,
    FULL_COPY_MIN_STAGES,
    FULL_COPY_RATIO,
    PARTIAL_COPY_SHARE,
    RETAINED_RATIO,
    dense_gradients,
    full_copies,
    reference_cycles,
    retained,
)
from auditor.analysis.findings.finding import SEVERITIES, Finding
from auditor.analysis.findings.noise_band import RSS_BAND
from auditor.analysis.findings.program_kind import Kind, program_kind
from auditor.analysis.findings.remedies import GENERIC, TEMPORARIES, remedy
from auditor.analysis.findings.rss_rules import (
    RETENTION_SHARE,
    TENSOR_GAP_SHARE,
    UNTRACKED_SHARE,
    tensor_gap,
    untracked,
)
from auditor.analysis.findings.savings import saving, stage_transient, validated
from auditor.analysis.findings.stage_rules import TRANSIENT_SHARE, failures, transients
from auditor.analysis.run.live_tensor_peak import live_tensor_peak
from auditor.analysis.run.stages import census_order, is_traced, peak_stage
from auditor.record.schema import RunRecord

__all__ = ["SEVERITIES", "Finding", "Rule", "Outcome", "RULES", "REMEDIES", "evaluate", "findings", "ordered",
           "saving", "stage_transient", "RETENTION_SHARE", "TENSOR_GAP_SHARE", "UNTRACKED_SHARE",
           "TRANSIENT_SHARE"]
# the rules themselves: component_rules (a, b, d, h), stage_rules (c, g), rss_rules (e, f),
# child_processes; what a remedy saves: savings


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    threshold: str
    needs: tuple[str, ...]   # inputs: "census", "peak census", "live_tensors", "real rss"
    check: Callable[[RunRecord], list[Finding]]
    remedy: str = ""         # the change that removes what the rule finds, in plain words


@dataclass(frozen=True)
class Outcome:
    rule: Rule
    findings: tuple[Finding, ...]
    not_checked: str | None  # why the rule could not be checked (an input absent), else None


def evaluate(record: RunRecord) -> list[Outcome]:
    """Every rule applied to the record: what it found, or why it could not be checked."""
    outcomes = []
    kind = program_kind(record).kind  # the remedies' words, the same for every finding
    for rule in RULES:
        why = missing_input(record, rule)
        found = () if why else tuple(_with_remedy(f, rule, record, kind) for f in rule.check(record))
        outcomes.append(Outcome(rule, found, why))
    return outcomes


def findings(record: RunRecord) -> list[Finding]:
    """Every finding the rules detect in the record, most severe first (rule order within)."""
    return ordered([f for outcome in evaluate(record) for f in outcome.findings])


def ordered(found: list[Finding]) -> list[Finding]:
    return sorted(found, key=lambda f: SEVERITIES.index(f.severity))


def missing_input(record: RunRecord, rule: Rule) -> str | None:
    if "real rss" in rule.needs and is_traced(record):
        return "a traced run on fake tensors: its RSS is the tracing process's, not the workload's"
    if "census" in rule.needs and not census_order(record):
        return "no stage carries a tensor census (run with census on)"
    if "peak census" in rule.needs:
        holder = peak_stage(record)
        if holder is None or holder.components is None:
            return "the stage holding the peak has no census"
    if "live_tensors" in rule.needs and live_tensor_peak(record) is None:
        return "no live-tensor meter in this record"
    return None


# -- remedies and what they save ---------------------------------------------------------

REMEDIES = GENERIC  # each rule's remedy where the record cannot tell the program's kind


def _with_remedy(finding: Finding, rule: Rule, record: RunRecord, kind: Kind) -> Finding:
    text = finding.remedy or _remedy_words(finding, kind, record) or rule.remedy
    return Finding(finding.rule, finding.severity, finding.statement, finding.evidence, text,
                   saving(finding, record), validated(finding, record))


def _remedy_words(finding: Finding, kind: Kind, record: RunRecord) -> str | None:
    """A rule's remedy worded for the program's kind and its evidence (`auditor.analysis.findings.remedies`)."""
    category = finding.evidence.get("category")
    if finding.rule == "retained-at-end":  # the category of the most it retains
        held = finding.evidence.get("components") or {}
        stage = next((s for s in census_order(record) if s.path == finding.evidence.get("stage")), None)
        if held and stage is not None and stage.components:
            largest = max(held, key=lambda n: (stage.components[n].bytes if n in stage.components else 0))
            category = stage.components[largest].category if largest in stage.components else None
    if finding.rule == "transient-spike":
        grown = finding.evidence.get("growers") or {}
        category = TEMPORARIES if grown and next(iter(grown)).startswith("temporaries from") else None
    return remedy(finding.rule, kind, category)


_EXACT = " (tensor bytes: exact, no noise band)"
_RSS_NOISE = (f"; within ± the larger of {RSS_BAND:.0%} of the peak (measured over identical runs) and "
              "what glibc may keep between runs: borderline")

RULES: tuple[Rule, ...] = (
    Rule("full-copy", "A component holds a copy of the weights",
         f"made by copying the weights (the live-tensor meter's provenance) and holding >= "
         f"{FULL_COPY_RATIO:.0%} of their bytes (high) or >= {PARTIAL_COPY_SHARE:.0%} (medium) at a "
         f"stage end; without the meter, by size only: bytes >= {FULL_COPY_RATIO:.0%} of the weights at "
         f">= {FULL_COPY_MIN_STAGES} consecutive stage ends (categories other than weights, gradients, "
         "gradient records)" + _EXACT,
         ("census",), full_copies, REMEDIES["full-copy"]),
    Rule("dense-gradients", "Dense gradients or gradient records for the whole model",
         f"a gradients / gradient records component >= {DENSE_GRADIENT_RATIO:.0%} of the weights "
         "at a stage end" + _EXACT, ("census",), dense_gradients, REMEDIES["dense-gradients"]),
    Rule("transient-spike", "Transient spike inside a stage",
         f"peak inside - max(start, end) > {TRANSIENT_SHARE:.0%} of the run's peak RSS "
         "(reported at the deepest stage holding it; high when it holds the run's peak)" + _RSS_NOISE,
         ("real rss",), transients, REMEDIES["transient-spike"]),
    Rule("retained-at-end", "Memory retained after the algorithm returns",
         f"tensors other than weights at the last stage end >= {RETAINED_RATIO:.0%} of the weights "
         "(the most any census saw, exact; of the peak RSS when no census saw weights" + _RSS_NOISE + ")",
         ("census",), retained, REMEDIES["retained-at-end"]),
    Rule("reference-cycle", "Tensors kept alive only by a reference cycle",
         f"`{CYCLES}` present at a stage end (the census checks unowned storages of 1 MiB or more)",
         ("census",), reference_cycles, REMEDIES["reference-cycle"]),
    Rule("untracked-rss", "RSS beyond the census",
         f"RSS at the end of the peak stage minus its census > {UNTRACKED_SHARE:.0%} of the peak" + _RSS_NOISE,
         ("census", "peak census", "real rss"), untracked, REMEDIES["untracked-rss"]),
    Rule("rss-above-live-tensors", "Peak RSS above the live-tensor peak",
         f"peak RSS - live-tensor peak > {TENSOR_GAP_SHARE:.0%} of the peak" + _RSS_NOISE,
         ("live_tensors", "real rss"), tensor_gap, REMEDIES["rss-above-live-tensors"]),
    Rule("child-memory", "Child processes held memory of their own",
         f"the children's own memory (USS; RSS where USS is not readable) at a top-level stage end or the run's "
         f"end >= {CHILD_SHARE:.0%} of this process's peak RSS (high: >= {CHILD_HIGH:.0%})",
         ("real rss",), child_memory, REMEDIES["child-memory"]),
    Rule("failed-stage", "Failed or unfinished stages", "any stage failed or open, or the run "
         "did not end ok", (), failures, REMEDIES["failed-stage"]),
)
