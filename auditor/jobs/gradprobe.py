"""The main job: audit this project's GradProbe on a named architecture.

This is the only place in `auditor/` that knows GradProbe: which of its methods are phases
(staged from outside, its source untouched), which of its attributes are which kind of
memory (both read from each pruner class's own declarations, `phases` and `state_categories`,
with the pruners it runs inside its `prune`, `inner_pruners`), and what the algorithm's state
needs at the least. Everything else is the generic
auditor: the same `Audit` runs the job for real on this machine and traced (fake tensors)
for a 7B target in a subprocess.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

import auditor
from auditor.capture.audit import Audit
from auditor.facts import safe_files
from auditor.jobs.settings import GradProbeSettings as Settings
from auditor.record.schema import RunRecord

# What each measured variant removes, in the census's component names: a finding whose
# evidence names one of them cites the variant and the saving its comparison measured
# (auditor.analysis.findings.rules reads `validated_remedies`; it knows nothing of GradProbe).
VARIANT_REMEDIES = {
    "sparse-state": ("keeps only the candidates' original values, G0 and G1 at the candidates, "
                     "the candidates as a bitmask",
                     ("pruner.saved_state", "pruner.candidate_originals", "pruner.gradients_original",
                      "pruner.gradients_reduced", "pruner.candidates"), ()),
    "grad-in-backward": ("consumes each gradient in backward and drops `.grad` at once; G0 and G1 "
                         "at the candidates", ("model.grad", "pruner.gradients_original",
                                               "pruner.gradients_reduced"), ()),
    "checkpointed": ("decoder layers recompute their activations in backward", (), ("transient-spike",)),
    "lean": ("sparse-state + grad-in-backward + checkpointed, and the head's and token embedding's "
             "gradients folded in by rows (no vocabulary-sized gradient); final masks kept as bits",
             ("pruner.saved_state", "pruner.candidate_originals", "pruner.gradients_original",
              "pruner.gradients_reduced", "pruner.candidates", "model.grad"), ()),
}
REPORTS = Path(__file__).resolve().parents[2] / "reports"


def pruner_class(variant: str) -> type:
    from gradprobe.variants import VARIANTS
    factory = VARIANTS[variant]
    found: object = getattr(factory, "func", factory)  # presets are partials of the class
    if not isinstance(found, type):
        raise TypeError(f"variant {variant!r} is made by {found!r}, not by a pruner class")
    return found


def folder_pruner(variant: str) -> type | None:
    """The pruner the job audits on a weights folder instead of the variant's in-memory wrapper
    (its class's `folder_pruner`: streaming, whose memory floor needs the model off memory)."""
    return getattr(pruner_class(variant), "folder_pruner", None)


def audited_class(variant: str) -> type:
    """The pruner class whose run the job audits: the folder pruner where there is one."""
    return folder_pruner(variant) or pruner_class(variant)


def phase_classes(variant: str) -> list[type]:
    """The audited pruner class, then the pruners it runs inside its `prune` (`inner_pruners`)."""
    found, pending = [], [audited_class(variant)]
    while pending:
        cls = pending.pop(0)
        if cls not in found:
            found.append(cls)
            pending.extend(getattr(cls, "inner_pruners", ()))
    return found


def stage_targets(variant: str) -> list[str]:
    """The declared phases (`phases`) of the variant's pruner classes, as `module:Class.method` targets."""
    targets = []
    for cls in phase_classes(variant):
        for phase in getattr(cls, "phases", ()):
            if not callable(getattr(cls, phase, None)):
                raise ValueError(f"{cls.__qualname__} declares a phase {phase!r} it has no method for")
            targets.append(f"{cls.__module__}:{cls.__qualname__}.{phase}")
    return targets


def pruner_categories(variant: str) -> dict[str, str]:
    """What the pruner's attributes are, in the report's words (`state_categories`; the census
    walks them by name)."""
    return dict(getattr(audited_class(variant), "state_categories", {}))


def phase_label(variant: str):
    """`Audit(stage_label=...)` from the pruner classes' own `phase_label`, if any declares one."""
    labels = [cls.phase_label for cls in phase_classes(variant) if hasattr(cls, "phase_label")]
    if not labels:
        return None

    def label(target: str, args: tuple, kwargs: dict) -> str | None:
        return next((found for found in (f(target, args, kwargs) for f in labels) if found), None)
    return label


def not_projected(variant: str) -> str | None:
    """Why the variant cannot be projected (its class's `not_projected`), or None."""
    return getattr(audited_class(variant), "not_projected", None)


def run_workload(settings: Settings, digest: bool = False) -> dict:
    """Build, calibrate, prune: the audited program. Returns the pruning result's numbers (with
    the masks' digest if `digest`)."""
    import architectures
    from architectures.calibration import synthetic_batches
    from gradprobe.variants import make_pruner

    if folder_pruner(settings.variant):
        return run_on_folder(settings, digest)
    with auditor.stage("build model"):
        model = architectures.build_model(settings.architecture, seed=settings.seed,
                                          device=settings.device, **settings.overrides)
    from transformers import PreTrainedModel  # imported by the build: the stage above counted its import
    assert isinstance(model, PreTrainedModel)  # a causal LM: its config gives the vocabulary
    auditor.track("model", model)
    batches = synthetic_batches(model.config.vocab_size, settings.sequence_length,
                                settings.batch_size, settings.batches, seed=settings.seed)
    pruner = make_pruner(settings.variant, model, settings.strategy)
    auditor.track("pruner", pruner, categories=pruner_categories(settings.variant))
    with auditor.stage("prune"):
        result = pruner.prune(batches, sparsity=settings.sparsity, num_batches=settings.batches,
                              reduction_factor=settings.reduction,
                              gradient_threshold=settings.threshold)
    return result_numbers(result, digest)


def result_numbers(result, digest: bool = False) -> dict:
    """What the record keeps of a pruning result (in memory or from a folder); `digest`: also
    gradprobe's mask digest, so runs on two devices can say whether their masks agree (a traced
    run has no bits to digest)."""
    numbers = {"candidates": result.candidates, "pruned": result.pruned,
               "prunable": result.prunable, "sparsity": result.sparsity}
    if digest:
        from gradprobe.masks import mask_digest
        numbers["mask_digest"] = mask_digest(result.masks)
    return numbers


def run_on_folder(settings: Settings, digest: bool = False) -> dict:
    """The folder pruner's run, as its own command line runs it: on the checkpoint folder itself
    (`--arch FOLDER` with safetensors weights, only read), or on random weights for the
    architecture written tensor by tensor in `weights_dtype` (no process holds the model, as a 7B
    run writes them), pruned a stage at a time. Traced, the files are laid out but hold no bytes."""
    import tempfile

    import architectures
    from architectures.calibration import synthetic_batches

    with tempfile.TemporaryDirectory(prefix="gradprobe-weights-") as scratch:
        config = architectures.make_config(settings.architecture, **settings.overrides)
        weights = _weights_folder(settings, config, f"{scratch}/weights")
        pruner_type = folder_pruner(settings.variant)
        if pruner_type is None:
            raise ValueError(f"variant {settings.variant!r} prunes no weights folder")
        pruner = pruner_type(weights, settings.strategy)
        batches = synthetic_batches(config.vocab_size, settings.sequence_length, settings.batch_size,
                                    settings.batches, seed=settings.seed)
        auditor.track("pruner", pruner, categories=pruner_categories(settings.variant))
        with auditor.stage("prune"):
            result = pruner.prune(batches, f"{scratch}/pruned", sparsity=settings.sparsity,
                                  num_batches=settings.batches, reduction_factor=settings.reduction,
                                  gradient_threshold=settings.threshold)
        return result_numbers(result, digest)


def _weights_folder(settings: Settings, config, scratch: str) -> str:
    import glob

    import architectures
    from gradprobe.streaming.writing import generate_random_weights
    folder = settings.architecture
    if architectures.is_checkpoint_folder(folder) and glob.glob(f"{folder}/*.safetensors") and not settings.overrides:
        return folder
    with auditor.stage("write weights folder"):
        generate_random_weights(config, scratch, seed=settings.seed, dtype=getattr(torch, settings.weights_dtype))
    return scratch


def audit(settings: Settings, out: Path, *, memray: bool = False, fake: bool = False,
          on_stage_end=None, observed_sizes: list | None = None, estimate_sizes: bool = True,
          record_sizes: bool = True) -> RunRecord:
    """Audit one run of the job; returns the run record (also `out/run.json`). A real run
    records its data-dependent sizes (`record_sizes`); a traced one sizes them by
    `observed_sizes` (a real run's), or makes them empty with `estimate_sizes=False`
    (auditor.capture.tracing.data_dependent)."""
    name = f"gradprobe-{settings.variant}-{settings.architecture}" + ("-traced" if fake else "")
    remedies = [] if fake else validated_remedies(settings)  # read before: in no stage's time
    refused = not_projected(settings.variant)
    untraceable = fake and refused is not None  # not run on fake tensors: nothing to stage
    with Audit(out=out, name=name, census=True, live_tensors=True, memray=memray, traced=fake,
               stage_targets=[] if untraceable else stage_targets(settings.variant), on_stage_end=on_stage_end,
               stage_label=phase_label(settings.variant), record_sizes=record_sizes and not fake,
               observed_sizes=observed_sizes, estimate_sizes=estimate_sizes) as run:
        run.annotate("workload", workload(settings))
        if refused:  # the projections read it and print it instead of numbers
            run.annotate("not_projected", refused)
        if not untraceable:
            result = run_workload(settings, digest=not fake)
            run.annotate("result", result)
            run.annotate("minimum", minimum(settings, result["prunable"]))
            if remedies:
                run.annotate("validated_remedies", remedies)
    return RunRecord.from_json(run.record, str(run.run_json))


def validated_remedies(settings: Settings, reports: Path = REPORTS) -> list[dict]:
    """The variants a committed comparison measured against this run's variant, on the same
    model (architecture and parameter count), each with the components it removes: the
    record's `validated_remedies`. Empty when no such comparison exists."""
    from auditor.comparison.record import Comparison, ComparisonRecordError
    path = reports / f"compare-{settings.architecture}.json"
    if not path.is_file():
        return []
    try:
        comparison = Comparison.load(path)
        summary = comparison.summary
    except (ComparisonRecordError, KeyError, TypeError, ValueError):
        return []  # a comparison this version cannot read validates nothing
    if summary["baseline"] != settings.variant or not _same_model(comparison.record, settings):
        return []
    source = path.relative_to(reports.parent).as_posix() if reports.parent in path.parents else path.name
    found = []
    for variant in summary["variants"]:
        if variant["name"] not in VARIANT_REMEDIES:
            continue
        what, components, rules = VARIANT_REMEDIES[variant["name"]]
        found.append({"variant": variant["name"], "what": what, "components": list(components),
                      "rules": list(rules), "peak_saving": variant["peak_saving"],
                      "claims_saving": variant["claims_saving"],
                      "agreement": variant["agreement"]["status"],
                      "runs": summary["sides"][variant["name"]]["runs"],
                      "architecture": settings.architecture, "source": source})
    return found


def _same_model(comparison: dict, settings: Settings) -> bool:
    """Whether every run of the comparison pruned the model this run prunes."""
    import architectures
    parameters = architectures.count_parameters(settings.architecture, **settings.overrides)
    reported = [(run.get("reported") or {}).get("gradprobe") or {} for run in comparison["runs"]]
    return bool(reported) and all(r.get("architecture") == settings.architecture
                                  and r.get("parameters") == parameters for r in reported)


def workload(settings: Settings) -> dict:
    return {"architecture": settings.architecture, "overrides": settings.overrides,
            "tokens": settings.tokens, "dtype": "float32", "settings": asdict(settings)}


def minimum(settings: Settings, prunable: int) -> dict:
    """The least the decision needs to hold, per the spec's memory floor (fp32 storage).

    Activations are left out: they depend on checkpointing and are measured, not declared.
    """
    import architectures
    parameters = architectures.count_parameters(settings.architecture, **settings.overrides)
    candidates = round(settings.sparsity * prunable)
    items = [
        {"name": "model weights", "bytes": 4 * parameters, "why": "the model itself, fp32"},
        {"name": "candidates' original values", "bytes": 4 * candidates,
         "why": "to restore the candidates that are kept"},
        {"name": "G0 at candidates", "bytes": 4 * candidates,
         "why": "baseline max |grad|, only where a decision is made"},
        {"name": "G1 running max at candidates", "bytes": 4 * candidates,
         "why": "max over batches on the reduced model"},
        {"name": "candidate bitmask", "bytes": (prunable + 7) // 8, "why": "1 bit per prunable weight"},
    ]
    return {"items": items, "total": sum(i["bytes"] for i in items),
            "note": "algorithm state only; activations and one tensor's gradient at a time come on top"}


ESTIMATED_BYTES = "estimated_bytes.json"  # beside a traced run's run.json: the bytes resting on estimates


def traced_audit(settings: Settings, out: Path, timeout_s: int = 1800,
                 observed_sizes: list | None = None) -> RunRecord:
    """The job traced on fake tensors in a fresh process (a 7B model fits: nothing is allocated),
    its data-dependent sizes estimated from `observed_sizes` (the real run's). Where estimates
    were used, traced again with them empty (`out/lower-bound`) to measure the bytes that rest
    on them: the record's `estimated_bytes` (auditor.analysis.projection.estimated_bytes)."""
    from auditor.analysis.projection.estimated_bytes import estimated_bytes, has_estimates
    record = _traced_child(settings, Path(out), timeout_s, observed_sizes)
    if has_estimates(record):
        lower = _traced_child(settings, Path(out) / "lower-bound", timeout_s, None, estimate=False)
        record.annotations["estimated_bytes"] = estimated_bytes(record, lower)
        safe_files.write_text(Path(out) / ESTIMATED_BYTES, json.dumps(record.annotations["estimated_bytes"], indent=1))
    return record


def load_traced(out: Path) -> RunRecord:
    """The record `traced_audit` left in `out`, with its `estimated_bytes` where it had estimates."""
    path = Path(out) / "run.json"
    record = RunRecord.from_json(json.loads(path.read_text()), str(path))
    if (Path(out) / ESTIMATED_BYTES).is_file():
        record.annotations["estimated_bytes"] = json.loads((Path(out) / ESTIMATED_BYTES).read_text())
    return record


def _traced_child(settings: Settings, out: Path, timeout_s: int, observed_sizes: list | None,
                  estimate: bool = True) -> RunRecord:
    from auditor.capture.fresh_process import run_module
    sizes = Path(out).with_name(Path(out).name + "-sizes.json")  # beside: the run folder is the child's
    sizes.parent.mkdir(parents=True, exist_ok=True)
    safe_files.write_text(sizes, json.dumps({"observed": observed_sizes, "estimate": estimate}))
    child = run_module("auditor.jobs.gradprobe", json.dumps(asdict(settings)), str(out), str(sizes),
                       run_folder=out, timeout_s=timeout_s)
    if not child.ok or child.record is None:
        raise RuntimeError(child.failure(f"traced run for {settings.architecture}"))
    return child.record


def _traced_main(argv: list[str]) -> None:
    """python -m auditor.jobs.gradprobe SETTINGS OUT [SIZES_JSON]: one traced run."""
    torch.set_num_threads(1)
    sizes = json.loads(Path(argv[2]).read_text()) if len(argv) > 2 else {}
    audit(Settings(**json.loads(argv[0])), Path(argv[1]), fake=True,
          observed_sizes=sizes.get("observed"), estimate_sizes=sizes.get("estimate", True))


if __name__ == "__main__":  # the traced subprocess
    _traced_main(sys.argv[1:])
