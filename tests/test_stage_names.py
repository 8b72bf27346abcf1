"""Every --stage name checked before the run (auditor.capture.staging.targets,
auditor.capture.staging.script_names): a name the audited script cannot bind, even a method of a
class it defines, is one line and exit 2 before any work; so is a method of a type written in C,
which cannot be patched. A name the script may
bind dynamically is never refused, and where the source cannot tell and the run finds nothing,
the closing warning says so while the command keeps the script's own exit status.

The rule's table is checked against python itself: every source is run, and a name that exists
after it ran must never be refused."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import auditor
from auditor.capture.staging import script_names

BASE = "class Base:\n    def shared(self):\n        return 1\n"

# (source, name, refused): every source runs in a fresh namespace in
# test_no_name_that_exists_is_refused, so it may import only the standard library
TABLE = [
    ("class Pruner:\n    def prune_layer(self): pass", "Pruner.prune_layr", True),
    ("class Pruner:\n    def prune_layer(self): pass", "Pruner.prune_layer", False),
    ("class Pruner:\n    async def calibrate(self): pass", "Pruner.calibrate", False),
    ("class Pruner:\n    class Inner:\n        def step(self): pass", "Pruner.Inner.step", False),
    ("class Pruner:\n    class Inner:\n        def step(self): pass", "Pruner.Inner.stp", True),
    (BASE + "class Pruner(Base):\n    pass", "Pruner.shared", False),
    (BASE + "class Pruner(Base):\n    pass", "Pruner.sharde", True),
    (BASE + "class Mid(Base): pass\nclass Pruner(Mid):\n    pass", "Pruner.shared", False),
    ("class Pruner(object):\n    pass", "Pruner.__init__", False),  # object's, inherited
    ("class Pruner(Exception):\n    pass", "Pruner.with_traceback", False),
    ("class Pruner(Exception):\n    pass", "Pruner.with_tracebak", True),
    ("from json import JSONEncoder\nclass Enc(JSONEncoder):\n    pass", "Enc.encode", False),
    ("from json import JSONEncoder\nclass Enc(JSONEncoder):\n    pass", "Enc.encod", True),
    ("def g(): pass\nf = g", "f", False),
    ("from json import dumps as encode", "encode", False),
    ("import json", "json.dumps", False),  # a module's attribute: the run resolves it
    ("def g(): pass", "h", True),
    ("def g(): pass\ng.attr = g", "g.attr", False),  # a function: its attributes show at run time
    ("class Pruner:\n    pass\nPruner.prune_layer = lambda self: 0", "Pruner.prune_layer", False),
    ("class Pruner:\n    pass\nsetattr(Pruner, 'prune_layer', lambda self: 0)", "Pruner.prune_layer", False),
    ("class Pruner:\n    pass\nfor n in ['a']:\n    setattr(Pruner, n, len)", "Pruner.a", False),
    ("class Pruner:\n    pass\ndef add(k, n):\n    setattr(k, n, len)\nadd(Pruner, 'a')", "Pruner.a", False),
    ("class Pruner:\n    pass\ndef add(o, n):\n    setattr(o, n, len)\nadd(object(), 'a') if 0 else 0",
     "Pruner.a", True),  # the class never leaves its name: no setattr reaches it
    ("class Meta(type):\n    def __getattr__(cls, n): return len\n"
     "class Pruner(metaclass=Meta):\n    pass", "Pruner.anything", False),
    ("class Base:\n    def __init_subclass__(cls):\n        cls.added = len\n"
     "class Pruner(Base):\n    pass", "Pruner.added", False),
    ("def deco(k):\n    k.made = len\n    return k\n@deco\nclass Pruner:\n    pass", "Pruner.made", False),
    ("def deco(k):\n    return k\n@deco\nclass Pruner:\n    pass", "Pruner.other", False),  # cannot tell
    ("import dataclasses\n@dataclasses.dataclass\nclass Cfg:\n    x: int = 0", "Cfg.__eq__", False),
    ("import dataclasses\n@dataclasses.dataclass\nclass Cfg:\n    x: int = 0\n    def run(self): pass",
     "Cfg.rnu", True),
    ("from typing import Generic, TypeVar\nT = TypeVar('T')\nclass P(Generic[T]):\n    pass", "P.x", False),
    ("class Pruner:\n    pass\nif 1:\n    class Pruner:\n        def step(self): pass", "Pruner.step", False),
    ("class Pruner:\n    pass\nPruner = type('Pruner', (), {'step': len})", "Pruner.step", False),
    ("def setup():\n    global made\n    made = len\nsetup()", "made", False),
    ("from os.path import *", "join", False),
    ("globals()['made'] = len", "made", False),
    ("exec('made = len')", "made", False),
    ("globals().update(made=len)", "made", False),
    ("name = 'made'\nglobals()[name] = len", "made", False),
    ("def pick(name):\n    return globals()[name]\ndef run(): pass", "rnu", True),  # only read
    ("def pick(name):\n    return globals().get(name)\nclass P:\n    pass", "P.x", True),
    ("class P:\n    pass\nfrom os.path import *", "P.x", False),  # os.path may bind P
    ("for made in [len]:\n    pass", "made", False),
    ("import contextlib\nwith contextlib.nullcontext(len) as made:\n    pass", "made", False),
    ("if (made := len):\n    pass", "made", False),
    ("try:\n    import no_such_module_here as made\nexcept ImportError:\n    made = None", "made", False),
    ("class Pruner:\n    step = len", "Pruner.step", False),
    ("class Pruner:\n    a = b = len", "Pruner.b", False),
]


def _exists(source: str, name: str, folder: Path) -> bool:
    """Whether `name` resolves after the source ran as a script in `folder`."""
    script = folder / "table_script.py"
    script.write_text(source)
    namespace: dict = {"__name__": "__main__", "__file__": str(script)}
    exec(compile(source, str(script), "exec"), namespace)
    obj: object = namespace
    parts = name.split(".")
    if parts[0] not in namespace:
        return False
    obj = namespace[parts[0]]
    for part in parts[1:]:
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


@pytest.mark.parametrize("source, name, refused", TABLE)
def test_the_rule_refuses_only_names_that_cannot_exist(source, name, refused, tmp_path):
    reason = script_names.check(ast.parse(source), name, "script.py")
    assert (reason is not None) == refused, reason
    assert not (refused and _exists(source, name, tmp_path)), "refused a name that exists when it runs"
    if reason is not None:
        assert "\n" not in reason and reason.startswith("script.py ")


def test_no_name_that_exists_is_refused(tmp_path):
    """Every name each source binds when it runs (its classes' members too) passes the check."""
    checked = 0
    for source, _, _ in TABLE:
        namespace: dict = {"__name__": "__main__", "__file__": str(tmp_path / "s.py")}
        exec(compile(source, "s.py", "exec"), namespace)
        tree = ast.parse(source)
        for top, value in list(namespace.items()):
            if top.startswith("__"):
                continue
            names = [top] + [f"{top}.{m}" for m in dir(value)] if isinstance(value, type) else [top]
            for name in names:
                assert script_names.check(tree, name, "s.py") is None, (source, name)
                checked += 1
    assert checked > 300  # the classes' members, inherited ones included


def test_the_suggestion_is_the_closest_name_the_script_defines():
    tree = ast.parse(BASE + "class Pruner(Base):\n    def prune_layer(self): pass\ndef prune(): pass\n")
    assert script_names.check(tree, "Pruner.prune_layr", "p.py") == (
        "p.py defines class Pruner without 'prune_layr' in its body or bases; did you mean Pruner.prune_layer?")
    assert script_names.check(tree, "Pruner.sharde", "p.py").endswith("did you mean Pruner.shared?")
    assert script_names.check(tree, "prune_layer", "p.py") == (
        "p.py binds no 'prune_layer' at its top level; did you mean Pruner.prune_layer?")
    assert script_names.check(tree, "zzz", "p.py") == "p.py binds no 'zzz' at its top level"


# -- the command, as a user runs it ---------------------------------------------------------------

SCRIPT = """
    import sys
    import torch
    from json import dumps as encode

    class Base:
        def shared(self, x):
            return x + 1

    class Pruner(Base):
        def __init__(self):
            self.weight = torch.ones(64, 64)

        def prune_layer(self, index):
            return self.weight * index

    def prune(pruner):
        for index in range(2):
            pruner.prune_layer(index)
        pruner.shared(1)
        encode({"done": True})

    run_all = prune

    if __name__ == "__main__":
        run_all(Pruner())
        sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


def run(tmp_path: Path, *args: str, script: str = SCRIPT, name: str = "prune.py",
        program_args: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, float]:
    (tmp_path / name).write_text(textwrap.dedent(script))
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "auditor", "run", "--run-dir", str(tmp_path / "run"), *args,
                           name, *program_args], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    return done, time.perf_counter() - began


def refused(done: subprocess.CompletedProcess, tmp_path: Path) -> str:
    """The one line of a refusal, after checking it is one: exit 2, nothing written."""
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("auditor: error: "), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not (tmp_path / "run").exists()
    return lines[0]


@pytest.mark.parametrize("module", ["prune", "__main__"])
def test_a_mistyped_method_of_the_scripts_class_is_refused_at_once(tmp_path, module):
    done, elapsed = run(tmp_path, "--stage", f"{module}:prune", "--stage", f"{module}:Pruner.prune_layr")
    assert refused(done, tmp_path) == (
        f"auditor: error: stage target '{module}:Pruner.prune_layr': prune.py defines class Pruner "
        "without 'prune_layr' in its body or bases; did you mean Pruner.prune_layer?")
    print(f"refused in {elapsed:.2f} s")
    assert elapsed < 5  # the process's start alone: the script never runs (its torch is not imported)


def test_the_right_names_are_stages_imported_assigned_and_inherited_ones_too(tmp_path):
    done, _ = run(tmp_path, "--stage", "__main__:run_all", "--stage", "__main__:Pruner.prune_layer",
                  "--stage", "__main__:Pruner.shared", "--stage", "__main__:encode")
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
    paths = [stage.path for stage in auditor.load(tmp_path / "run").stages]
    assert paths == ["run_all", "run_all/Pruner.prune_layer", "run_all/Pruner.prune_layer#2",
                     "run_all/Pruner.shared", "run_all/encode"]


@pytest.mark.parametrize("target, says", [
    ("builtins:dict.get", "stage target 'builtins:dict.get' cannot be patched: dict is a type written in C"),
    ("torch._C:TensorBase.sum", "stage target 'torch._C:TensorBase.sum' cannot be patched: "
                                "torch._C.TensorBase is a type written in C"),
    ("no_such_module_here:prune", "stage target: no module named 'no_such_module_here'"),
    ("json:dumsp", "stage target 'json:dumsp': json has no attribute 'dumsp'; did you mean 'dump'?"),
])
def test_names_outside_the_script_are_one_line(tmp_path, target, says):
    done, _ = run(tmp_path, "--stage", target)
    assert says in refused(done, tmp_path)


def test_a_name_the_source_cannot_tell_is_warned_about_with_its_cause(tmp_path):
    """A base class in a module the auditor has not imported could hold anything: the run goes
    on, finds no such name when the script binds the class, says so, and exits as the script."""
    (tmp_path / "base_lib.py").write_text("class Base:\n    def shared(self):\n        return 1\n")
    script = """
        import sys
        from base_lib import Base

        class Pruner(Base):
            def prune_layer(self):
                return 2

        Pruner().prune_layer()
        sys.exit(3)
    """
    done, _ = run(tmp_path, "--stage", "__main__:Pruner.prune_layr", "--stage", "__main__:Pruner.shared",
                  script=script)
    assert done.returncode == 3, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warnings == [
        "auditor: warning: stage target __main__:Pruner.prune_layr was never called: it was not found in the "
        "script's namespace when it ran (Pruner had no attribute 'prune_layr'; did you mean 'prune_layer'?)",
        "auditor: warning: stage target __main__:Pruner.shared was never called (a copy kept outside a "
        "module's names, such as a local or a default argument, keeps calling the original)"]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert any("not found in the script's namespace" in w for w in record["warnings"])


# -- the Python API -------------------------------------------------------------------------------

@pytest.mark.parametrize("target, says", [
    ("builtins:dict.get", "cannot be patched: dict is a type written in C"),
    ("torch._C:TensorBase.sum", "cannot be patched: torch._C.TensorBase is a type written in C"),
    ("json:dumsp", "did you mean 'dump'?"),
])
def test_the_python_api_refuses_the_same_names(tmp_path, target, says):
    with pytest.raises(ValueError, match=says):
        auditor.Audit(tmp_path / "run", stage_targets=[target])
    assert not (tmp_path / "run").exists()
