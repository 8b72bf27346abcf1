"""A finding: what a rule detected in a run record, with its severity, words and evidence
(auditor.analysis.findings.rules runs the rules)."""
from __future__ import annotations

from dataclasses import dataclass, field

from auditor.analysis.findings.noise_band import BORDERLINE

SEVERITIES = ("high", "medium", "low", BORDERLINE)  # borderline: inside its threshold's noise band


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str            # "high" | "medium" | "low"
    statement: str           # one sentence, with its numbers
    evidence: dict = field(default_factory=dict)  # stage, component, bytes, ... (JSON-able)
    remedy: str = ""         # the change that removes it, in plain words ("" : the rule's)
    saving: dict | None = None  # {bytes, projected: [{target, bytes}], basis}; None: nothing to save
    validated: tuple = ()    # the record's validated_remedies that answer this finding
