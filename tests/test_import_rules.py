"""The floor plan holds: data flows capture -> run record -> analysis -> report models ->
renderers, each folder imports only the floors listed for it below, no module imports itself back
through a cycle, and renderers never call back into analysis (they read its types only). Every
import statement is read, those inside functions too, so a late import cannot hide a break.
ARCHITECTURE.md says the same in prose.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("architectures", "gradprobe", "auditor")

# Which floors each floor may import (its own is always allowed). No catch-all: a module whose
# floor is not named here fails the test until it is placed.
ALLOWED = {
    "facts": set(),                                    # auditor/facts: imports nothing of the auditor
    "architectures": {"facts"},                        # model facts; sizes written as the auditor writes them
    "gradprobe": {"architectures"},                    # the algorithm
    "record": {"facts"},                               # the run record on disk
    "capture": {"facts", "record", "architectures"},   # Audit, probes, census, staging, tracing
    "analysis": {"facts", "record", "architectures"},  # pure functions over records
    "report_models": {"facts", "record", "analysis"},  # each report's content, computed once
    "renderers": {"facts", "record", "report_models", "analysis"},  # analysis: its types only (below)
    "comparison": {"facts", "record", "capture"},      # compare's machinery; knows no algorithm
    "api": {"facts", "record", "capture"},             # auditor/__init__.py, the pytest plugin
    "jobs": {"api", "facts", "record", "capture", "analysis", "comparison", "architectures", "gradprobe"},
    "cli": {"api", "facts", "record", "capture", "analysis", "report_models", "renderers", "comparison", "jobs",
            "architectures", "gradprobe"},
}
FLOORS_OF_AUDITOR = {"facts", "record", "capture", "analysis", "report_models", "renderers", "comparison", "jobs",
                     "cli"}
TOP_LEVEL = {"auditor": "api", "auditor.pytest_plugin": "api", "auditor.__main__": "cli"}
MAX_LOOSE = 6      # modules directly under auditor/
MAX_LINES = 600    # per file in auditor/ and gradprobe/


def floor(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "auditor":
        return parts[0]
    if module in TOP_LEVEL:
        return TOP_LEVEL[module]
    return parts[1] if parts[1] in FLOORS_OF_AUDITOR else None


def module_of(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    return {module_of(path, root): path for package in PACKAGES for path in sorted((root / package).rglob("*.py"))}


def imports(path: Path, module: str, known: set[str]):
    """(line, module imported, names taken from it) for each import; `from P import m` where P.m
    is a module counts as importing P.m."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            plain = []
            for alias in node.names:
                if f"{name}.{alias.name}" in known:
                    yield node.lineno, f"{name}.{alias.name}", ()
                else:
                    plain.append(alias.name)
            if plain:
                yield node.lineno, name, tuple(plain)


def graph(root: Path) -> tuple[dict[str, Path], dict[str, list[tuple[int, str, tuple[str, ...]]]]]:
    found = modules(root)
    known = set(found)
    edges = {}
    for module, path in found.items():
        edges[module] = [(line, name, names) for line, name, names in imports(path, module, known)
                         if name.split(".")[0] in PACKAGES]
    return found, edges


def breaks(root: Path = ROOT) -> list[str]:
    found, edges = graph(root)
    out = []
    for module, path in found.items():
        source = str(path.relative_to(root))
        here = floor(module)
        if here not in ALLOWED:
            out.append(f"{source}: in no floor (place it in one of {', '.join(sorted(FLOORS_OF_AUDITOR))})")
            continue
        for line, name, _ in edges[module]:
            there = floor(name)
            if there != here and there not in ALLOWED[here]:
                out.append(f"{source}:{line} ({here}) imports {name} ({there})")
    return out


def cycles(root: Path = ROOT) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    found, edges = graph(root)
    targets = {m: sorted({n for _, n, _ in edges[m] if n in found and n != m}) for m in found}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in targets[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(found):
        if module not in index:
            visit(module)
    return groups


def renderer_calls_into_analysis(root: Path = ROOT) -> list[str]:
    """Names a renderer takes from analysis or report models that are not types or constants:
    a renderer formats the model it is given and never computes it again."""
    found, edges = graph(root)
    out = []
    for module, path in found.items():
        if floor(module) != "renderers":
            continue
        for line, name, names in edges[module]:
            if floor(name) not in ("analysis", "report_models"):
                continue
            if not names:
                out.append(f"{path.relative_to(root)}:{line} imports the module {name} (take its types by name)")
                continue
            imported = importlib.import_module(name)
            for taken in names:
                value = getattr(imported, taken)
                if callable(value) and not inspect.isclass(value):
                    out.append(f"{path.relative_to(root)}:{line} takes {name}.{taken}, a function")
    return out


def test_each_floor_imports_only_the_floors_below_it():
    assert breaks() == []


def test_no_import_cycle():
    assert cycles() == []


def test_renderers_read_report_models_and_never_call_analysis():
    assert renderer_calls_into_analysis() == []


def test_the_house_keeps_its_size():
    loose = sorted(p.name for p in (ROOT / "auditor").glob("*.py"))
    assert len(loose) <= MAX_LOOSE, loose
    long = [f"{p.relative_to(ROOT)}: {n} lines" for package in ("auditor", "gradprobe")
            for p in sorted((ROOT / package).rglob("*.py")) if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert long == []


def test_the_rules_catch_a_break_a_cycle_and_a_stray(tmp_path):
    """A renderer that reads a meter, analysis that starts a job, two modules that import each
    other and a module loose in no floor are all found."""
    for name, text in (("renderers/bad_renderer.py", "from auditor.capture.probes import rss\n"),
                       ("analysis/bad_analysis.py", "def f():\n    from auditor.jobs import gradprobe\n"),
                       ("analysis/a.py", "from auditor.analysis import b\n"),
                       ("analysis/b.py", "from auditor.analysis.a import X\n"),
                       ("stray.py", "")):
        target = tmp_path / "auditor" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    found = breaks(tmp_path)
    assert any("bad_renderer.py:1 (renderers) imports auditor.capture.probes (capture)" in b for b in found), found
    assert any("bad_analysis.py:2 (analysis) imports auditor.jobs (jobs)" in b for b in found), found
    assert any("stray.py: in no floor" in b for b in found), found
    assert cycles(tmp_path) == [["auditor.analysis.a", "auditor.analysis.b"]]
