"""The function that builds the audited program's model (`--model-from lib:get_llm`): observed
in the real run, replaced by the target's model in the projection's run.

This is how any program is projected without editing it. Research scripts build their model
in a function of their own (`get_llm(name)`, `build_llama(layers, hidden)`, a `from_pretrained`
wrapper). Named, that function is

- observed in the real run: what each call returned (class, dtype, device, parameters, train
  mode) becomes the record's `model_from`;
- replaced in the target's run: each call returns `architectures.build_model(target)` in the
  observed dtype, device and mode, and the original is never called (under a traced run the
  weights are fake tensors: a 7B model costs nothing). Plain values the function set on its
  model (`model.seqlen = 2048`) are set on the replacement too, with the real run's values;
  the traced record's `model_from.calls[i].copied_attributes` lists them.

Everything else runs unchanged: the program's calibration data, loops and state are the real
run's, at the target's model shapes. The function is patched where it lives and in the
modules that imported it by name (auditor.name_bindings), as stage targets are, so it must be
named before the program imports it by name (the command line does this).

    with ModelFrom("pruning.tiny_llama:build_llama") as seen:           # real run
        main()
    with ModelFrom("pruning.tiny_llama:build_llama", TargetModel("llama-2-7b"), seen.calls):
        main()                                                          # under a traced Audit
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field

from auditor.stage import active_audit
from auditor.targets import LatePatch, Patch, Target, patch, raw_attribute, resolve



@dataclass(frozen=True)
class TargetModel:
    """The model a projection runs the program on: an architecture name or checkpoint folder,
    size overrides (`layers`, `hidden`...), and a dtype (default: the one the program built)."""
    architecture: str
    overrides: dict = field(default_factory=dict)
    dtype: str | None = None

    def describe(self) -> str:
        sizes = ", ".join(f"{k} {v}" for k, v in self.overrides.items())
        return self.architecture + (f" ({sizes})" if sizes else "")


def check(spec: str) -> Target:
    """The named function or class/static method (`transformers:AutoModelForCausalLM.from_pretrained`),
    or ValueError with a one-line message about `--model-from`."""
    try:
        target = resolve(spec)
    except ValueError as error:
        raise ValueError(str(error).replace("stage target", "--model-from", 1)) from None
    if isinstance(target.owner, type) and not isinstance(
            raw_attribute(target.owner, target.attribute), (classmethod, staticmethod)):
        raise ValueError(f"--model-from {spec!r} is a method of its objects; name a function, or a "
                         "class's from_pretrained / from_config (module:Class.method)")
    return target


class ModelFrom:
    """Patches the model-building function for a `with` block: observing it (no `target`) or
    replacing its calls by the target's model (`target`, with the real run's `observed` calls)."""

    def __init__(self, spec: str, target: TargetModel | None = None,
                 observed: list[dict] | None = None):
        self.spec, self.target = spec, target
        self._target = check(spec)
        self.calls: list[dict] = []  # what each call returned (observed) or built (replaced)
        self._observed = list(observed or [])
        if target is not None and not self._observed:
            raise ValueError(f"--model-from {spec!r} was never called in the real run: there is "
                             "no model to replace")
        self._patch: Patch | LatePatch | None = None
        self._building = False

    def __enter__(self) -> "ModelFrom":
        self._patch = patch(self._target, lambda function, _: (self._replacing(function) if self.target
                                                               else self._observing(function)),
                            what="--model-from")
        return self

    def __exit__(self, *exc) -> None:
        if self._patch is not None:
            self._patch.restore()
            self._patch = None

    def _observing(self, original):
        @functools.wraps(original)
        def observed(*args, **kwargs):
            model = original(*args, **kwargs)
            self._note(describe_model(model))
            return model
        return observed

    def _replacing(self, original):
        @functools.wraps(original)
        def replaced(*args, **kwargs):
            if self._building:  # the replacement's own build (from_config is how it builds)
                return original(*args, **kwargs)
            seen = self._observed[min(len(self.calls), len(self._observed) - 1)]
            if "class" not in seen or seen.get("returned") != "module":
                raise TypeError(f"--model-from {self.spec} returned a {seen.get('class', '?')} in "
                                "the real run, not a torch.nn.Module: it cannot be replaced by a model")
            self._building = True
            try:
                model, copied = build(self.target, seen)
            finally:
                self._building = False
            self._note({**describe_model(model), "replaces": seen, "copied_attributes": copied})
            return model
        return replaced

    def _note(self, call: dict) -> None:
        self.calls.append(call)
        audit = active_audit()
        if audit is not None:  # the record says what the program ran on, call by call
            audit.annotate("model_from", {"function": self.spec, "calls": self.calls,
                                          **({"target": asdict(self.target)} if self.target else {})})


def describe_model(model) -> dict:
    """What a projection needs to build the same kind of model at another size."""
    import torch
    if not isinstance(model, torch.nn.Module):
        return {"returned": "other", "class": type(model).__qualname__}
    parameters = list(model.parameters())
    first = parameters[0] if parameters else None
    config = getattr(model, "config", None)
    return {"returned": "module", "class": type(model).__qualname__,
            "dtype": str(first.dtype).removeprefix("torch.") if first is not None else "float32",
            "device": str(first.device) if first is not None else "cpu",
            "training": model.training,
            "parameters": sum(p.numel() for p in parameters),
            "model_type": getattr(config, "model_type", None),
            "attributes": _plain_attributes(model)}


def _plain_attributes(model) -> dict:
    """Plain values the program set on its model (`model.seqlen = 2048`, as Wanda's get_llm
    does): the replacement gets them too, or code that reads them would fail."""
    return {name: value for name, value in vars(model).items()
            if not name.startswith("_") and name not in ("training", "config")
            and isinstance(value, (bool, int, float, str)) and not isinstance(value, type)}


def build(target: TargetModel, seen: dict):
    """The target's model, as the program's own was (dtype, device, train or eval mode, plain
    attributes its function set), and the attributes copied."""
    import torch

    import architectures
    dtype = getattr(torch, target.dtype or seen.get("dtype") or "float32")
    device = "cpu" if str(seen.get("device", "cpu")).startswith("meta") else seen.get("device", "cpu")
    model = architectures.build_model(target.architecture, dtype=dtype, device=device,
                                      **target.overrides)
    copied = {name: value for name, value in (seen.get("attributes") or {}).items()
              if name not in vars(model)}  # set by the program's own function: the real run's value
    for name, value in copied.items():
        setattr(model, name, value)
    return model.train(bool(seen.get("training", False))), copied
