"""Staging callables from outside: resolution, patching and restoring, numbering, failures."""
from __future__ import annotations

import sys
import textwrap
import uuid

import pytest

import auditor
from auditor.capture.staging.targets import Staging, resolve


class Worker:
    def step(self, x):
        return x * 2

    def explode(self):
        raise ValueError("no good")

    @staticmethod
    def helper(x):
        return x + 1

    @classmethod
    def build(cls):
        return cls()


class Special(Worker):
    pass


def free_function(x):
    return -x


@pytest.fixture
def module_on_path(tmp_path, monkeypatch):
    """A fresh importable module (unique name) defining a class and a function."""
    name = f"staged_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        class Pruner:
            def phase(self, n):
                return n + 1

        def compute(n):
            return n * 3

        LIMIT = 4
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_repeated_calls_of_a_staged_method_are_numbered(tmp_path, module_on_path):
    module = __import__(module_on_path)
    original = module.Pruner.phase
    pruner = module.Pruner()
    with auditor.Audit(tmp_path / "run", stage_targets=[f"{module_on_path}:Pruner.phase",
                                                          f"{module_on_path}:compute"]) as audit:
        assert module.Pruner.phase is not original
        with auditor.stage("prune"):
            results = [pruner.phase(i) for i in range(3)]
        assert module.compute(2) == 6
    assert results == [1, 2, 3]
    assert [s["path"] for s in audit.record["stages"]] == [
        "prune", "prune/Pruner.phase", "prune/Pruner.phase#2", "prune/Pruner.phase#3", "compute"]
    assert module.Pruner.phase is original  # restored
    assert pruner.phase(1) == 2


def test_objects_as_targets_and_descriptors_survive(tmp_path):
    originals = {name: Worker.__dict__[name] for name in ("step", "helper", "build")}
    with auditor.Audit(tmp_path / "run", stage_targets=[Worker.step, Worker.helper, Worker.build,
                                                          free_function]) as audit:
        assert Worker().step(2) == 4
        assert Worker.helper(1) == 2 and Worker().helper(1) == 2
        assert isinstance(Worker.build(), Worker)
        assert sys.modules[__name__].free_function(3) == -3
    names = [s["name"] for s in audit.record["stages"]]
    assert names == ["Worker.step", "Worker.helper", "Worker.helper#2", "Worker.build",
                     "free_function"]
    for name, raw in originals.items():
        assert Worker.__dict__[name] is raw


def test_inherited_method_staged_on_a_subclass_is_removed_afterwards(tmp_path):
    assert "step" not in Special.__dict__
    with auditor.Audit(tmp_path / "run", stage_targets=[f"{__name__}:Special.step"]) as audit:
        assert Special().step(1) == 2
        assert Worker().step(1) == 2  # the base class is untouched
    assert [s["name"] for s in audit.record["stages"]] == ["Special.step"]
    assert "step" not in Special.__dict__


def test_a_staged_method_that_raises_fails_its_stage_and_propagates(tmp_path):
    with pytest.raises(ValueError, match="no good"), auditor.Audit(tmp_path / "run", stage_targets=[Worker.explode]):
        Worker().explode()
    record = auditor.load(tmp_path / "run")  # complete on disk
    (entry,) = record.stages
    assert (entry.name, entry.status, entry.error) == ("Worker.explode", "failed", "ValueError: no good")
    assert entry.rss.end is not None and entry.end_s >= entry.start_s
    assert record.exit.status == "failed"
    assert Worker.__dict__["explode"].__name__ == "explode"
    assert not hasattr(Worker.__dict__["explode"], "__auditor_target__")


def test_staged_calls_outside_an_audit_pass_straight_through():
    staging = Staging([Worker.step])
    staging.apply()
    try:
        assert Worker().step(3) == 6
    finally:
        staging.restore()
    assert not hasattr(Worker.step, "__auditor_target__")


@pytest.mark.parametrize("target, message", [
    ("no_such_module_xyz:run", "no module named 'no_such_module_xyz'"),
    ("json:no_such_function", "json has no attribute 'no_such_function'"),
    ("json.decoder:JSONDecoder.nope", "json.decoder.JSONDecoder has no attribute 'nope'"),
    ("json:Nope.decode", "json has no attribute 'Nope'"),
    ("math:pi", "is not callable"),
    ("json:JSONDecoder", "is a class"),
    ("json", "should look like module:function"),
])
def test_resolution_errors_are_one_line_value_errors(target, message):
    with pytest.raises(ValueError) as caught:
        resolve(target)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_objects_that_cannot_be_patched_are_refused():
    def local():
        pass
    with pytest.raises(ValueError, match="inside a function"):
        resolve(local)
    with pytest.raises(ValueError, match="not callable"):
        resolve(42)
    with pytest.raises(ValueError, match="generator"):
        resolve(f"{__name__}:_generator")


def _generator():
    yield 1


def test_a_target_never_called_is_reported(tmp_path):
    with (pytest.warns(auditor.AuditorWarning, match="never called"),
          auditor.Audit(tmp_path / "run", stage_targets=[Worker.step]) as audit):
        pass
    assert any("never called" in w for w in audit.record["warnings"])
