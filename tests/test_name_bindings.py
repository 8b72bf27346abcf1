"""Staging a function that other modules imported by name (`from lib.prune import prune`)."""
from __future__ import annotations

import sys
import textwrap

import pytest

from auditor.capture.staging import name_bindings


@pytest.fixture
def two_modules(tmp_path, monkeypatch):
    (tmp_path / "lib_prune.py").write_text(textwrap.dedent("""
        def prune(x):
            return x * 2
    """))
    (tmp_path / "lib_main.py").write_text(textwrap.dedent("""
        from lib_prune import prune
        alias = prune
        def run(x):
            return prune(x)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import lib_main
    import lib_prune
    yield lib_prune, lib_main
    for name in ("lib_prune", "lib_main"):
        sys.modules.pop(name, None)


def test_every_module_level_copy_is_rebound_and_restored(two_modules):
    lib_prune, lib_main = two_modules
    original = lib_prune.prune

    def replacement(x):
        return -1
    done = name_bindings.rebind(original, replacement, skip=vars(lib_prune))
    assert {(name) for _, name, _, _ in done} == {"prune", "alias"}
    assert lib_main.run(3) == -1 and lib_main.alias is replacement
    assert lib_prune.prune is original  # the skipped namespace is the caller's to patch
    name_bindings.restore(done)
    assert lib_main.prune is original and lib_main.alias is original and lib_main.run(3) == 6


def test_a_name_the_program_rebound_meanwhile_keeps_its_value(two_modules):
    lib_prune, lib_main = two_modules
    done = name_bindings.rebind(lib_prune.prune, lambda x: -1)
    mine = lambda x: 42  # noqa: E731
    lib_main.prune = mine
    name_bindings.restore(done)
    assert lib_main.prune is mine and lib_main.alias is lib_prune.prune


def test_an_audit_stages_the_copy_the_caller_imported_by_name(two_modules, tmp_path):
    import auditor
    lib_prune, lib_main = two_modules
    with auditor.Audit(tmp_path / "run", stage_targets=["lib_prune:prune"]) as audit:
        assert lib_main.run(3) == 6  # calls its own `prune`, bound before the audit began
    assert [s["name"] for s in audit.record["stages"]] == ["prune"]
    assert lib_main.prune is lib_prune.prune and not hasattr(lib_main.prune, "__auditor_target__")
