"""Scaled projection: each component of an audited run, grown to a target architecture.

Every stage of the run is projected from its own readings:

    components at the stage end   x  the driver of their category (drivers.CATEGORY_DRIVER)
    tensors the census cannot see x  activations (autograd's saved tensors: meter minus census)
    transient inside the stage    x  parameters (peak minus end of the live-tensor meter)
    RSS beyond live tensors       x  constant (interpreter, libraries, allocator slack)

The transient rule is the assumption to watch: it holds where a stage's transients are
gradient-sized (GradProbe at short sequences) and under-counts where activations dominate
(long sequences). The traced projection measures transients instead of assuming them.
A run needs a `workload` field (architecture, overrides, tokens) to be projected.
"""
from __future__ import annotations

from auditor.analysis.drivers import CATEGORY_DRIVER, Shape, scale, shape_of

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
# Categories that follow the model's own dtype; the rest keep the algorithm's storage dtype.
MODEL_DTYPE_CATEGORIES = {"weights", "gradients"}


def audited_shape(record: dict) -> Shape:
    workload = record.get("workload")
    if not workload or "architecture" not in workload:
        raise ValueError(f"run {record.get('name')!r} has no workload field (architecture, "
                         "tokens): it cannot be projected")
    return shape_of(workload["architecture"], workload["tokens"], workload.get("overrides"))


def project(record: dict, target: str, target_dtype: str | None = None,
            target_tokens: int | None = None) -> dict:
    """The scaled projection of every stage of `record` to architecture `target`."""
    audited = audited_shape(record)
    shape = shape_of(target, target_tokens or audited.tokens)
    dtype_factor = _dtype_factor(record, target_dtype)
    stages = [_project_stage(s, audited, shape, dtype_factor) for s in record["stages"]
              if s.get("status") != "open"]
    peak = max(stages, key=lambda s: s["rss_peak"], default=None)
    return {
        "method": "scaled", "target": target, "target_dtype": target_dtype,
        "audited": vars(audited), "shape": vars(shape), "stages": stages,
        "peak": {"stage": peak["path"], "rss": peak["rss_peak"],
                 "live_tensors": peak["tensor_peak"]} if peak else None,
        "live_tensor_peak": max((s["tensor_peak"] for s in stages), default=None),
    }


def _dtype_factor(record: dict, target_dtype: str | None) -> float:
    if target_dtype is None:
        return 1.0
    audited = record["workload"].get("dtype", "float32")
    if target_dtype not in DTYPE_BYTES or audited not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {target_dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[target_dtype] / DTYPE_BYTES[audited]


def _project_stage(stage: dict, audited: Shape, target: Shape, dtype_factor: float) -> dict:
    components = {}
    for name, item in (stage.get("components") or {}).items():
        factor = scale(CATEGORY_DRIVER.get(item["category"], "parameters"), audited, target)
        if item["category"] in MODEL_DTYPE_CATEGORIES:
            factor *= dtype_factor
        components[name] = {"category": item["category"], "bytes": item["bytes"],
                            "projected": round(item["bytes"] * factor)}
    census = sum(c["bytes"] for c in components.values())
    meter = stage.get("live_tensors") or {}
    end = meter.get("end", census)
    unseen = max(end - census, 0)          # saved by autograd: no Python object to census
    transient = max(meter.get("peak", end) - end, 0)
    projected_end = (sum(c["projected"] for c in components.values())
                     + unseen * scale("activations", audited, target))
    tensor_peak = projected_end + transient * scale("parameters", audited, target)
    rss = stage["rss"]
    beyond_tensors = max(rss["peak"] - meter.get("peak", end), 0)
    return {
        "path": stage["path"], "components": components,
        "unseen_tensors": {"bytes": unseen, "projected": round(unseen * scale("activations", audited, target))},
        "transient": {"bytes": transient, "projected": round(transient * scale("parameters", audited, target))},
        "beyond_tensors": beyond_tensors,
        "tensor_peak": round(tensor_peak), "rss_peak": round(tensor_peak + beyond_tensors),
    }
