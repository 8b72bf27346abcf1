"""The audited program, run as python runs it (`python SCRIPT`, `python -m MODULE`, `python -c
CODE`), with its own functions reachable by name.

Research scripts define what is worth staging in the script itself (`def get_llm(...)`,
`def prune_layer(...)`, then `if __name__ == "__main__": main()`). Those functions live in the
program's `__main__` namespace, which exists only while it runs, and each `def` binds them anew:
a patch made before the run would be overwritten, and importing the script under its file name
(`prune:get_llm`) gives another copy that the program never calls. So the program is declared
(`Main.declare`), a target naming it (`prune:get_llm` for a script, the module's own name for
-m, or `__main__:get_llm` for any of the three) is checked in its source without running it
(auditor.capture.staging.targets, auditor.capture.staging.script_names), and `run` compiles the
program with one call after each top-level statement that binds a watched name (`def`, `class`,
an assignment, an import): the call patches the new binding there
(auditor.capture.staging.targets.LatePatch), before any later line can call it. Line numbers,
`__file__`, `__spec__`, `sys.argv` and tracebacks stay what python gives. A program nobody
watches runs unchanged.

    main = Main(module="mylib.prune")          # or Main(script="prune.py"), Main(code="...")
    main.declare()
    with auditor.Audit(stage_targets=["__main__:prune_layer"]):
        main.run(["--sparsity", "0.5"])        # sys.argv as python sets it, then the program
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
from dataclasses import dataclass

from auditor.capture import recursion

CODE_FILE = "<string>"  # the file name python gives the code of `-c` (tracebacks, code objects)
HOOK = "__import__('auditor.capture.staging.main_script', fromlist=['bound']).bound({name!r}, globals(), {key!r})"


@dataclass(frozen=True)
class Main:
    """What runs as __main__, as python's command line names it: exactly one of a script's path,
    a module's name (-m) or a code string (-c)."""
    script: str | None = None
    module: str | None = None
    code: str | None = None

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.script, self.module, self.code)) != 1:
            raise ValueError("a program is exactly one of a script, -m MODULE or -c CODE")

    def command(self) -> list[str]:
        """As typed after `python`: ["prune.py"], ["-m", "mylib.prune"], ["-c", CODE]."""
        if self.script is not None:
            return [self.script]
        return ["-m", self.module] if self.module is not None else ["-c", self.code or ""]

    def name(self) -> str:
        """A run's default name: the script's stem, the module's name, or "code"."""
        if self.script is not None:
            return os.path.splitext(os.path.basename(self.script))[0]
        return self.module if self.module is not None else "code"

    def path_entry(self) -> str:
        """What python puts first on sys.path for it: the script's folder, the current folder
        (its full path, for -m), or "" (for -c)."""
        if self.script is not None:
            return os.path.dirname(os.path.realpath(self.script))
        return os.getcwd() if self.module is not None else ""

    def filename(self) -> str:
        """The file its code objects name (tracebacks): the absolute path, or "<string>"."""
        if self.code is not None:
            return CODE_FILE
        return os.path.abspath(self.script if self.script is not None else module_spec(self.module or "").origin)

    def check(self) -> None:
        """ValueError (one line) unless it can be found: the script a file, the module importable
        as python -m would find it. Imports a module's parent packages, as python -m does."""
        if self.script is not None and not os.path.isfile(self.script):
            what = "is not a file" if os.path.exists(self.script) else "does not exist"
            raise ValueError(f"script {self.script!r} {what}; give the path of a Python script")
        if self.module is not None:
            module_spec(self.module)

    def declare(self) -> None:
        """This process runs it as __main__: targets may name its own functions."""
        global _declared
        if self.code is not None:
            _declared = _Declared(CODE_FILE, None, self.code)
        elif self.module is not None:
            spec = module_spec(self.module)
            _declared = _Declared(os.path.realpath(spec.origin or ""), spec.name, None)
        else:
            _declared = _Declared(os.path.realpath(self.script or ""), None, None)

    def run(self, args: list[str]) -> None:
        """Set sys.argv as python does (argv[0]: the script as typed, the module's file, or
        "-c"), then run it as __main__."""
        if self.script is not None:
            sys.argv = [self.script, *args]
            run(self.script)
        elif self.module is not None:
            sys.argv = ["-m", *args]  # python's argv[0] while it looks for the module
            spec = module_spec(self.module)
            sys.argv[0] = spec.origin or ""
            _run_module(spec)
        else:
            sys.argv = ["-c", *args]
            _execute(ast.parse(self.code or "", CODE_FILE), CODE_FILE, CODE_FILE, {})


@dataclass(frozen=True)
class _Declared:
    key: str            # the program's file (its real path), or "<string>" for -c
    module: str | None  # the name -m ran it as (pkg.__main__ for a package)
    source: str | None  # -c's code; a file's is read from the file


_declared: _Declared | None = None  # the program this process runs as __main__
_watching: dict[tuple[str, str], list[Callable[[types.ModuleType], None]]] = {}


def declare(script: str | os.PathLike) -> None:
    """`script` is the one this process runs as __main__ (targets may name it)."""
    Main(script=os.fspath(script)).declare()


def module_spec(name: str):
    """The spec of the module `python -m NAME` runs (a package's __main__), found as python -m
    finds it; ValueError (one line) when there is none. Imports the parent packages."""
    if not name or name.startswith("."):
        raise ValueError(f"-m {name!r}: give a module's absolute name, such as mylib.prune")
    parent = name.rpartition(".")[0]
    try:
        if parent:
            __import__(parent)
        spec = importlib.util.find_spec(name)
    except ImportError as error:
        raise ValueError(f"-m {name}: no module named {error.name or name!r}") from None
    except Exception as error:  # a parent package's own code failed, or a malformed name
        raise ValueError(f"-m {name}: importing it failed: {type(error).__name__}: {error}") from None
    if spec is None:
        raise ValueError(f"-m {name}: no module named {name!r}")
    if spec.submodule_search_locations is not None:  # a package runs its __main__
        if name == "__main__" or name.endswith(".__main__"):
            raise ValueError(f"-m {name}: a package cannot run as __main__")
        try:
            return module_spec(f"{name}.__main__")
        except ValueError:
            raise ValueError(f"-m {name}: {name!r} is a package without a __main__ module, so it "
                             "cannot be run") from None
    if spec.loader is None or not spec.origin or not os.path.isfile(spec.origin):
        raise ValueError(f"-m {name}: {name!r} has no Python file to run (a built-in or namespace module)")
    return spec


def declared_for(module_name: str) -> str | None:
    """The declared program's file (or "<string>") when `module_name` names it: `__main__`, the
    module -m ran, or the module a script's file would be imported as from its folder (its stem);
    else None."""
    if _declared is None:
        return None
    if module_name == "__main__":
        return _declared.key
    if _declared.module is not None or _declared.source is not None:
        return _declared.key if module_name == _declared.module else None
    if module_name != os.path.splitext(os.path.basename(_declared.key))[0]:
        return None
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return _declared.key if origin and os.path.realpath(origin) == _declared.key else None


def parse(script: str) -> ast.Module:
    """The declared program's source, parsed (never run): a file's path, or "<string>" for -c.
    Raises OSError, SyntaxError or ValueError."""
    return _parse(script if script == CODE_FILE else os.path.realpath(script))


def watch(script: str, name: str, on_bound: Callable[[types.ModuleType], None]) -> Callable[[], None]:
    """Call `on_bound(module)` each time the program binds `name` at its top level; returns the
    function that stops watching."""
    key = (_key(script), name)
    _watching.setdefault(key, []).append(on_bound)

    def stop() -> None:
        callbacks = _watching.get(key, [])
        if on_bound in callbacks:
            callbacks.remove(on_bound)
        if not callbacks:
            _watching.pop(key, None)
    return stop


def bound(name: str, namespace: dict, key: str | None = None) -> None:
    """Called by the compiled program after it binds `name`."""
    module = sys.modules.get("__main__")
    if module is None or vars(module) is not namespace:
        return
    key = key if key is not None else os.path.realpath(namespace.get("__file__", ""))
    for on_bound in list(_watching.get((key, name), [])):
        on_bound(module)


def run(script: str | os.PathLike) -> None:
    """Run `script` as __main__, as `python SCRIPT` does (sys.argv is the caller's to set)."""
    path = os.path.abspath(script)
    _execute(_parse(path), path, os.path.realpath(path),
             dict(__file__=path, __cached__=None, __loader__=None, __package__=None, __spec__=None))


def _run_module(spec) -> None:
    """The module of `spec` as __main__, with the globals python -m gives it (runpy's)."""
    origin = spec.origin
    attributes = dict(__file__=origin, __cached__=spec.cached, __loader__=spec.loader,
                      __package__=spec.parent, __spec__=spec)
    get_source = getattr(spec.loader, "get_source", None)
    source = get_source(spec.name) if get_source is not None else None
    if source is None:  # no source to compile (a .pyc alone): the loader's code, unwatched
        _exec(spec.loader.get_code(spec.name), attributes)
        return
    _execute(ast.parse(source, filename=origin), origin, os.path.realpath(origin), attributes)


def _execute(tree: ast.Module, filename: str, key: str, attributes: dict) -> None:
    """Compile `tree` as `filename`, with the hooks of the names watched in `key`, and run it."""
    watched = {name for (file, name) in _watching if file == key}
    if watched:
        _add_hooks(tree, watched, key)
    _exec(compile(tree, filename, "exec", dont_inherit=True), attributes)


def _exec(code: types.CodeType, attributes: dict) -> None:
    module = types.ModuleType("__main__")
    module.__dict__.update(__builtins__=builtins, **attributes)
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    # The runner's frames below the program's are lent to the recursion limit: it recurses as
    # deep as alone (where python has none below a script's frame, and runpy's two below -m's).
    below = 0
    frame: types.FrameType | None = sys._getframe()
    while frame is not None:
        below, frame = below + 1, frame.f_back
    lent = max(0, below + 2 - (2 if attributes.get("__spec__") is not None else 0))  # +2: exec's own
    recursion.lend(lent)
    try:
        exec(code, module.__dict__)
    finally:
        recursion.take_back(lent)
        if saved is not None:
            sys.modules["__main__"] = saved


def _key(script: str) -> str:
    return script if script == CODE_FILE else os.path.realpath(script)


def _parse(path: str) -> ast.Module:
    if path == CODE_FILE:
        if _declared is None or _declared.source is None:
            raise ValueError("no code was declared (-c)")
        return ast.parse(_declared.source, filename=CODE_FILE)
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


def _add_hooks(tree: ast.Module, watched: set[str], key: str) -> None:
    """After each top-level statement binding a watched name, the call that patches it."""
    def hooked(body: list[ast.stmt]) -> list[ast.stmt]:
        out = []
        for statement in body:
            for inner in _blocks_of(statement):
                setattr(*inner, hooked(getattr(*inner)))
            out.append(statement)
            for name in _bound_names(statement):
                if name in watched:
                    call = ast.parse(HOOK.format(name=name, key=key)).body[0]
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
