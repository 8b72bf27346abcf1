"""The training-step job: audit real training steps of a named architecture (or a local
checkpoint folder) and record what each component of the step holds.

    from auditor.jobs import train_step
    settings = train_step.Settings("tinystories-33m", sequence_length=512, precision="amp-bf16")
    record = train_step.audit(settings, "runs/step")          # in this process
    record = train_step.audit_in_fresh_process(settings, "runs/step")   # a clean process

Stages: `build model`, `forward only` (one micro-batch without autograd: what inference
needs), then `step K` holding `forward`/`backward` per micro-batch, `optimizer` and
`zero grad`. Components are measured from the objects themselves (unique storages of the
parameters, their .grad, the optimizer's state, what autograd saved) and also computed from
the config alone, so the record shows whether the two agree to the byte.
"""
from __future__ import annotations

import json
import sys
import warnings
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

import auditor
from architectures import activation_size
from auditor.capture.audit import Audit
from auditor.capture.probes.saved_tensors import SavedTensorLedger, decoder_layers
from auditor.jobs.optimizer_state import OPTIMIZERS
from auditor.jobs.settings import TrainStepSettings as Settings
from auditor.record.schema import RunRecord

# precision -> (weights dtype, autocast dtype or None), from the one list of precisions
PRECISIONS = {name: (getattr(torch, weights), getattr(torch, amp) if amp else None)
              for name, (weights, amp) in activation_size.PRECISIONS.items()}


def check_settings(settings: Settings):
    """ValueError (one line) for anything that cannot run; returns the model's config. The same
    checks as the command line's (architectures.options), which runs them before torch loads."""
    import architectures
    from architectures.options import at_least, check_sequence_length, positive_number
    for name, value in (("batch size", settings.batch_size), ("accumulation", settings.accumulation),
                        ("steps", settings.steps)):
        at_least(value, 1, name)
    if settings.optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {settings.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    if settings.precision not in PRECISIONS:
        raise ValueError(f"unknown precision {settings.precision!r}; known: {', '.join(PRECISIONS)}")
    positive_number(settings.learning_rate, "learning rate")
    config = architectures.make_config(settings.architecture, **settings.overrides)
    check_sequence_length(settings.architecture, settings.sequence_length, settings.overrides,
                          option="sequence length")
    check_device(settings.device, settings.precision)
    return config


def check_device(device: str, precision: str) -> None:
    from architectures.options import check_device as check_device_name
    check_device_name(device)
    kind = torch.device(device).type
    weights, amp = PRECISIONS[precision]
    if amp is None:
        return
    if not torch.amp.autocast_mode.is_autocast_available(kind):
        raise ValueError(f"{precision}: autocast is not available on {kind}")
    if kind == "cuda" and amp is torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ValueError(f"{precision}: this CUDA device does not support bfloat16")
    with warnings.catch_warnings(record=True) as caught:  # unsupported dtypes only warn
        warnings.simplefilter("always")
        with torch.autocast(kind, dtype=amp):
            pass
    if any("not supported" in str(w.message) for w in caught):
        raise ValueError(f"{precision}: autocast to {amp} is not supported on {kind}")


# -- what the components must be, from the config alone ----------------------------------

def expected_bytes(settings: Settings) -> dict:
    """Parameters, gradients and optimizer state computed from the architecture (no weights)."""
    import architectures
    sizes = architectures.parameter_sizes(settings.architecture, **settings.overrides)
    element = PRECISIONS[settings.precision][0].itemsize
    copies, scalars = OPTIMIZERS[settings.optimizer]
    parameters = element * sum(sizes)
    return {
        "parameter_count": sum(sizes), "parameter_tensors": len(sizes), "element_bytes": element,
        "parameters": parameters, "gradients": parameters,
        "optimizer_state": copies * parameters + 4 * scalars * len(sizes),
        "optimizer_rule": f"{copies} x parameters + {scalars} fp32 scalar per parameter tensor",
    }


# -- the audited program -------------------------------------------------------------------

def unique_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (tied weights and views once)."""
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()  # keyed with the device: AdamW's steps stay on CPU
            seen[storage.device, storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def make_optimizer(name: str, parameters, learning_rate: float):
    if name in ("adamw", "adam"):
        cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
        return cls(parameters, lr=learning_rate)
    return torch.optim.SGD(parameters, lr=learning_rate, momentum=0.9 if name == "sgd-momentum" else 0.0)


def micro_batch(settings: Settings, vocab: int, index: int) -> torch.Tensor:
    """Micro-batch `index` (0-based over the run): seeded synthetic token ids on the device."""
    generator = torch.Generator().manual_seed(settings.seed * 1_000_003 + index)
    shape = (settings.batch_size, settings.sequence_length)
    return torch.randint(0, vocab, shape, generator=generator).to(settings.device)


def run_workload(settings: Settings, run=None, on_step=None) -> dict:
    """Build, then train `steps` steps; returns the measured components (also annotated)."""
    import architectures
    weights, amp = PRECISIONS[settings.precision]
    kind = torch.device(settings.device).type
    autocast = (lambda: torch.autocast(kind, dtype=amp)) if amp is not None else nullcontext
    with auditor.stage("build model"):
        model = architectures.build_model(settings.architecture, seed=settings.seed, dtype=weights,
                                          device=settings.device, **settings.overrides)
        model.train()
        optimizer = make_optimizer(settings.optimizer, model.parameters(), settings.learning_rate)
        scaler = torch.amp.GradScaler(kind) if amp is torch.float16 else None
    from transformers import PreTrainedModel  # imported by the build: the stage above counted its import
    assert isinstance(model, PreTrainedModel)  # a causal LM: its config gives the vocabulary
    vocab = model.config.vocab_size
    with auditor.stage("forward only"), torch.no_grad(), autocast():
        model(input_ids=micro_batch(settings, vocab, 0))  # inference: nothing saved
    ledger = SavedTensorLedger(model, decoder_layers(model))
    measured: dict[str, Any] = {"saved_tensors": [], "parameters": unique_bytes(model.parameters()),
                                "buffers": unique_bytes(model.buffers())}
    many = settings.accumulation > 1
    for step in range(1, settings.steps + 1):
        with auditor.stage(f"step {step}"):
            for micro in range(1, settings.accumulation + 1):
                ids = micro_batch(settings, vocab, (step - 1) * settings.accumulation + micro - 1)
                suffix = f" {micro}" if many else ""
                with auditor.stage("forward" + suffix), ledger, autocast():
                    output = model(input_ids=ids, labels=ids)
                    loss = output.loss / settings.accumulation
                    del output  # the logits: the graph keeps what backward needs, nothing more
                measured["saved_tensors"].append(ledger.summary())
                with auditor.stage("backward" + suffix):
                    (scaler.scale(loss) if scaler else loss).backward()
                del loss
            if step == 1:
                measured["gradients"] = unique_bytes(p.grad for p in model.parameters())
            with auditor.stage("optimizer"):
                if scaler:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
            if step == 1:
                measured["optimizer_state"] = unique_bytes(
                    t for state in optimizer.state.values() for t in state.values())
                if run is not None:  # on disk now: a run killed later keeps its components
                    run.annotate("measured", _first_step(measured))
            with auditor.stage("zero grad"):
                optimizer.zero_grad(set_to_none=True)
            if on_step is not None:  # user code inside the step, e.g. logging (or a planted leak)
                on_step(step, model, ids)
    if run is not None:  # again, with every forward's saved-tensor total
        run.annotate("measured", _first_step(measured))
    return _first_step(measured)


def _first_step(measured: dict) -> dict:
    """Step 1's components; the saved-tensor totals of every forward, to show they repeat."""
    first = dict(measured)
    saved = measured["saved_tensors"]
    first["saved_tensors"] = saved[0] if saved else None
    first["saved_totals"] = [s["activations"] + s["autocast weight copies"] for s in saved]
    return first


def audit(settings: Settings, out, *, memray: bool = False, cuda_history: bool = False,
          on_step=None, on_stage_end=None, sweep_command: str | None = None) -> RunRecord:
    """Audit the training steps in this process; the run record (also `out/run.json`).
    `sweep_command`: the `auditor train-step` command line this run is one configuration of
    (kept in the workload, so the report made again from the records names it)."""
    config = check_settings(settings)
    with Audit(out=out, name=f"train-step {settings.label}", live_tensors=True, memray=memray,
               cuda_history=cuda_history, on_stage_end=on_stage_end) as run:
        run.annotate("workload", {**workload(settings, config), "sweep_command": sweep_command})
        run_workload(settings, run, on_step)
    return RunRecord.from_json(run.record, str(run.run_json))


def workload(settings: Settings, config) -> dict:
    from architectures.activation_size import residual_stream, saved_total
    kind = torch.device(settings.device).type
    shape = (config, settings.batch_size, settings.sequence_length, settings.precision)
    calculator: dict[str, Any]
    try:
        calculator = {"residual_stream": residual_stream(*shape), "saved": saved_total(*shape, kind)}
    except ValueError as error:  # a family or setting the calculator has no formula for
        calculator = {"unavailable": str(error)}
    return {"job": "train-step", "settings": asdict(settings), "expected": expected_bytes(settings),
            "config": {"model_type": config.model_type, "hidden_size": config.hidden_size,
                       "layers": config.num_hidden_layers, "vocab_size": config.vocab_size},
            "activation_calculator": calculator}


def audit_in_fresh_process(settings: Settings, out, *, memray: bool = False,
                           cuda_history: bool = False, timeout_s: int = 3600,
                           sweep_command: str | None = None) -> RunRecord:
    """The audit in a new Python process, so its peak RSS owes nothing to earlier work.

    A child that dies (out of memory, killed, timed out) still leaves its finished stages:
    the record is rebuilt from its event log and its `exit` says how the child ended
    ("killed by SIGKILL: out of memory?"). Ctrl-C raises fresh_process.Interrupted, whose
    `.child.record` holds what finished.
    """
    from auditor.capture.fresh_process import run_module
    options = json.dumps({"memray": memray, "cuda_history": cuda_history, "sweep_command": sweep_command})
    child = run_module("auditor.jobs.train_step", json.dumps(asdict(settings)), str(out), options,
                       run_folder=out, timeout_s=timeout_s)
    if child.record is None:
        raise RuntimeError(child.failure(f"training-step audit of {settings.label}"))
    return child.record


if __name__ == "__main__":  # python -m auditor.jobs.train_step SETTINGS OUT OPTIONS
    audit(Settings(**json.loads(sys.argv[1])), Path(sys.argv[2]), **json.loads(sys.argv[3]))
