"""Staging code that cannot be edited: name a callable, and every call becomes a stage.

    resolve("gradprobe.pruner:GradProbe.record_gradients")   # or "module:function",
    resolve(GradProbe.record_gradients)                      # or the object itself

A target is patched where it lives (the attribute on its module or class) for the length of an
audit and restored afterwards. A function's copies bound by name in other loaded modules
(`from m import f` in the code that calls it) are staged too (auditor.capture.staging.name_bindings);
copies kept elsewhere (a local variable, a default argument) keep calling the original. Repeated
calls are numbered (`GradProbe.record_gradients#2`), and each call's stage says which call it
is, `"call": {"target", "index", "label"}`, the label naming what the call worked on
(auditor.capture.staging.call_labels: `model.layers.3.mlp.down_proj`). A staged method also
registers its receiver as a census root named after its class and the label
(`SparseGPT[model.layers.3.mlp.down_proj]`). Like any stage, each call also opens a torch
profiler range (auditor.capture.stage) while a profiler records.

A staged callable that calls itself (directly or not) while a call of it is open on the same
thread is one stage: its inner calls run inside the outer call's, unnumbered, and the record's
`call.recursed` says how deep it went (auditor.capture.recursion). `importlib.reload` of a
target's module, while the audit runs, stages the reloaded target again; a target the program
binds anew otherwise (an assignment) is said in a warning at the end, and its binding is kept.

A callable the auditor itself uses (`builtins:len`, `builtins:open`, `time:perf_counter`) can
be staged: the calls the auditor makes while measuring stay plain calls (auditor.capture.stage's
AUDITOR_CODE), so only the program's own calls become stages. The auditor's own callables
are refused: staging them would make stages out of stages.

Every name is checked before anything runs, each mistake a one-line ValueError: a module that
does not import, a missing attribute (with the closest name there), a method of a type written
in C (`builtins:dict.get`, `torch._C:TensorBase.sum`), whose attributes cannot be replaced. A
name in the audited script is checked in its source (auditor.capture.staging.script_names); one that cannot be
told before it runs and is then not found is said so when the audit ends (`Staging.never_called`).
"""
from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import os
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from auditor.capture import recursion
from auditor.capture.stage import (
    AUDITOR_CODE,
    CallStage,
    active_audit,
    in_auditor_code,
    profiler_recording,
    recursed,
    stage,
)
from auditor.capture.staging import main_script, name_bindings, script_names
from auditor.capture.staging.call_labels import CallLabels
from auditor.capture.staging.user_imports import import_named

_MISSING = object()
_HEAP_TYPE, _IMMUTABLE_TYPE = 1 << 9, 1 << 8  # CPython's type flags: a class statement's, a C type's


@dataclass(frozen=True)
class Target:
    name: str        # the stage name, e.g. "GradProbe.record_gradients"
    owner: object    # the module or class whose attribute is replaced (None: in the script)
    attribute: str
    spec: str        # "module:qualname", for messages
    script: str | None = None  # the audited script that defines it (auditor.capture.staging.main_script)


def resolve(target) -> Target:
    """A Target from "module:function", "module:Class.method" or a function/method object.

    Raises ValueError with a one-line message: no module X / no attribute Y / not callable.
    """
    if isinstance(target, Target):
        return target
    if isinstance(target, str):
        module_name, _, qualname = target.partition(":")
        if not module_name or not qualname:
            raise ValueError(f"stage target {target!r} should look like module:function "
                             "or module:Class.method")
        script = main_script.declared_for(module_name)
        if script is not None:  # the audited script's own: found in its source, bound as it runs
            return _resolve_in_script(script, module_name, qualname)
        return _resolve_path(import_named(module_name), module_name, qualname)
    return _resolve_object(target)


def _resolve_in_script(script: str, module_name: str, qualname: str) -> Target:
    spec = f"{module_name}:{qualname}"
    try:
        tree = main_script.parse(script)
    except (OSError, SyntaxError, ValueError) as error:
        raise ValueError(f"stage target {spec!r}: cannot read the script {script!r}: {error}") from None
    missing = script_names.check(tree, qualname, os.path.basename(script))
    if missing is not None:
        raise ValueError(f"stage target {spec!r}: {missing}")
    return Target(name=qualname, owner=None, attribute=qualname.split(".")[-1], spec=spec, script=script)


def _resolve_path(module, module_name: str, qualname: str) -> Target:
    spec = f"{module_name}:{qualname}"
    if module_name.partition(".")[0] == __name__.partition(".")[0]:  # stages made of stages
        raise ValueError(f"stage target {spec!r} is the auditor's own code, which measures and "
                         "cannot be staged; stage the program's callables")
    *outer, attribute = qualname.split(".")
    owner = module
    for depth, part in enumerate(outer):
        found = getattr(owner, part, _MISSING)
        if found is _MISSING:
            where = ".".join([module_name, *outer[:depth]])
            raise ValueError(f"stage target {spec!r}: {where} has no attribute {part!r}{did_you_mean(owner, part)}")
        owner = found
    raw = raw_attribute(owner, attribute)
    if raw is _MISSING:
        where = ".".join([module_name, *outer])
        raise ValueError(f"stage target {spec!r}: {where} has no attribute {attribute!r}"
                         f"{did_you_mean(owner, attribute)}")
    _check_stageable(raw, spec)
    _check_patchable(owner, spec)
    return Target(name=qualname, owner=owner, attribute=attribute, spec=spec)


def did_you_mean(owner, name: str) -> str:
    """"; did you mean X?" naming the attribute of `owner` closest to `name`, or ""."""
    try:
        names = [n for n in dir(owner) if not (n.startswith("__") and n.endswith("__"))]
    except Exception:  # an object whose __dir__ fails: no suggestion
        return ""
    found = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return f"; did you mean {found[0]!r}?" if found else ""


def _check_patchable(owner, spec: str) -> None:
    """ValueError unless the attribute can be replaced where it lives: not on a type written in
    C (dict, torch._C.TensorBase: immutable), nor on an object without a __dict__."""
    if isinstance(owner, types.ModuleType):
        return
    if isinstance(owner, type):
        if owner.__flags__ & _IMMUTABLE_TYPE or not owner.__flags__ & _HEAP_TYPE:
            name = owner.__qualname__ if owner.__module__ == "builtins" else \
                f"{owner.__module__}.{owner.__qualname__}"
            raise ValueError(f"stage target {spec!r} cannot be patched: {name} is a type written in C, "
                             "whose attributes cannot be replaced; stage a Python function that calls it")
        return
    try:
        vars(owner)
    except TypeError:
        raise ValueError(f"stage target {spec!r} cannot be patched: its owner, a "
                         f"{type(owner).__name__}, has no __dict__ to replace it in; stage its class's "
                         "method or a Python function that calls it") from None


def raw_attribute(owner, attribute: str):
    """The attribute as stored (staticmethod/classmethod wrappers kept), or _MISSING."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attribute in vars(klass):
                return vars(klass)[attribute]
        return _MISSING
    return getattr(owner, attribute, _MISSING)


def _check_stageable(raw, spec: str) -> None:
    function = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    if isinstance(function, type):
        raise ValueError(f"stage target {spec!r} is a class; stage one of its methods "
                         f"({spec}.method)")
    if not callable(function):
        raise ValueError(f"stage target {spec!r} is not callable "
                         f"(it is a {type(function).__name__})")
    if inspect.isgeneratorfunction(function) or inspect.iscoroutinefunction(function) \
            or inspect.isasyncgenfunction(function):
        raise ValueError(f"stage target {spec!r} is a generator or coroutine function: a "
                         "call only creates it; stage the code that consumes it")


def _resolve_object(obj) -> Target:
    function = obj.__func__ if inspect.ismethod(obj) else obj
    if isinstance(function, type):
        raise ValueError(f"stage target {function.__qualname__!r} is a class; "
                         "stage one of its methods")
    if not callable(function):
        raise ValueError(f"stage target {obj!r} is not callable")
    module_name = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", None)
    if not module_name or not qualname or module_name not in sys.modules:
        raise ValueError(f"stage target {obj!r} has no module-level name to patch; "
                         "pass 'module:function' instead")
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(f"stage target {module_name}:{qualname} is defined inside a function "
                         "and cannot be patched from outside")
    target = _resolve_path(sys.modules[module_name], module_name, qualname)
    raw = raw_attribute(target.owner, target.attribute)
    if getattr(raw, "__func__", raw) is not function:
        raise ValueError(f"stage target {module_name}:{qualname} is not reachable under that name")
    return target


class Staging:
    """Patches a set of targets for the duration of an audit (apply, then restore)."""

    def __init__(self, targets: Iterable[object]) -> None:
        """`targets`: what `resolve` takes, "module:qualname" strings or the callables."""
        self.targets: list[Target] = []
        seen: set[tuple[object, str]] = set()
        for target in map(resolve, targets):
            key = (target.script, target.name) if target.script is not None else (id(target.owner), target.attribute)
            if key not in seen:
                seen.add(key)
                self.targets.append(target)
        self._patches: list[Patch | LatePatch] = []
        self._late: dict[str, LatePatch] = {}  # a script target's spec -> what its patch found
        self.rebound: list[str] = []  # targets the program bound anew while staged (said at the end)
        self._reload: Callable | None = None  # importlib.reload as it was, while ours re-stages what it reloads

    def receiver_classes(self) -> tuple[type, ...]:
        """The classes whose plain methods are staged (their calls have a receiver), less
        nn.Module subclasses (a module receiver is named by the model already)."""
        module = getattr(sys.modules.get("torch.nn.modules.module"), "Module", None)
        found = []
        for target in self.targets:
            owner = target.owner
            if (isinstance(owner, type) and owner not in found
                    and not (module is not None and issubclass(owner, module))
                    and inspect.isfunction(raw_attribute(owner, target.attribute))):
                found.append(owner)
        return tuple(found)

    def apply(self) -> None:
        for target in self.targets:
            try:
                applied = patch(target, _wrap(target))
            except ValueError:
                self.restore()
                raise
            self._patches.append(applied)
            if isinstance(applied, LatePatch):
                self._late[target.spec] = applied
        if any(isinstance(applied, Patch) for applied in self._patches):
            self._reload = original = importlib.reload

            @functools.wraps(original)
            def reload(module):
                reloaded = original(module)
                self.restage(reloaded)
                return reloaded
            importlib.reload = reload

    def restage(self, module: types.ModuleType) -> None:
        """Stage again the targets of `module` that importlib.reload bound anew (its functions, and
        the methods of its classes, are new objects, no longer staged)."""
        with AUDITOR_CODE:
            for applied in list(self._patches):
                if not isinstance(applied, Patch) or applied.restaged:
                    continue
                if applied.target.spec.partition(":")[0] != getattr(module, "__name__", None):
                    continue
                applied.restaged = True
                try:
                    target = resolve(applied.target.spec)  # a method's class is a new one too
                    if target.owner is applied.target.owner and not applied.replaced_since():
                        applied.restaged = False  # untouched by the reload: still staged
                        continue
                    self._patches.append(Patch(target, _wrap(target)))
                except ValueError as error:  # no longer there, or not a function: said at the end
                    self.rebound.append(f"stage target {applied.target.spec} was reloaded and could not be "
                                        f"staged again ({error}); its later calls were not staged")

    def never_called(self, target: Target) -> str:
        """The warning for a target the program never called, with its cause where it is known:
        a script's name never bound, or not found in what the script bound."""
        late = self._late.get(target.spec)
        if late is not None and late.refused is not None and late.refused == late.not_found:
            return f"{late.refused}; its calls were not staged"
        if late is not None and late.not_found is not None:
            return (f"stage target {target.spec} was never called: it was not found in the script's "
                    f"namespace when it ran ({late.not_found})")
        return (f"stage target {target.spec} was never called (a copy kept outside a module's names, "
                "such as a local or a default argument, keeps calling the original)")

    def restore(self) -> None:
        if self._reload is not None and importlib.reload is not self._reload:
            importlib.reload = self._reload
        self._reload = None
        while self._patches:
            applied = self._patches.pop()
            if isinstance(applied, Patch) and applied.replaced_since() and not applied.restaged:
                self.rebound.append(f"stage target {applied.target.spec} was bound anew while the audit ran (an "
                                    "assignment, or importlib.reload reached by another name): its calls from then on "
                                    "were not staged, and the program's new binding is kept")
            applied.restore()


def _wrap(target: Target):
    """How `target`'s function becomes a staged one."""
    return lambda function, is_method, name=target.name: _stage_calls(function, name, receiver=is_method)


def patch(target: Target, wrap, what: str = "stage target") -> Patch | LatePatch:
    """The target patched now, or (defined by the audited script) as the script binds it."""
    return LatePatch(target, wrap, what) if target.script is not None else Patch(target, wrap, what)


class LatePatch:
    """A target of the audited script (auditor.capture.staging.main_script), patched each time the script binds
    it, in the script's namespace, and restored with the rest."""

    def __init__(self, target: Target, wrap, what: str = "stage target"):
        self.target, self.wrap, self.what = target, wrap, what
        self.patches: list[Patch] = []
        top = target.name.split(".")[0]
        # why nothing was patched, as the script last bound the name (None once patched)
        self.not_found: str | None = f"the script never bound {top!r} by a top-level def, class, import or assignment"
        self.refused: str | None = None  # why what the script bound cannot be staged
        self._stop = main_script.watch(target.script or "", top, self._bound)

    def _bound(self, module: types.ModuleType) -> None:
        *outer, attribute = self.target.name.split(".")
        owner: object = module
        for depth, part in enumerate(outer):
            found = getattr(owner, part, _MISSING)
            if found is _MISSING:  # the script bound the name to something else: nothing to stage
                self._missing(outer[:depth], part, owner)
                return
            owner = found
        raw = raw_attribute(owner, attribute)
        if raw is _MISSING:
            self._missing(outer, attribute, owner)
            return
        if getattr(raw, "__auditor_target__", None):
            return
        if not callable(getattr(raw, "__func__", raw)):
            self.not_found = f"{self.target.name} was a {type(raw).__name__}, not a function"
            return
        try:  # a generator or coroutine function, known only once the script defines it
            _check_stageable(raw, self.target.spec)
        except ValueError as error:
            self.not_found = self.refused = str(error)
            return
        bound = Target(self.target.name, owner, attribute, self.target.spec)
        try:
            self.patches.append(Patch(bound, self.wrap, self.what))
        except ValueError as error:  # the script bound it on a C type: a warning, never its failure
            self.not_found = str(error)
            return
        self.not_found = None

    def _missing(self, outer: list[str], part: str, owner: object) -> None:
        if self.patches:  # patched at an earlier binding: that one stages the calls
            return
        where = ".".join(outer) if outer else "the script"
        self.not_found = f"{where} had no attribute {part!r}{did_you_mean(owner, part)}"

    def restore(self) -> None:
        self._stop()
        while self.patches:
            self.patches.pop().restore()


class Patch:
    """A target's attribute replaced by a wrapper of its function, in the same kind of descriptor
    (a static or class method stays one), with the copies other modules bound by name
    (auditor.capture.staging.name_bindings); `restore` puts back what was there (nothing, where it was inherited)."""

    def __init__(self, target: Target, wrap, what: str = "stage target"):
        """`wrap(function, is_method)`: the new function; ValueError if the attribute cannot be set."""
        self.target = target
        owner_dict = vars(target.owner)
        self.original = owner_dict.get(target.attribute, _MISSING)
        raw = raw_attribute(target.owner, target.attribute)
        descriptor = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
        function = raw.__func__ if descriptor else raw
        is_method = descriptor is None and isinstance(target.owner, type) and inspect.isfunction(raw)
        replacement = wrap(function, is_method)
        self.replacement = descriptor(replacement) if descriptor else replacement
        self.restaged = False  # bound anew by importlib.reload, and its new binding staged (Staging.restage)
        try:
            setattr(target.owner, target.attribute, self.replacement)
        except (AttributeError, TypeError) as error:
            raise ValueError(f"{what} {target.spec!r} cannot be patched: {error}") from None
        self.copies: list = []
        if isinstance(target.owner, types.ModuleType) and inspect.isfunction(raw):
            # `from lib import prune` ran before the patch: patch those copies too
            self.copies = name_bindings.rebind(raw, replacement, skip=owner_dict)

    def replaced_since(self) -> bool:
        """Whether the program bound the attribute anew since the patch (importlib.reload, an assignment)."""
        return vars(self.target.owner).get(self.target.attribute, _MISSING) is not self.replacement

    def restore(self) -> None:
        name_bindings.restore(self.copies)
        self.copies = []
        if self.replaced_since():  # the program's own binding since: it stays
            return
        if self.original is _MISSING:  # was inherited: remove our override
            delattr(self.target.owner, self.target.attribute)
        else:
            setattr(self.target.owner, self.target.attribute, self.original)


def _stage_calls(function, name: str, receiver: bool):
    @functools.wraps(function)
    def staged_call(*args, **kwargs):
        if in_auditor_code():  # called by the auditor itself while measuring: never a stage
            return function(*args, **kwargs)
        depth = recursion.open_call(function)
        if depth is not None:  # recursing: inside the outer call's stage, unnumbered
            return recursion.inside(depth, function, args, kwargs)
        with AUDITOR_CODE:
            opened = _opened(name, receiver, args, kwargs)
        if opened is None:
            return function(*args, **kwargs)
        return recursion.staged_call(function, opened, function, args, kwargs, recursed)
    vars(staged_call)["__auditor_target__"] = name  # the mark a second patch looks for (LatePatch)
    return staged_call


def _opened(name: str, receiver: bool, args: tuple, kwargs: dict) -> stage | None:
    """`_open_call`, with room for its frames (auditor.capture.recursion); a failure of its own
    is a warning in the record and a plain call, never the program's exception."""
    try:
        recursion.room()
    except RecursionError:  # not even the room to count: a plain call
        return None
    try:
        return _open_call(name, receiver, args, kwargs)
    except Exception as error:
        audit = active_audit()
        if audit is not None:
            audit._fault(f"staging a call of {name}", error)
        return None
    finally:
        recursion.end_room()


def _open_call(name: str, receiver: bool, args: tuple, kwargs: dict) -> stage | None:
    """The stage for one call, or None when neither an audit nor a profiler records."""
    audit = active_audit()
    if audit is None:  # a profiler range only: calls are numbered by the audit
        return stage(name) if profiler_recording() else None
    numbered = audit.numbered(name)
    index = 1 if numbered == name else int(numbered[len(name) + 1:])
    label = _labels(audit).label(audit, name, args, kwargs, receiver)
    if receiver and args:
        audit.track_receiver(args[0], label)
    return CallStage(numbered, {"target": name, "index": index, "label": label})


_call_labels: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Audit -> CallLabels
_call_labels_lock = threading.Lock()


def _labels(audit) -> CallLabels:
    """The audit's call labels (module index, hook state), made on its first staged call."""
    labels = _call_labels.get(audit)
    if labels is None:
        with _call_labels_lock:
            labels = _call_labels.get(audit)
            if labels is None:
                labels = _call_labels[audit] = CallLabels(getattr(audit, "stage_label", None))
    return labels
