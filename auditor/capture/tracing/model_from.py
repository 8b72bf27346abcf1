"""The function that builds the audited program's model (`--model-from lib:get_llm`): observed
in the real run, replaced by the target's model in the projection's run.

This is how any program is projected without editing it. Research scripts build their model
in a function of their own (`get_llm(name)`, `build_llama(layers, hidden)`, a `from_pretrained`
wrapper) or with a class call (`LlamaForCausalLM(config)`). Named (a function, a class, or a
class's `from_pretrained`/`from_config`), it is

- observed in the real run: what each call returned (class, dtype, device, parameters, train
  mode, attention) becomes the record's `model_from`;
- run again in the target's run, as written, with the target's sizes put into the config of
  every `transformers` model it builds (auditor.capture.tracing.target_config): the same class, attention
  implementation, dtype, tied embeddings and side effects (`.to(device)`, `hf_device_map`,
  hooks, attributes of any type), only the sizes changed. Under a traced run the weights are
  fake tensors: a 7B model costs nothing. Each call's `target_built` says how it was built.
- A model that is not a `transformers` model has no config to resize: a function's call is
  then replaced by a stand-in, `architectures.build_model(target)` in the observed dtype,
  device and mode, with the plain values the function set on its model (`copied_attributes`),
  and `target_built` says in plain words that the figures are the stand-in's, not the
  program's model's. A class that is not a transformers model cannot be replaced: its call
  fails in the target's run with that sentence.

Everything else runs unchanged: the program's calibration data, loops and state are the real
run's, at the target's model shapes. The function is patched where it lives and in the
modules that imported it by name (auditor.capture.staging.name_bindings), as stage targets are, so it must be
named before the program imports it by name (the command line does this); a class is patched
in its `__init__`, so every way of calling it is seen.

    with ModelFrom("pruning.tiny_llama:build_llama") as seen:           # real run
        main()
    with ModelFrom("pruning.tiny_llama:build_llama", TargetModel("llama-2-7b"), seen.calls):
        main()                                                          # under a traced Audit
"""
from __future__ import annotations

import ast
import functools
from dataclasses import asdict, dataclass, field

from auditor.capture.stage import active_audit
from auditor.capture.staging import main_script
from auditor.capture.staging.targets import Patch, Target, import_named, patch, raw_attribute, resolve


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
    """The named function, class, or class/static method (`transformers:AutoModelForCausalLM.from_pretrained`),
    or ValueError with a one-line message about `--model-from`. A class is watched in its
    `__init__` (Target named `Class.__init__`)."""
    try:
        target = resolve(spec)
    except ValueError as error:
        if "is a class" not in str(error):
            raise ValueError(str(error).replace("stage target", "--model-from", 1)) from None
        return _class_init(spec)
    if target.script is not None and _script_class(target):
        return _class_init(spec)
    if isinstance(target.owner, type) and not isinstance(
            raw_attribute(target.owner, target.attribute), (classmethod, staticmethod)):
        raise ValueError(f"--model-from {spec!r} is a method of its objects; name a function, a class, "
                         "or a class's from_pretrained / from_config (module:Class.method)")
    return target


def _class_init(spec: str) -> Target:
    module_name, _, qualname = spec.partition(":")
    script = main_script.declared_for(module_name)
    if script is not None:
        return Target(name=f"{qualname}.__init__", owner=None, attribute="__init__", spec=spec,
                      script=script)
    owner: object = import_named(module_name, "--model-from")
    for part in qualname.split("."):
        owner = getattr(owner, part)
    return Target(name=f"{qualname}.__init__", owner=owner, attribute="__init__", spec=spec)


def _script_class(target: Target) -> bool:
    return _script_binding(target) == "class"


def _script_binding(target: Target) -> str:
    """How the audited script binds a top-level name: "class" (a class statement), "object"
    (assignments only: `model = LlamaForCausalLM(config)`), or "function" (a def, an import)."""
    from auditor.capture.staging.script_names import bindings
    nodes = bindings(main_script.parse(target.script or "").body).get(target.name.split(".")[0], [])
    if any(isinstance(node, ast.ClassDef) for node in nodes):
        return "class"
    if nodes and all(isinstance(node, ast.Name) for node in nodes) and "." not in target.name:
        return "object"
    return "function"


def kind(target: Target) -> str:
    """What --model-from names: a "function" (or class/static method), a "class" (watched in its
    `__init__`), or an "object" the script binds at top level (its class found in the real run)."""
    if target.attribute == "__init__":
        return "class"
    return _script_binding(target) if target.script is not None else "function"


class ModelFrom:
    """Patches the model-building function or class for a `with` block: observing it (no
    `target`) or building the target's model through it (`target`, with the real run's
    `observed` calls)."""

    def __init__(self, spec: str, target: TargetModel | None = None,
                 observed: list[dict] | None = None):
        self.spec, self.target = spec, target
        self._target = check(spec)
        self.calls: list[dict] = []  # what each call returned (observed) or built (replaced)
        self._observed = list(observed or [])
        if target is not None and not self._observed:
            raise ValueError(f"--model-from {spec!r} was never called in the real run: there is "
                             "no model to replace")
        self._kind = kind(self._target)
        self._patches: list = []  # Patch, LatePatch, or a watch's stop function
        self._seen_objects: set[int] = set()
        self._depth = 0  # calls inside calls (the replacement's own build, a subclass's super().__init__)

    def __enter__(self) -> ModelFrom:
        if self._kind == "function":
            self._patches.append(patch(self._target, lambda function, _: self._wrap_function(function),
                                       what="--model-from"))
            return self
        if self._kind == "object" and self.target is None:  # seen where the script binds it
            self._patches.append(main_script.watch(self._target.script or "", self._target.name,
                                                   self._bound))
            return self
        built_class = self._target if self._kind == "class" else self._observed_class()
        self._patches.append(patch(built_class, lambda function, _: self._wrap_init(function),
                                   what="--model-from"))
        if self.target is not None and isinstance(built_class.owner, type):
            loading = _from_pretrained_at_target(built_class.owner, self.target)
            if loading is not None:
                self._patches.append(loading)
        return self

    def __exit__(self, *exc) -> None:
        while self._patches:
            done = self._patches.pop()
            done() if callable(done) else done.restore()

    def _bound(self, module) -> None:
        """The script bound the named object: observed once per object it binds."""
        import torch
        value = getattr(module, self._target.name, None)
        if isinstance(value, torch.nn.Module) and id(value) not in self._seen_objects:
            self._seen_objects.add(id(value))
            self._note(describe_model(value))

    def _observed_class(self) -> Target:
        """The class of the object the script bound in the real run, watched in its `__init__`."""
        seen = self._observed[0]
        module_name, _, qualname = str(seen.get("class_path", "")).partition(":")
        if not qualname:
            raise ValueError(f"--model-from {self.spec}: the real run recorded no class for it")
        owner: object = import_named(module_name, "--model-from") if module_name != "__main__" else None
        for part in qualname.split("."):
            owner = getattr(owner, part, None)
        if not isinstance(owner, type):  # a class of the script's own: not there before it runs
            raise ValueError(f"--model-from {self.spec}: its class {qualname} is defined in the script; "
                             f"name the class (__main__:{qualname}) or the function that builds it")
        return Target(name=f"{qualname}.__init__", owner=owner, attribute="__init__",
                      spec=f"{module_name}:{qualname}")

    def _wrap_function(self, original):
        @functools.wraps(original)
        def model_from(*args, **kwargs):
            if self._depth:
                return original(*args, **kwargs)
            self._depth += 1
            try:
                if self.target is None:
                    model = original(*args, **kwargs)
                    self._note(describe_model(model))
                    return model
                return self._at_target(lambda: original(*args, **kwargs))
            finally:
                self._depth -= 1
        return model_from

    def _wrap_init(self, original):
        @functools.wraps(original)
        def model_init(model, *args, **kwargs):
            if self._depth:
                return original(model, *args, **kwargs)
            self._depth += 1
            try:
                if self.target is None:
                    original(model, *args, **kwargs)
                    self._note(describe_model(model))
                    return None
                self._at_target(lambda: (original(model, *args, **kwargs), model)[1], in_place=True)
                return None
            finally:
                self._depth -= 1
        return model_init

    def _at_target(self, build_as_written, in_place: bool = False):
        """The program's own call with the target's sizes in its transformers config; a stand-in
        where it builds no transformers model (a class: an error saying why)."""
        from auditor.capture.tracing.target_config import AtTargetSizes, describe_sizes, target_sizes
        assert self.target is not None
        seen = self._observed[min(len(self.calls), len(self._observed) - 1)]
        if seen.get("returned") != "module":
            raise TypeError(f"--model-from {self.spec} returned a {seen.get('class', '?')} in "
                            "the real run, holding no torch.nn.Module: it cannot be built at the target's sizes")
        sizes = target_sizes(self.target)
        failed = None
        with AtTargetSizes(sizes) as resizing:
            try:
                model = build_as_written()
            except Exception as error:  # a builder that fails on fake tensors, with no transformers
                if resizing.resized or in_place:  # model in it, is replaced; any other failure is its own
                    raise
                model, failed = None, f"{type(error).__name__}: {error}".splitlines()[0][:200]
        if resizing.resized:
            module, _ = _model_in(model)  # what it returned may hold more: (model, tokenizer)
            if self.target.dtype and module is not None:
                import torch
                module.to(getattr(torch, self.target.dtype))
            built = {"by": "program", "sizes": resizing.resized[0]["sizes"],
                     "says": f"built by the program's own {self.spec} with {self.target.describe()}'s "
                             f"sizes ({describe_sizes(resizing.resized[0]['sizes'])}); its class "
                             f"{type(module).__qualname__}, attention ({_attention(module) or 'default'}), "
                             "dtype and other settings are the program's"}
            self._note({**describe_model(model), "replaces": seen, "target_built": built})
            return model
        not_resizable = (f"the program's model ({seen.get('class', '?')}) is not a transformers model, "
                         f"so its sizes cannot be set to {self.target.describe()}'s"
                         + (f" (its builder failed at the target: {failed})" if failed else ""))
        if in_place or seen.get("returned_in"):  # nothing a stand-in can take the place of
            alone = "returns it alone" if seen.get("returned_in") else "builds it"
            raise TypeError(f"--model-from {self.spec}: {not_resizable}; name a function that {alone}, "
                            "and a stand-in of the target's architecture is used in its place")
        del model  # the program's small model: the stand-in takes its place
        self._depth += 1  # the stand-in's own from_config is not the program's call
        try:
            stand_in, copied = build(self.target, seen)
        finally:
            self._depth -= 1
        built = {"by": "stand-in",
                 "says": f"a stand-in: {not_resizable}; the figures are those of the auditor's "
                         f"{self.target.describe()} (eager attention) built in its place, not of the "
                         "program's own model"}
        self._note({**describe_model(stand_in), "replaces": seen, "copied_attributes": copied,
                    "target_built": built})
        return stand_in

    def _note(self, call: dict) -> None:
        self.calls.append(call)
        audit = active_audit()
        if audit is not None:  # the record says what the program ran on, call by call
            audit.annotate("model_from", {"function": self.spec, "calls": self.calls,
                                          **({"target": asdict(self.target)} if self.target else {})})


def _from_pretrained_at_target(model_class: type, target: TargetModel) -> Patch | None:
    """A watched class's `from_pretrained` (the class or a subclass) builds at the target's sizes
    without reading weights, as inside a named function (auditor.capture.tracing.target_config); other classes
    load as usual."""
    from auditor.capture.tracing.target_config import AtTargetSizes, target_sizes
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return None
    if not issubclass(model_class, PreTrainedModel):
        return None

    def wrap(original):
        @functools.wraps(original)
        def from_pretrained(cls, *args, **kwargs):
            if not issubclass(cls, model_class):
                return original(cls, *args, **kwargs)
            with AtTargetSizes(target_sizes(target)) as sizes:
                return sizes.from_pretrained(cls, *args, **kwargs)
        return from_pretrained
    return Patch(Target("PreTrainedModel.from_pretrained", PreTrainedModel, "from_pretrained",
                        "transformers:PreTrainedModel.from_pretrained"), lambda function, _: wrap(function),
                 what="--model-from")


def _attention(model) -> str | None:
    """The attention implementation the model runs (transformers settles it as the model is built)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def _model_in(value) -> tuple:
    """The model a builder returned, and where in what it returned (None: the value itself):
    research code often returns `(model, tokenizer)` or a dict of both."""
    import torch
    if isinstance(value, torch.nn.Module):
        return value, None
    items = (enumerate(value) if isinstance(value, (tuple, list))
             else value.items() if isinstance(value, dict) else ())
    for key, item in items:
        if isinstance(item, torch.nn.Module):
            return item, f"[{key!r}]"
    return None, None


def describe_model(value) -> dict:
    """What a projection needs to build the same kind of model at another size."""
    model, where = _model_in(value)
    if model is None:
        return {"returned": "other", "class": type(value).__qualname__}
    if where is not None:
        return {**describe_model(model), "returned_in": f"{type(value).__name__}{where}"}
    parameters = list(model.parameters())
    first = parameters[0] if parameters else None
    config = getattr(model, "config", None)
    return {"returned": "module", "class": type(model).__qualname__,
            "dtype": str(first.dtype).removeprefix("torch.") if first is not None else "float32",
            "device": str(first.device) if first is not None else "cpu",
            "training": model.training,
            "parameters": sum(p.numel() for p in parameters),
            "class_path": f"{type(model).__module__}:{type(model).__qualname__}",
            "model_type": getattr(config, "model_type", None),
            "attention": _attention(model),
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
