"""What a finding's remedy would save, here and at each projection target, and the measured
variants in the record that answer it (`validated_remedies`). A saving is an upper bound ("up
to"): the remedy removes what the evidence names, and whatever the algorithm still needs of it
comes back.
"""
from __future__ import annotations

from auditor.analysis.findings.finding import Finding
from auditor.analysis.projection.views import ProjectedStage, method_words, projection_views
from auditor.record.schema import RunRecord


def saving(finding: Finding, record: RunRecord) -> dict | None:
    """What the remedy would save: the evidence's bytes here and at each projection target.

    {bytes, projected: [{target, method, bytes | None, why?, withheld?}], basis}; None for rules
    whose remedy saves nothing in the algorithm's tensors (RSS beyond the census, the live-tensor
    gap, failures). `withheld`: a scaled projection the traced one does not bear out
    (ProjectionView.withheld): its figure is for the details, not the fixes table."""
    evidence = finding.evidence
    if finding.rule in ("full-copy", "dense-gradients", "reference-cycle"):
        names, here = [evidence["component"]], evidence["bytes"]
        stage = evidence.get("to_stage") or evidence.get("stage")
        if finding.rule == "reference-cycle":
            stage = evidence["stage"]
    elif finding.rule == "retained-at-end":
        names, stage, here = list(evidence["components"]), evidence["stage"], evidence["bytes"]
    elif finding.rule == "transient-spike":
        names, stage, here = None, evidence["stage"], evidence["transient"]
    else:
        return None
    if stage is None:
        return None
    projected = []
    for view in projection_views(record):
        at, why = view.stages.get(stage), None
        if view.failed is not None:  # a traced run that stopped part-way: no figure at the target
            value, why = None, f"the traced run {view.failed.plain}"
        elif at is None:
            value, why = None, f"the projection has no stage `{stage}`"
        elif names is None:  # a projection below what was measured here did not model this
            value = stage_transient(at)
            if value is None:
                why = "the projection does not model this stage's transient"
            elif value < here:
                value, why = None, ("at the target the projection's transient for this stage is smaller than "
                                    "what rose here: what rose here is not modeled there, so no saving is claimed")
        else:
            found = [at.components.get(n) for n in names]
            value = None if any(v is None for v in found) else sum(v for v in found if v is not None)
            if value is None:
                why = "the projection does not model " + ("these components" if len(names) > 1 else "this component")
        held = {"withheld": view.withheld} if view.withheld and value is not None else {}  # the details keep it
        projected.append({"target": view.target, "method": method_words(view), "bytes": value,
                          **({"why": why} if why else {}), **held})
    basis = ("the transient inside the stage" if names is None else
             f"the evidence's components at stage `{stage}`")
    return {"bytes": here, "projected": projected, "basis": basis}


def stage_transient(at: ProjectedStage) -> int | None:
    """A projected stage's transient: its own figure, else (a traced run measures no transient
    apart) its live-tensor peak above its census and unseen tensors at the end."""
    if at.transient is not None or "transient" in at.unexplained or "peak" in at.unexplained:
        return at.transient  # a figure its drivers do not explain stays None
    if at.tensor_peak is None or not at.components or any(v is None for v in at.components.values()):
        return None
    end = sum(v for v in at.components.values() if v is not None) + (at.unseen or 0)
    return at.tensor_peak - end if at.tensor_peak >= end else None


def validated(finding: Finding, record: RunRecord) -> tuple:
    """The record's validated remedies that answer this finding: one of their components is
    in its evidence (and its rule among theirs, when they name rules), or, naming no
    components, its rule is among theirs."""
    named = set()
    for key in ("component", "components", "growers"):
        value = finding.evidence.get(key)
        named |= {value} if isinstance(value, str) else set(value or ())
    found = []
    for item in record.annotations.get("validated_remedies") or []:
        if not isinstance(item, dict) or not item.get("variant"):
            continue
        components, rules = set(item.get("components") or ()), set(item.get("rules") or ())
        answers = (named & components if components else bool(rules)) and (not rules or finding.rule in rules)
        if answers:
            found.append(item)
    return tuple(found)
