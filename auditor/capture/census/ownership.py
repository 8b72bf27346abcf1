"""Ownership: which registered root holds a tensor, under which component name and category.

The user registers roots by name (an `nn.Module`, an optimizer, any object, a dict, a list,
a tensor). `walk_roots` visits them in registration order and reports every tensor it
reaches to a `claim(tensor, component, firmness)` callback; the caller counts storages and
keeps, for each, the firmest claim, the first among equals (so root registration order
decides ownership). Two firmnesses: `CONTAINED`, a parameter (or its `.grad`) of a module
root's own module tree; `REACHED`, everything else. A root that is not a module (a wrapper
such as a pruning helper holding `self.layer`) reaches the parameters of the modules it
references only as `REACHED`, and the census gives module parameters to `CONTAINED` claims
alone: a wrapper never owns a model's weights.

Component names, for a root named R:

- an `nn.Module`: its parameters -> `R.parameters`, their `.grad` -> `R.grad`, its buffers
  -> `R.buffers` (all submodules together; category "buffers"); a plain attribute of the module or of a
  submodule at path P that holds tensors -> `R.P.attr` (e.g. a user's `nn.Module` pruner
  keeping `self.saved_state` gives `R.saved_state`);
- a `torch.optim.Optimizer`: its per-parameter `.state` -> `R.state` (the parameters in
  `param_groups` belong to the model, not to the optimizer, and are not walked);
- a dict, list, tuple, set or tensor: everything it holds -> `R`;
- any other object: each `__dict__` (or `__slots__`) attribute holding tensors -> `R.attr`.

Inside any of these, a module or an optimizer is walked as one wherever it is found
(`pruner.model` gives `pruner.model.buffers` ...; its parameters are claimed too, as
`REACHED`, so they stay with a module root that contains them). Other containers and objects are
walked to a bounded depth and their tensors count for the enclosing component; a hint key
naming a deeper dotted path (`{"records.g0": ...}`) makes that path a component of its own.
A tensor reached that requires grad has its `.grad` in `<component>.grad`. Weak references
are not followed (they own nothing); nor are functions, classes, modules, frames.

Category of a component, first rule that applies: the root's hints (a key equal to the
full component name, to its path below the root, or to its last name: `saved_state`,
`model.parameters`, `parameters`); module parameters -> weights; module buffers -> buffers;
`.grad` -> gradients; optimizer state -> optimizer state; otherwise left to the caller (None),
which decides from provenance and content (auditor.capture.census.take: mostly copies of the weights ->
saved copies, all-bool -> masks, else other).
"""
from __future__ import annotations

import types
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import islice

import torch

WEIGHTS = "weights"
GRADIENTS = "gradients"
SAVED_COPIES = "saved copies"
GRADIENT_RECORDS = "gradient records"
MASKS = "masks"            # pruning masks: bool tensors an algorithm keeps
BUFFERS = "buffers"        # module buffers (causal masks, rotary tables): never "masks"
OPTIMIZER_STATE = "optimizer state"
ACTIVATIONS = "activations and temporaries"
RETAINED_BY_CYCLE = "retained by a reference cycle"
OTHER = "other"
CATEGORIES = (WEIGHTS, BUFFERS, GRADIENTS, SAVED_COPIES, GRADIENT_RECORDS, MASKS, OPTIMIZER_STATE,
              ACTIVATIONS, RETAINED_BY_CYCLE, OTHER)

MAX_DEPTH = 4          # containers below a component's attribute that are still opened
MAX_ITEMS = 100_000    # items looked at per container
MAX_NODES = 1_000_000  # containers and objects opened per root

REACHED = 1    # reached from a root
CONTAINED = 2  # a parameter, or its .grad, of a module root's own tree

Claim = Callable[[torch.Tensor, str, int], None]

_ATOMS = (str, bytes, bytearray, memoryview, int, float, complex, type(None), range, slice,
          torch.dtype, torch.device, torch.layout, torch.memory_format)
_OPAQUE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
           types.MethodType, types.CodeType, types.FrameType, types.GeneratorType,
           types.CoroutineType, weakref.ReferenceType, *weakref.ProxyTypes)
_SEQUENCES = (list, tuple, set, frozenset, deque)
_SKIP = _ATOMS + _OPAQUE
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))


def walk_roots(roots: Iterable[tuple[str, object, dict[str, str]]], claim: Claim) -> dict[str, str | None]:
    """Walk `(name, object, hints)` roots in order, claiming every tensor reached.

    Returns component name -> category, or None where the caller decides from content.
    """
    walker = _Walker(claim)
    for name, obj, hints in roots:
        walker.walk_root(name, obj, hints)
    return walker.categories


class _Walker:
    def __init__(self, claim: Claim):
        self.claim = claim
        self.categories: dict[str, str | None] = {}
        self.visited: set[int] = set()  # ids of containers, objects and modules opened
        self.contained: set[int] = set()  # ids of modules walked as part of a module root's tree

    def walk_root(self, name: str, obj: object, hints: dict[str, str]) -> None:
        self.root, self.hints, self.budget = name, hints, MAX_NODES
        self.splits = {k for k in hints if "." in k}
        if isinstance(obj, torch.nn.Module):
            self._module(obj, name, contained=True)
        elif isinstance(obj, (torch.Tensor, torch.optim.Optimizer, dict, *_SEQUENCES)):
            self._value(obj, name, name, 0)
        elif not isinstance(obj, _SKIP) and id(obj) not in self.visited:
            self.visited.add(id(obj))
            for attr, value in _attributes(obj):
                path = f"{name}.{attr}"
                self._value(value, path, path, 1)

    def _tensor(self, t: torch.Tensor, component: str, kind: str | None = None,
                grad_component: str | None = None, firmness: int = REACHED) -> None:
        if component not in self.categories:
            self.categories[component] = self._category(component, kind)
        self.claim(t, component, firmness)
        if t.is_leaf and t.requires_grad:
            grad = t.grad
            if grad is not None:
                self._tensor(grad, grad_component or f"{component}.grad", GRADIENTS, firmness=firmness)

    def _category(self, component: str, kind: str | None) -> str | None:
        relative = component[len(self.root) + 1:]
        for key in (component, relative, relative.rpartition(".")[2]):
            if key and key in self.hints:
                return self.hints[key]
        return kind

    def _value(self, value: object, component: str, path: str, depth: int,
               kind: str | None = None) -> None:
        if isinstance(value, _SKIP):  # first: a weak proxy to a tensor passes for a tensor
            return
        if isinstance(value, torch.Tensor):
            self._tensor(value, component, kind)
            return
        if id(value) in self.visited:
            return
        if isinstance(value, torch.nn.Module):
            self._module(value, path, contained=False)
            return
        if isinstance(value, torch.optim.Optimizer):
            self.visited.add(id(value))
            state = f"{path}.state"
            self._value(value.state, state, state, 1, OPTIMIZER_STATE)
            return
        if depth > MAX_DEPTH or self.budget <= 0:
            return
        self.visited.add(id(value))
        self.budget -= 1
        children: Sequence[tuple[str | int, object]]  # (path segment, value)
        try:  # copy at most MAX_ITEMS items; another thread may be changing the container
            if isinstance(value, dict):
                children = [(_key(k), v) for k, v in islice(value.items(), MAX_ITEMS)]
            elif isinstance(value, _SEQUENCES):
                children = list(enumerate(islice(value, MAX_ITEMS)))
            else:
                children = _attributes(value)
        except RuntimeError:
            return
        for key, child in children:
            child_path = f"{path}.{key}"
            split = self.splits and child_path[len(self.root) + 1:] in self.splits
            self._value(child, child_path if split else component, child_path, depth + 1, kind)

    def _module(self, module: torch.nn.Module, path: str, contained: bool) -> None:
        """Parameters, gradients and buffers of the whole tree; plain attributes by submodule.
        `contained`: the tree is a module root's own, so its parameters are claimed as
        CONTAINED (a module a wrapper reached first is walked again for that)."""
        seen = self.contained if contained else self.visited
        firmness = CONTAINED if contained else REACHED
        stack = [(module, path)]
        while stack:
            m, sub = stack.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            self.visited.add(id(m))
            for _, param in m.named_parameters(recurse=False):
                self._tensor(param, f"{path}.parameters", WEIGHTS, f"{path}.grad", firmness)
            for _, buffer in m.named_buffers(recurse=False):
                self._tensor(buffer, f"{path}.buffers", BUFFERS)
            for attr, value in list(vars(m).items()):
                if attr not in _MODULE_INTERNALS:
                    self._value(value, f"{sub}.{attr}", f"{sub}.{attr}", 1)
            stack.extend((child, f"{sub}.{name}") for name, child in reversed(list(m.named_children())))


def _key(key: object) -> str:
    """A dict key as a path segment, without formatting tensors or other large objects."""
    return key if isinstance(key, str) else str(key) if isinstance(key, (int, float)) else type(key).__name__


def _attributes(obj: object) -> list[tuple[str, object]]:
    """An object's instance attributes: `__dict__` items, then `__slots__` values."""
    try:
        found = list(islice(vars(obj).items(), MAX_ITEMS))
    except Exception:  # no __dict__, or a __dict__ that is not a dict
        found = []
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__"):
                try:
                    value = getattr(obj, slot)
                except Exception:  # an unset slot, or a property that refuses: not an attribute
                    continue
                found.append((slot, value))
    return found
