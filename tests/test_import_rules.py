"""Layers that hold: data flows capture -> run record -> analysis -> renderers, and a lower
layer never imports a higher one. Every import statement of the packages is read (those inside
functions too), so a late import cannot hide a break.

    architectures  model facts (configs, sizes, options, saved activations), nothing of the
                   auditor but how sizes are written
    gradprobe      the algorithm; architectures only
    capture        auditor/*.py and auditor/probes/: stages, meters, the record
    analysis       reads records; starts nothing, renders nothing
    renderers      formats what analysis gives; no meters, no runs
    comparison     compare's machinery; knows no algorithm
    jobs           workloads and fresh processes (GradProbe knowledge lives here)
    cli            the commands: may use everything
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("architectures", "gradprobe", "auditor")
AUDITOR_LAYERS = ("analysis", "renderers", "comparison", "jobs", "cli")
# What each layer may not import (its own layer and the ones below it are always allowed).
FORBIDDEN = {
    "architectures": {"gradprobe", "capture", "analysis", "renderers", "comparison", "jobs", "cli"},
    "gradprobe": {"capture", "analysis", "renderers", "comparison", "jobs", "cli"},
    "capture": {"gradprobe", "analysis", "renderers", "comparison", "jobs", "cli"},
    "analysis": {"gradprobe", "renderers", "comparison", "jobs", "cli", "probes"},
    "renderers": {"gradprobe", "comparison", "jobs", "cli", "probes"},
    "comparison": {"gradprobe", "renderers", "jobs", "cli"},
    "jobs": {"cli"},
    "cli": set(),
}
ENTRY_POINTS = {"auditor/__main__.py"}  # `python -m auditor` hands over to the cli
# The one fresh-process runner lives in jobs/ and compare's sides run through it too; sizes
# are written the same way everywhere (units imports nothing).
SHARED = {("comparison", "auditor.jobs.fresh_process"), ("architectures", "auditor.units")}


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "auditor":
        return parts[0]
    return parts[1] if len(parts) > 1 and parts[1] in AUDITOR_LAYERS else "capture"


def layers_named(module: str) -> set[str]:
    """The module's layer, and "probes" too for a meter (analysis and renderers may not read one)."""
    named = {layer(module)}
    if module.startswith("auditor.probes"):
        named.add("probes")
    return named


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, module: str):
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            yield node.lineno, name
            for alias in node.names:  # `from auditor import jobs` names a layer too
                yield node.lineno, f"{name}.{alias.name}"


def breaks() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = str(path.relative_to(ROOT))
            if source in ENTRY_POINTS:
                continue
            module = module_of(path)
            for line, name in imported(path, module):
                if name.split(".")[0] not in PACKAGES or name.split(".") == ["auditor"]:
                    continue
                if any(layer(module) == who and (name + ".").startswith(what + ".") for who, what in SHARED):
                    continue
                bad = layers_named(name) & FORBIDDEN[layer(module)]
                if bad and not (name.startswith("auditor.") and layer(name) == layer(module)):
                    found.append(f"{source}:{line} ({layer(module)}) imports {name} ({', '.join(sorted(bad))})")
    return found


def test_no_layer_imports_a_higher_one():
    assert breaks() == []


def test_the_rule_catches_a_break(tmp_path, monkeypatch):
    """A renderer that reads a meter, and analysis that starts a job, are both found."""
    for name, text in (("renderers/bad_renderer.py", "from auditor.probes import rss\n"),
                       ("analysis/bad_analysis.py", "def f():\n    from auditor.jobs import fresh_process\n")):
        target = tmp_path / "auditor" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = breaks()
    assert any("bad_renderer.py:1 (renderers) imports auditor.probes" in b for b in found), found
    assert any("bad_analysis.py:2 (analysis) imports auditor.jobs" in b for b in found), found
