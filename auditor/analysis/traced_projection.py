"""Traced projection: the run record of the same job traced on the target's fake tensors.

A traced run measures tensors exactly (census and live-tensor meter count fake storages at
their nominal size), transients inside stages included; what it cannot see is the process:
interpreter, libraries and allocator slack. Those are taken from the real run's stage of
the same path (RSS beyond its live-tensor peak), which does not grow with the model.

Data-dependent sizes (auditor.data_dependent) are estimates: each stage and component says how
many of its projected bytes rest on them (`estimated`, from the traced record's
`estimated_bytes`), and `data_dependent` lists every site with its ratio and where the ratio
came from (observed in the real run, declared by the program, or unknown: sized empty).

The result has the shape of `projection.project`'s, so a report shows both side by side.
"""
from __future__ import annotations


def project_traced(record: dict, traced_record: dict) -> dict:
    from auditor.analysis.projection import refusal
    refused = refusal(record, "traced", traced_record["workload"]["architecture"])
    if refused is not None:  # an algorithm that cannot be traced: its traced run holds no work
        return refused
    real = {s["path"]: s for s in record["stages"]}
    estimated = _estimated_by_stage(traced_record)
    stages, seen = [], {}
    for s in traced_record["stages"]:
        if s.get("status") != "open":
            n = seen[s["path"]] = seen.get(s["path"], -1) + 1
            stages.append(_stage(s, real.get(s["path"]), estimated.get((s["path"], n))))
    peak = max(stages, key=lambda s: s["rss_peak"], default=None)
    return {
        "method": "traced",
        "target": traced_record["workload"]["architecture"],
        "target_dtype": None,
        "run": traced_record.get("name"),
        "data_dependent_ops": (traced_record.get("traced") or {}).get("data_dependent_ops", {}),
        "data_dependent": data_dependent(traced_record),
        "stages": stages,
        "peak": {"stage": peak["path"], "rss": peak["rss_peak"], "live_tensors": peak["tensor_peak"],
                 "estimated": peak["estimated"]} if peak else None,
        "live_tensor_peak": max((s["tensor_peak"] for s in stages), default=None),
    }


def data_dependent(traced_record: dict) -> dict:
    """The traced run's data-dependent sites (ratio, source, calls) and how its estimated
    bytes were measured; `unknown`: the sites sized empty for want of any ratio."""
    from auditor.analysis.estimated_bytes import sites
    found = sites(traced_record)
    measured = traced_record.get("estimated_bytes") or {}
    return {"sites": found, "unknown": [s for s in found if s.get("source") == "unknown"],
            "method": measured.get("method")}


def _estimated_by_stage(traced_record: dict) -> dict:
    keyed, seen = {}, {}
    for stage in (traced_record.get("estimated_bytes") or {}).get("stages", []):
        n = seen[stage["path"]] = seen.get(stage["path"], -1) + 1
        keyed[(stage["path"], n)] = stage
    return keyed


def _stage(traced: dict, real: dict | None, estimated: dict | None = None) -> dict:
    real_components = (real or {}).get("components") or {}
    estimated_components = (estimated or {}).get("components") or {}
    components = {
        name: {"category": item["category"],
               "bytes": real_components.get(name, {}).get("bytes"),
               "projected": item["bytes"], "estimated": estimated_components.get(name, 0)}
        for name, item in (traced.get("components") or {}).items()
    }
    meter = traced.get("live_tensors") or {}
    tensor_peak = meter.get("peak", sum(c["projected"] for c in components.values()))
    beyond_tensors = _beyond_tensors(real) if real else 0
    return {"path": traced["path"], "components": components,
            "tensor_peak": tensor_peak, "rss_peak": tensor_peak + beyond_tensors,
            "beyond_tensors": beyond_tensors, "estimated": (estimated or {}).get("live_tensors", 0)}


def _beyond_tensors(real: dict) -> int:
    meter = real.get("live_tensors") or {}
    return max(real["rss"]["peak"] - meter.get("peak", 0), 0)
