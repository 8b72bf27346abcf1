"""The audited script, run as `python SCRIPT` runs it, with its own functions reachable by name.

Research scripts define what is worth staging in the script itself (`def get_llm(...)`,
`def prune_layer(...)`, then `if __name__ == "__main__": main()`). Those functions live in the
script's `__main__` namespace, which exists only while it runs, and each `def` binds them anew:
a patch made before the run would be overwritten, and importing the script under its file name
(`prune:get_llm`) gives another copy that the script never calls. So the script is declared
(`declare`), a target naming it (`prune:get_llm`, or `__main__:get_llm`) is resolved from its
source without running it (auditor.targets), and `run` compiles the script with one call after
each top-level statement that binds a watched name (`def`, `class`, an assignment, an import):
the call patches the new binding there (auditor.targets.LatePatch), before any later line can
call it. Line numbers, `__file__` (absolute, as python gives it), `sys.argv` and tracebacks stay
the script's own. A script nobody watches runs unchanged.

    main_script.declare("prune.py")
    with auditor.Audit(stage_targets=["prune:prune_layer"]):
        main_script.run("prune.py")
"""
from __future__ import annotations

import ast
import builtins
import importlib.util
import io
import os
import sys
import types
from collections.abc import Callable

_declared: str | None = None  # the script this process runs as __main__ (its real path)
_watching: dict[tuple[str, str], list[Callable[[types.ModuleType], None]]] = {}
HOOK = "__import__('auditor.main_script', fromlist=['bound']).bound({name!r}, globals())"


def declare(script: str | os.PathLike) -> None:
    """`script` is the one this process runs as __main__ (targets may name it)."""
    global _declared
    _declared = os.path.realpath(script)


def declared_for(module_name: str) -> str | None:
    """The declared script's path when `module_name` names it: `__main__`, or the module its
    file would be imported as from its folder (its stem); else None."""
    if _declared is None:
        return None
    if module_name == "__main__":
        return _declared
    if module_name != os.path.splitext(os.path.basename(_declared))[0]:
        return None
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return _declared if origin and os.path.realpath(origin) == _declared else None


def top_level_names(script: str) -> set[str]:
    """The names the script binds at its top level (in any `if`/`try`/`with`/loop there too)."""
    return {name for statement in _module_statements(_parse(script)) for name in _bound_names(statement)}


def watch(script: str, name: str, on_bound: Callable[[types.ModuleType], None]) -> Callable[[], None]:
    """Call `on_bound(module)` each time the script binds `name` at its top level; returns the
    function that stops watching."""
    key = (os.path.realpath(script), name)
    _watching.setdefault(key, []).append(on_bound)

    def stop() -> None:
        callbacks = _watching.get(key, [])
        if on_bound in callbacks:
            callbacks.remove(on_bound)
        if not callbacks:
            _watching.pop(key, None)
    return stop


def bound(name: str, namespace: dict) -> None:
    """Called by the compiled script after it binds `name`."""
    module = sys.modules.get("__main__")
    if module is None or vars(module) is not namespace:
        return
    for on_bound in list(_watching.get((os.path.realpath(namespace.get("__file__", "")), name), [])):
        on_bound(module)


def run(script: str | os.PathLike) -> None:
    """Run `script` as __main__, as `python SCRIPT` does (sys.argv is the caller's to set)."""
    path = os.path.abspath(script)
    tree = _parse(path)
    watched = {name for (file, name) in _watching if file == os.path.realpath(path)}
    if watched:
        _add_hooks(tree, watched)
    code = compile(tree, path, "exec", dont_inherit=True)
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins, __loader__=None,
                           __package__=None, __spec__=None)
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _parse(path: str) -> ast.Module:
    with io.open_code(path) as source:  # bytes: the script's own encoding declaration applies
        return ast.parse(source.read(), filename=path)


def _module_statements(tree: ast.Module):
    """Every statement run at the top level: the module's, and those inside its compound
    statements (not inside functions or classes)."""
    pending = list(tree.body)
    while pending:
        statement = pending.pop(0)
        yield statement
        pending[0:0] = [inner for owner, field in _blocks_of(statement) for inner in getattr(owner, field)]


def _bound_names(statement: ast.stmt) -> list[str]:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [statement.name]
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return [alias.asname or alias.name.split(".")[0] for alias in statement.names]
    targets: list[ast.expr] = []
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        targets = [statement.target]
    return [node.id for target in targets for node in ast.walk(target) if isinstance(node, ast.Name)]


def _add_hooks(tree: ast.Module, watched: set[str]) -> None:
    """After each top-level statement binding a watched name, the call that patches it."""
    def hooked(body: list[ast.stmt]) -> list[ast.stmt]:
        out = []
        for statement in body:
            for inner in _blocks_of(statement):
                setattr(*inner, hooked(getattr(*inner)))
            out.append(statement)
            for name in _bound_names(statement):
                if name in watched:
                    call = ast.parse(HOOK.format(name=name)).body[0]
                    out.append(ast.copy_location(call, statement))
        return out
    tree.body = hooked(tree.body)
    ast.fix_missing_locations(tree)


def _blocks_of(statement: ast.stmt) -> list[tuple[object, str]]:
    """(owner, field) of each statement list run at the same top level as `statement`."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return []
    blocks: list[tuple[object, str]] = [(statement, f) for f in ("body", "orelse", "finalbody")
                                        if getattr(statement, f, None)]
    blocks += [(h, "body") for h in getattr(statement, "handlers", None) or []]
    blocks += [(c, "body") for c in getattr(statement, "cases", None) or []]
    return blocks
