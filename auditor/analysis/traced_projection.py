"""Traced projection: the run record of the same job traced on the target's fake tensors.

A traced run measures tensors exactly (census and live-tensor meter count fake storages at
their nominal size), transients inside stages included; what it cannot see is the process:
interpreter, libraries and allocator slack. Those are taken from the real run's stage of
the same path (RSS beyond its live-tensor peak), which does not grow with the model.

The result has the shape of `projection.project`'s, so a report shows both side by side.
"""
from __future__ import annotations


def project_traced(record: dict, traced_record: dict) -> dict:
    from auditor.analysis.projection import refusal
    refused = refusal(record, "traced", traced_record["workload"]["architecture"])
    if refused is not None:  # an algorithm that cannot be traced: its traced run holds no work
        return refused
    real = {s["path"]: s for s in record["stages"]}
    stages = [_stage(s, real.get(s["path"])) for s in traced_record["stages"]
              if s.get("status") != "open"]
    peak = max(stages, key=lambda s: s["rss_peak"], default=None)
    return {
        "method": "traced",
        "target": traced_record["workload"]["architecture"],
        "target_dtype": None,
        "run": traced_record.get("name"),
        "data_dependent_ops": (traced_record.get("traced") or {}).get("data_dependent_ops", {}),
        "stages": stages,
        "peak": {"stage": peak["path"], "rss": peak["rss_peak"],
                 "live_tensors": peak["tensor_peak"]} if peak else None,
        "live_tensor_peak": max((s["tensor_peak"] for s in stages), default=None),
    }


def _stage(traced: dict, real: dict | None) -> dict:
    real_components = (real or {}).get("components") or {}
    components = {
        name: {"category": item["category"],
               "bytes": real_components.get(name, {}).get("bytes"),
               "projected": item["bytes"]}
        for name, item in (traced.get("components") or {}).items()
    }
    meter = traced.get("live_tensors") or {}
    tensor_peak = meter.get("peak", sum(c["projected"] for c in components.values()))
    beyond_tensors = _beyond_tensors(real) if real else 0
    return {"path": traced["path"], "components": components,
            "tensor_peak": tensor_peak, "rss_peak": tensor_peak + beyond_tensors,
            "beyond_tensors": beyond_tensors}


def _beyond_tensors(real: dict) -> int:
    meter = real.get("live_tensors") or {}
    return max(real["rss"]["peak"] - meter.get("peak", 0), 0)
