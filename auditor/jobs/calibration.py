"""Calibration runs: the main job traced at perturbed small shapes, for the scaled projection's fit.

One audited run cannot tell a transient that grows with the embedding from one that grows
with every parameter: both change together when the model does. Traced runs of the same job
at shapes that differ from the audited one in one size at a time (layers x2, hidden x2,
vocab /2, heads x2, intermediate x2, and sequence x2 when the target's token count differs)
can, and tracing a small model takes seconds. They run on fake tensors in one fresh process;
only their stages' tensor readings are kept (`compact`), stored in the record's
`calibration` field for `auditor.analysis.projection.scaled` to fit.

    runs = calibrate(settings, folder / "calibration")           # or target=Settings(...)
    record.annotations["calibration"] = runs
    project(record, "mistral-7b")
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import architectures
from auditor.capture.fresh_process import run_module
from auditor.facts import safe_files
from auditor.jobs.gradprobe import Settings
from auditor.record.schema import RunRecord

SIZES_FILE = "observed-sizes.json"  # the audited run's data-dependent sizes, for the traced runs


def perturbations(settings: Settings, target: Settings | None = None) -> list[tuple[str, Settings]]:
    """(label, settings) of each calibration run: the audited settings with one size changed.

    Every size is perturbed, also those the target shares with the audited run: a driver that
    does not move between the two still has to be told apart from one that does (a tied
    embedding's gradient from the logits, say, both vocab-sized). The sequence is perturbed
    only when the `target`'s token count differs.
    """
    config = architectures.make_config(settings.architecture, **settings.overrides)
    sizes = _sizes(config)
    heads, hidden = sizes["heads"], sizes["hidden"]
    changes = [("layers x2", {"layers": sizes["layers"] * 2}),
               ("hidden x2", {"hidden": hidden * 2}),
               ("vocab /2", {"vocab": max(sizes["vocab"] // 2, 2)})]
    if hidden % (heads * 2) == 0:
        changes.append(("heads x2", {"heads": heads * 2}))
    elif heads % 2 == 0 and _heads_ok(config, heads // 2):
        changes.append(("heads /2", {"heads": heads // 2}))
    if getattr(config, "intermediate_size", None):
        changes.append(("intermediate x2", {"intermediate": config.intermediate_size * 2}))
    runs = [(label, replace(settings, overrides={**settings.overrides, **change}))
            for label, change in changes]
    if target is not None and target.tokens != settings.tokens:
        runs.append(("sequence x2", replace(settings, sequence_length=settings.sequence_length * 2)))
    return [(label, s) for label, s in runs if _buildable(s)]


def _sizes(config) -> dict:
    return {"layers": getattr(config, "num_hidden_layers", None) or config.num_layers,
            "hidden": config.hidden_size, "vocab": config.vocab_size,
            "heads": config.num_attention_heads}


def _heads_ok(config, heads: int) -> bool:
    kv = getattr(config, "num_key_value_heads", None)
    return kv is None or heads % min(kv, heads) == 0


def _buildable(settings: Settings) -> bool:
    try:
        architectures.make_config(settings.architecture, **settings.overrides)
    except ValueError:
        return False
    return True


def calibrate(settings: Settings, folder: Path, target: Settings | None = None,
              timeout_s: int = 900, observed_sizes: list | None = None) -> list[dict]:
    """Trace every perturbation (`perturbations`) in one fresh process; their compact records.
    `observed_sizes`: the audited run's `data_dependent_sizes`, which size the traced runs'
    data-dependent outputs (auditor.capture.tracing.data_dependent) as they sized the target's."""
    folder = Path(folder)
    plan = [(label, asdict(s)) for label, s in perturbations(settings, target)]
    if not plan:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    safe_files.write_text(folder / SIZES_FILE, json.dumps(observed_sizes))
    child = run_module("auditor.jobs.calibration", json.dumps(plan), str(folder), timeout_s=timeout_s)
    if not child.ok:
        raise RuntimeError(child.failure(f"calibration runs for {settings.architecture}"))
    return [json.loads((folder / _slug(label) / "compact.json").read_text()) for label, _ in plan]


def compact(record: RunRecord, label: str) -> dict:
    """What a fit needs of a traced run (JSON, as `calibration` keeps it): its workload, each
    stage's tensor readings and the data-dependent sizes it estimated."""
    keep = ("path", "parent", "status", "live_tensors", "components")
    return {"label": label, "name": record.name, "workload": record.annotations.get("workload"),
            "stages": [{k: stage.get(k) for k in keep} for stage in (s.to_json() for s in record.stages)],
            "estimated_sizes": (record.annotations.get("traced") or {}).get("estimated_sizes", [])}


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label)


def _main(plan: list, folder: Path) -> None:
    import gc

    import torch

    from auditor.jobs.gradprobe import audit
    torch.set_num_threads(1)
    sizes_file = folder / SIZES_FILE
    observed = json.loads(sizes_file.read_text()) if sizes_file.is_file() else None
    for label, settings in plan:
        out = folder / _slug(label)
        record = audit(Settings(**settings), out, fake=True, observed_sizes=observed)
        safe_files.write_text(out / "compact.json", json.dumps(compact(record, label)))
        del record
        gc.collect()


if __name__ == "__main__":  # python -m auditor.jobs.calibration PLAN_JSON FOLDER
    _main(json.loads(sys.argv[1]), Path(sys.argv[2]))
