"""auditor: stage-by-stage memory of any Python/PyTorch algorithm.

capture (this package's `stage`, `audit`, `probes/`, `targets`) -> run record (`record`:
events.jsonl and run.json) -> analysis -> renderers. Nothing here knows what is audited.

    import auditor
    with auditor.Audit(out="runs/x", memray=True, stage_targets=["m:Class.method"]) as audit:
        with auditor.stage("load"):
            ...
    record = auditor.load("runs/x")       # a RunRecord: record.stages[0].rss.peak, record.annotations
"""
from auditor.capture.audit import Audit, AuditorWarning
from auditor.capture.stage import active_audit, mark, stage, track
from auditor.capture.tracing.expected_fraction import expect_fraction
from auditor.record.run_folder import RunRecordError, load, rebuild
from auditor.record.schema import RunRecord

__all__ = ["Audit", "AuditorWarning", "RunRecord", "RunRecordError", "active_audit", "expect_fraction", "load",
           "mark", "rebuild", "stage", "track"]
