"""CLI conventions: `auditor run -m MODULE` and `-c CODE` run as python runs them, under audit
(real subprocesses of tiny programs); every command's --help has an example and its exit
statuses; an option name means one thing in every command (`--run-dir` a run folder, `-o` a
file written), old spellings still working behind the new names."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import auditor
from auditor.cli import build_parser
from gradprobe.cli import build_parser as gradprobe_parser
from gradprobe.streaming.cli import build_parser as streaming_parser

JOB = """
    import sys

    def step(n):
        return bytearray(n)

    def main():
        print("argv", sys.argv, "path0", repr(sys.path[0]), "name", __name__, "spec", __spec__.name)
        kept = [step(5_000_000) for _ in range(2)]
        sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)

    if __name__ == "__main__":
        main()
"""


@pytest.fixture
def project(tmp_path) -> Path:
    """A folder with a package holding a module to run with -m (and no __main__ of its own)."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "job.py").write_text(textwrap.dedent(JOB))
    return tmp_path


def audit(folder: Path, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "auditor", "run", *args], cwd=folder, capture_output=True,
                          text=True, timeout=timeout)


def plain(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=folder, capture_output=True, text=True, timeout=60)


# -- auditor run -m / -c ------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["__main__:step", "pkg.job:step"])
def test_a_module_runs_as_python_m_runs_it_with_its_stages_and_exit_status(project, target):
    done = audit(project, "--run-dir", "run", "--stage", target, "-m", "pkg.job", "3", "--flag")
    alone = plain(project, "-m", "pkg.job", "3", "--flag")
    assert done.returncode == alone.returncode == 3, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("argv"))
    assert line == alone.stdout.strip()  # sys.argv[0] the module's file, sys.path[0] the cwd, __spec__
    assert f"argv ['{project / 'pkg' / 'job.py'}', '3', '--flag'] path0 '{project}'" in line
    record = auditor.load(project / "run")
    assert [s.path for s in record.stages] == ["step", "step#2"]
    assert record.name == "pkg.job" and record.exit.status == "failed"  # SystemExit(3)
    assert "-m pkg.job 3 --flag" in record.command


def test_code_runs_as_python_c_runs_it_with_its_stages_and_exit_status(project):
    code = textwrap.dedent("""
        import sys
        def grow(n):
            return bytearray(n)
        kept = [grow(4_000_000) for _ in range(3)]
        print(sys.argv, repr(sys.path[0]), __name__)
        sys.exit(7)
    """)
    done = audit(project, "--run-dir", "run", "--stage", "__main__:grow", "-c", code, "a", "-b")
    alone = plain(project, "-c", code, "a", "-b")
    assert done.returncode == alone.returncode == 7, done.stderr
    assert done.stdout.strip() == alone.stdout.strip() == "['-c', 'a', '-b'] '' __main__"
    record = auditor.load(project / "run")
    assert [s.path for s in record.stages] == ["grow", "grow#2", "grow#3"]
    assert record.name == "code"


@pytest.mark.parametrize("how", ["-m", "-c"])
def test_the_programs_own_traceback_as_python_shows_it(project, how):
    (project / "pkg" / "fails.py").write_text("def inner():\n    return 1 / 0\n\ninner()\n")
    program = ["-m", "pkg.fails"] if how == "-m" else ["-c", "def inner():\n    return 1 / 0\n\ninner()\n"]
    done = audit(project, "--run-dir", "run", *program)
    alone = plain(project, *program)
    assert done.returncode == alone.returncode == 1
    traceback = done.stderr[:done.stderr.index("ZeroDivisionError")]
    assert traceback.startswith("Traceback (most recent call last):\n")
    assert f"{os.sep}auditor{os.sep}" not in traceback and "runpy" not in traceback  # no frame of ours, nor runpy's
    assert traceback.count('line 2, in inner') == traceback.count("line 4, in <module>") == 1
    assert auditor.load(project / "run").exit.status == "failed"


def test_a_syntax_error_in_code_shows_as_python_shows_it(project):
    done = audit(project, "--run-dir", "run", "-c", "x = (")
    alone = plain(project, "-c", "x = (")
    assert done.returncode == alone.returncode == 1
    assert alone.stderr and done.stderr.startswith(alone.stderr)  # then the audit's summary


def test_census_and_live_tensors_under_m(project):
    (project / "pkg" / "tensors.py").write_text(textwrap.dedent("""
        import torch
        class Holder:
            pass
        def step(holder):
            holder.weights = torch.ones(4_000_000)
            return holder.weights * 2
        if __name__ == "__main__":
            kept = step(Holder())
    """))
    done = audit(project, "--run-dir", "run", "--census", "--live-tensors", "--stage", "__main__:step",
                 "-m", "pkg.tensors")
    assert done.returncode == 0, done.stderr
    (stage,) = auditor.load(project / "run").stages
    assert stage.live_tensors.peak >= 32_000_000  # the ones and their product, 16 MB each
    assert sum(c.bytes for c in stage.components.values()) >= 32_000_000
    assert any("pkg/tensors.py:6" in name for name in stage.components)


BAD = [
    ([], "needs a script, -m MODULE or -c CODE"),
    (["-m"], "-m needs a module name"),
    (["-c"], "-c needs the code to run"),
    (["-m", "no_such_module_here"], "-m no_such_module_here: no module named 'no_such_module_here'"),
    (["-m", "pkg"], "'pkg' is a package without a __main__ module"),
    (["-m", ".job"], "give a module's absolute name"),
    (["--stage", "__main__:nowhere", "-m", "pkg.job"], "job.py binds no 'nowhere' at its top level"),
    (["--stage", "__main__:nowhere", "-c", "x = 1"], "<string> binds no 'nowhere' at its top level"),
    (["--target", "llama-2-7b", "-c", "x = 1"], "--target needs --model-from"),
]


@pytest.mark.parametrize("args, says", BAD)
def test_bad_combinations_are_one_line_and_status_2_before_any_work(project, args, says):
    done = audit(project, *args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("auditor: error: ") and says in lines[0]
    assert not (project / "runs").exists() and done.stdout == ""


@pytest.mark.slow
def test_a_module_is_projected_to_a_target_by_running_it_again(project):
    """--target/--model-from with -m: the traced run reruns the module (python -m) on fake tensors."""
    (project / "pkg" / "trains.py").write_text(textwrap.dedent("""
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        def build_model():
            return LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                                num_attention_heads=4, num_key_value_heads=4, vocab_size=256))

        def train_step(model, optimizer, batch):
            model(input_ids=batch, labels=batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()

        if __name__ == "__main__":
            model = build_model()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            batch = torch.randint(0, 256, (1, 16))
            for _ in range(2):
                train_step(model, optimizer, batch)
    """))
    done = audit(project, "--run-dir", "run", "--stage", "__main__:train_step", "--model-from",
                 "__main__:build_model", "--target", "llama-2-7b", "--target-layers", "1", "--target-hidden",
                 "128", "--target-heads", "4", "--target-intermediate", "256", "--target-vocab", "512",
                 "-m", "pkg.trains", timeout=300)
    assert done.returncode == 0, done.stderr
    projection = json.loads((project / "run" / "projections.json").read_text())[0]
    assert "incomplete" not in projection
    assert [s["path"] for s in projection["stages"]] == ["train_step", "train_step#2"]
    params = 2 * 512 * 128 + 4 * 128 * 128 + 3 * 128 * 256 + 3 * 128  # weights, grads, AdamW's two moments
    assert projection["live_tensor_peak"] >= 4 * 4 * params


# -- every command's help -----------------------------------------------------------------------

def every_parser() -> dict[str, argparse.ArgumentParser]:
    """Every command line's parser: auditor and its subcommands, gradprobe, gradprobe.streaming
    and its subcommands."""
    def with_subcommands(parser, name):
        found = {name: parser}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                found.update({f"{name} {sub}": child for sub, child in action.choices.items()})
        return found
    return {**with_subcommands(build_parser(), "auditor"), "gradprobe": gradprobe_parser(),
            **with_subcommands(streaming_parser(), "python -m gradprobe.streaming")}


def test_the_parsers_cover_every_command():
    names = set(every_parser())
    assert {"auditor run", "auditor report", "auditor compare", "auditor validate-projection",
            "python -m gradprobe.streaming", "python -m gradprobe.streaming prune",
            "python -m gradprobe.streaming write-weights", "gradprobe"} <= names
    assert len(names) == 1 + 9 + 1 + 3


@pytest.mark.parametrize("name", sorted(every_parser()))
def test_every_help_has_an_example_and_its_exit_statuses(name):
    text = every_parser()[name].format_help()
    program = "python -m gradprobe.streaming" if name.startswith("python") else name.split()[0]
    assert f"\nexamples:\n  {program} " in text, text
    statuses = text.split("\nexit status:\n", 1)
    assert len(statuses) == 2, f"{name}: no exit status section"
    rows = statuses[1].split("\n\n")[0].splitlines()
    assert any(row.split()[0] == "2" and "bad input" in row for row in rows), rows
    flat = " ".join(text.split())
    assert "(default: [" not in flat and "(default " not in flat  # defaults written one way


def test_validate_projection_documents_a_missed_target_as_status_1():
    text = every_parser()["auditor validate-projection"].format_help()
    rows = text.split("\nexit status:\n", 1)[1].splitlines()
    assert any(row.split()[:1] == ["1"] and "a target missed" in row for row in rows)


def test_help_shows_how_m_and_c_take_their_arguments():
    text = " ".join(every_parser()["auditor run"].format_help().split())
    assert "usage: auditor run [options] (SCRIPT | -m MODULE | -c CODE) [ARGS...]" in text
    assert "-m MODULE [ARGS...]" in text and "-c CODE [ARGS...]" in text


# -- one meaning per option name ----------------------------------------------------------------

def visible(parser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]


def test_a_run_folder_is_always_run_dir_and_a_written_file_always_o_output():
    for name, parser in every_parser().items():
        for action in visible(parser):
            if "--run-dir" in action.option_strings:
                assert (action.dest, action.metavar) == ("run_dir", "DIR"), name
            if {"-o", "--output"} & set(action.option_strings):
                assert action.option_strings == ["-o", "--output"] and action.dest == "output", name
                assert action.metavar == "FILE" or action.metavar.endswith(".md"), name  # a file, never a folder
            assert "--out" not in action.option_strings, f"{name}: --out is shown; its new name is"
            assert not (action.dest in ("run_dir", "output_dir") and action.metavar != "DIR"), name


def test_an_option_name_has_one_meaning_in_every_command():
    meaning: dict[str, tuple[str, str]] = {}
    for name, parser in every_parser().items():
        for action in visible(parser):
            for option in action.option_strings:
                dest = action.dest.removesuffix("s") if action.dest == "targets" else action.dest  # repeatable
                first = meaning.setdefault(option, (dest, name))
                assert first[0] == dest, f"{option} is {dest!r} in {name}, {first[0]!r} in {first[1]}"


@pytest.mark.parametrize("command, old, new, dest", [
    (["auditor", "run"], ["--out", "r", "x.py"], ["--run-dir", "r", "x.py"], "run_dir"),
    (["auditor", "report"], ["R", "--out", "a.md"], ["R", "-o", "a.md"], "output"),
    (["auditor", "compare"], ["--out", "a.md"], ["--output", "a.md"], "output"),
    (["auditor", "compare"], ["--keep-runs", "k"], ["--run-dir", "k"], "run_dir"),
    (["python -m gradprobe.streaming", "prune"], ["--weights", "w", "--out", "p"],
     ["--weights", "w", "--output-dir", "p"], "output_dir"),
    (["python -m gradprobe.streaming", "write-weights"], ["--arch", "a", "--out", "p"],
     ["--arch", "a", "--output-dir", "p"], "output_dir"),
])
def test_old_spellings_still_work_hidden_behind_the_new_names(command, old, new, dest):
    parser = every_parser()[" ".join(command)]
    assert getattr(parser.parse_args(old), dest) == getattr(parser.parse_args(new), dest)
    hidden = [a for a in parser._actions if a.help == argparse.SUPPRESS and a.option_strings]
    assert hidden and all(a.dest in {v.dest for v in visible(parser)} for a in hidden)


def test_the_shared_options_are_defined_once():
    """--variant, --strategy and --stage read the same in every command that takes them."""
    helps: dict[str, set[str]] = {}
    for name, parser in every_parser().items():
        for action in visible(parser):
            for option in ("--variant", "--strategy", "--stage"):
                if option in action.option_strings and name != "auditor compare":  # its --variant: the ones compared
                    helps.setdefault(option, set()).add(f"{action.help} {action.default}")
    assert {option: len(texts) for option, texts in helps.items()} == {"--variant": 1, "--strategy": 1, "--stage": 1}


def test_the_exit_statuses_of_run_are_the_programs(project):
    """What `auditor run --help` says: the program's own status, 2 for bad input."""
    assert audit(project, "--run-dir", "r", "-c", "raise SystemExit(5)").returncode == 5
    assert audit(project, "-c", "x = 1", "--run-dir", "r2").returncode == 0  # options after the code are its own
    assert not (project / "r2").exists() and os.path.isdir(project / "runs")
