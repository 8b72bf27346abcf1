"""Whether the audited script can bind a name (`prune_layer`, `Pruner.prune_layer`), told from its
source before it runs (auditor.capture.staging.targets refuses a stage target it cannot).

A mistyped `--stage __main__:Pruner.prune_layr` would otherwise cost a whole run that records no
stage. The script is parsed, never run, so the rule refuses only what provably cannot exist:

- the first name is bound nowhere in the module's scope (a def, class, import, assignment, loop
  or `with` target, walrus, `global` in a function), and nothing binds names dynamically there
  (`from m import *`, `exec`, `globals()` (or bare `vars()`, `locals()`) written to or handed on);
- a later part names a member of a class the script defines (every binding of the name is a
  `class` statement), and neither that class's body nor any base's has it, where every base is
  either such a class, `object`, or a class already imported in this process without a
  metaclass or `__init_subclass__` (a base in a module not loaded yet could hold anything);
  the class has no decorator but `@dataclass` (which adds dunders only) and no class keywords,
  and the part is no dunder (class machinery makes those: `__dict__`, `__module__`, `__eq__`);
  and nothing in the script sets that attribute name on any object (`X.name = ...`,
  `setattr(X, "name", ...)`, or `setattr` with a computed name).

Anything else is left to the run, where auditor.capture.staging.targets.LatePatch says what it found.
"""
from __future__ import annotations

import ast
import builtins
import difflib
import sys
from dataclasses import dataclass
from typing import TypeGuard

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_NO_ARGUMENT_CALLS = {"vars", "locals"}     # their module-level dict, when called bare
_READS = {"get", "items", "keys", "values", "copy", "__contains__", "__getitem__"}
_DATACLASS = {"dataclass", "dataclasses.dataclass"}


@dataclass(frozen=True)
class _Missing:
    """A part provably absent, where it was looked for, and the names there (dotted)."""
    where: str  # "binds no 'prne' at its top level", "defines class Pruner without 'x' ..."
    nearby: list[str]


def check(tree: ast.Module, qualname: str, script_name: str) -> str | None:
    """None when the script may bind `qualname` (found, or not decidable without running it);
    else one line saying what is missing and, when one is close, what is there."""
    module = _Module(tree)
    parts = qualname.split(".")
    missing = module.missing(parts)
    if missing is None:
        return None
    suggestion = _closest(qualname, missing.nearby) or _closest(qualname, module.qualnames())
    hint = f"; did you mean {suggestion}?" if suggestion else ""
    return f"{script_name} {missing.where}{hint}"


def _closest(wanted: str, known: list[str]) -> str | None:
    """The closest name the script defines: the whole dotted path first, then its last part."""
    found = difflib.get_close_matches(wanted, known, n=1, cutoff=0.6)
    if found:
        return found[0]
    last = wanted.rpartition(".")[2]
    by_last: dict[str, str] = {}
    for name in known:
        by_last.setdefault(name.rpartition(".")[2], name)
    found = difflib.get_close_matches(last, list(by_last), n=1, cutoff=0.75)
    return by_last[found[0]] if found else None


class _Module:
    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.bindings = bindings(tree.body)
        self.nodes = list(ast.walk(tree))
        self.parents = {id(child): node for node in self.nodes for child in ast.iter_child_nodes(node)}
        for node in self.nodes:  # `global NAME` in a function binds NAME when it runs
            if isinstance(node, ast.Global):
                for name in node.names:
                    self.bindings.setdefault(name, []).append(node)
        # names bound where no statement shows them: any name may be anything, so nothing is refused
        self.dynamic_namespace = "*" in self.bindings or any(self._binds_any_name(n) for n in self.nodes)
        self.set_attributes: set[str] = set()  # attribute names the script assigns on anything
        self.any_attribute = False  # a setattr with a computed name that may reach a class
        computed: list[ast.expr] = []  # the objects of setattr calls with a computed name
        for node in self.nodes:
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                self.set_attributes.add(node.attr)
            elif _is_call_to(node, "setattr") and len(node.args) >= 2:
                given = node.args[1]
                if isinstance(given, ast.Constant) and isinstance(given.value, str):
                    self.set_attributes.add(given.value)
                else:
                    computed.append(node.args[0])
        if computed:
            classes = {name for name, nodes in self.bindings.items()
                       if any(isinstance(node, ast.ClassDef) for node in nodes)}
            self.any_attribute = any(_names_a_class(target, classes) for target in computed) \
                or self._escapes(classes)

    def _binds_any_name(self, node: ast.AST) -> bool:
        """A call that can bind module names no statement shows: exec(...), or the namespace's
        dict (globals(), bare vars() or locals()) written to or handed on; only read
        (`globals()[name]`, `globals().get(name)`, `name in globals()`), it binds nothing."""
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            return False
        if node.func.id == "exec":
            return True
        if not (node.func.id == "globals" or (node.func.id in _NO_ARGUMENT_CALLS and not node.args)):
            return False
        parent = self.parents.get(id(node))
        if isinstance(parent, ast.Subscript):
            return not isinstance(parent.ctx, ast.Load)
        if isinstance(parent, ast.Attribute):
            return parent.attr not in _READS
        return not isinstance(parent, ast.Compare)

    def _escapes(self, classes: set[str]) -> bool:
        """Whether a class the script defines is handed on as an object (passed, assigned,
        returned), where a setattr with a computed name could reach it; using it by name
        (calling it, reading its attributes, isinstance, a base, an annotation) does not."""
        parents = self.parents
        for node in self.nodes:
            if not (isinstance(node, ast.Name) and node.id in classes and isinstance(node.ctx, ast.Load)):
                continue
            parent = parents.get(id(node))
            if isinstance(parent, ast.Attribute) or (isinstance(parent, ast.Call) and parent.func is node):
                continue
            if isinstance(parent, ast.ClassDef) and node in parent.bases:
                continue
            if _is_call_to(parent, "isinstance") or _is_call_to(parent, "issubclass"):
                continue
            if isinstance(parent, (ast.arg, ast.AnnAssign, ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and node is getattr(parent, "annotation", getattr(parent, "returns", None)):
                continue
            if isinstance(parent, ast.Tuple) and (_is_call_to(parents.get(id(parent)), "isinstance")
                                                  or _is_call_to(parents.get(id(parent)), "issubclass")):
                continue  # isinstance(x, (A, B))
            return True
        return False

    def missing(self, parts: list[str]) -> _Missing | None:
        top = parts[0]
        if self.dynamic_namespace:
            return None
        if top not in self.bindings:
            return _Missing(f"binds no {top!r} at its top level", [])
        candidates: list[ast.AST] = list(self.bindings[top])
        path = top
        for part in parts[1:]:
            if not all(isinstance(node, ast.ClassDef) for node in candidates):
                return None  # a function, an import, an assignment: its attributes show at run time
            if part in self.set_attributes or self.any_attribute:
                return None
            found: list[ast.AST] = []
            for node in candidates:
                answer = self._member(node, part, subclass=False, seen=set())  # type: ignore[arg-type]
                if answer is None:
                    return None
                found.extend(answer)
            if not found:
                nearby = {f"{path}.{name}" for node in candidates for name in self._members(node, set())}
                return _Missing(f"defines class {path} without {part!r} in its body or bases", sorted(nearby))
            candidates, path = found, f"{path}.{part}"
        return None

    def _member(self, cls: ast.ClassDef, part: str, subclass: bool, seen: set[int]) -> list[ast.AST] | None:
        """The nodes binding `part` in `cls` or its bases ([] when provably none); None when it
        cannot be told. `subclass`: looked up for a class deriving from `cls`."""
        if id(cls) in seen:
            return None
        seen = seen | {id(cls)}
        members = bindings(cls.body)
        if part in members:
            return members[part]
        if (part.startswith("__") and part.endswith("__")) or cls.keywords:
            return None  # class machinery makes dunders (__dict__, __module__, dataclass's __eq__)
        if subclass and "__init_subclass__" in members:
            return None  # it may give its subclasses anything
        for decorator in cls.decorator_list:
            if _dotted(decorator.func if isinstance(decorator, ast.Call) else decorator) not in _DATACLASS:
                return None
        found: list[ast.AST] = []
        for base in cls.bases:
            answer = self._in_base(base, part, seen)
            if answer is None:
                return None
            found.extend(answer)
        return found

    def _in_base(self, base: ast.expr, part: str, seen: set[int]) -> list[ast.AST] | None:
        dotted = _dotted(base)
        if dotted is None:
            return None  # Generic[T], a call, a starred list
        root = dotted.split(".")[0]
        nodes = self.bindings.get(root)
        if nodes is None:  # a builtin (object, Exception, dict), or a NameError when it runs
            if root not in vars(builtins):
                return None
            return _in_class_object(_follow(builtins, dotted), part)
        if len(nodes) != 1 and not all(isinstance(node, ast.ClassDef) for node in nodes):
            return None
        if "." not in dotted and all(isinstance(node, ast.ClassDef) for node in nodes):
            found: list[ast.AST] = []
            for node in nodes:
                answer = self._member(node, part, subclass=True, seen=seen)  # type: ignore[arg-type]
                if answer is None:
                    return None
                found.extend(answer)
            return found
        return _in_class_object(_imported(nodes[0], dotted), part)

    def _members(self, cls: ast.AST, seen: set[int]) -> set[str]:
        """The names `cls` has from its body and the bases the script defines (no dunders)."""
        if not isinstance(cls, ast.ClassDef) or id(cls) in seen:
            return set()
        seen.add(id(cls))
        names = {name for name in bindings(cls.body) if not (name.startswith("__") and name.endswith("__"))}
        for base in cls.bases:
            if isinstance(base, ast.Name):
                for node in self.bindings.get(base.id, []):
                    names |= self._members(node, seen)
        return names

    def qualnames(self) -> list[str]:
        """Every name the script binds at its top level, and its classes' members (dotted)."""
        names: list[str] = []
        pending: list[tuple[str, dict[str, list[ast.AST]]]] = [("", self.bindings)]
        while pending:
            prefix, scope = pending.pop()
            for name, nodes in scope.items():
                if name == "*" or (prefix and name.startswith("__") and name.endswith("__")):
                    continue
                names.append(prefix + name)
                for node in nodes:
                    if isinstance(node, ast.ClassDef):
                        pending.append((f"{prefix}{name}.", bindings(node.body)))
        return sorted(set(names))


def bindings(body: list[ast.stmt]) -> dict[str, list[ast.AST]]:
    """Each name a scope's statements bind, with the nodes that bind it, not looking inside the
    functions and classes it defines (whose names are their own). Comprehension variables are
    counted too: one name too many never refuses a name that exists."""
    found: dict[str, list[ast.AST]] = {}
    pending: list[ast.AST] = list(body)
    while pending:
        node = pending.pop()
        name = None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.setdefault(node.name, []).append(node)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                found.setdefault(alias.asname or alias.name.split(".")[0], []).append(node)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            name = node.id
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
            name = node.name
        elif isinstance(node, ast.MatchMapping):
            name = node.rest
        if name:
            found.setdefault(name, []).append(node)
        pending.extend(ast.iter_child_nodes(node))
    return found


def _names_a_class(node: ast.expr, classes: set[str]) -> bool:
    """setattr's object is a class: one the script names, `cls`, `type(x)` or `x.__class__`."""
    if isinstance(node, ast.Name):
        return node.id in classes or node.id in ("cls", "klass", "mcs")
    if isinstance(node, ast.Attribute):
        return node.attr == "__class__"
    return _is_call_to(node, "type")


def _is_call_to(node: ast.AST | None, name: str) -> TypeGuard[ast.Call]:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name


def _dotted(node: ast.expr) -> str | None:
    """`a.b.C` for a chain of names, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _imported(node: ast.AST, dotted: str) -> object | None:
    """What an import statement's name (plus the rest of `dotted`) is, from a module this
    process has loaded already; None when it would take importing (never done here)."""
    root, _, rest = dotted.partition(".")
    if isinstance(node, ast.Import):
        alias = next(a for a in node.names if (a.asname or a.name.split(".")[0]) == root)
        module = sys.modules.get(alias.name if alias.asname else root)
        return _follow(module, rest) if module is not None else None
    if isinstance(node, ast.ImportFrom) and not node.level and node.module:
        module = sys.modules.get(node.module)
        alias = next(a for a in node.names if (a.asname or a.name) == root)
        obj = getattr(module, alias.name, None) if module is not None else None
        return _follow(obj, rest) if obj is not None else None
    return None


def _follow(obj: object | None, dotted: str) -> object | None:
    for part in filter(None, dotted.split(".")):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _in_class_object(cls: object | None, part: str) -> list[ast.AST] | None:
    """[] when a loaded class provably lacks `part` (and cannot gain it as a base), a non-empty
    list when it has it; None when that cannot be told."""
    if not isinstance(cls, type) or type(cls) is not type:
        return None  # not a class, or one with a metaclass
    for klass in cls.__mro__:
        if part in vars(klass):
            return [ast.Pass()]  # found in a loaded class: nothing further to check statically
        if klass is not object and "__init_subclass__" in vars(klass):
            return None
    return []
