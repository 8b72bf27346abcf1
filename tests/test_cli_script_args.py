"""Everything after the program is the program's: `auditor run` and `auditor validate-projection`
hand a script's options to it even where their names equal or abbreviate the command's own
(`--run-dir`, `--stage`, `--batch` against `--batch-size`/`--batches`), `--` before the script's
arguments still works, and no option of the auditor's is matched by an abbreviation."""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import one_error_line
from test_validate_held_out_args import SMALL, TARGET, write_driver

import auditor
from auditor.cli import build_parser, main, parse

# A script of the usual shape: options of its own, some named as the auditor's are.
ECHO = """
import argparse, json, sys
parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int)
parser.add_argument("--run-dir")
parser.add_argument("--stage")
parser.add_argument("--layers", type=int)
args, _ = parser.parse_known_args()
with open("received.json", "w") as out:
    json.dump({"argv": sys.argv[1:], "parsed": vars(args)}, out)
"""
SCRIPT_ARGS = ["--batch", "4", "--run-dir", "theirs", "--stage", "s1", "--layers", "3"]


@pytest.fixture
def echo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "echo.py").write_text(textwrap.dedent(ECHO))
    return tmp_path


def received(folder: Path) -> dict:
    return json.loads((folder / "received.json").read_text())


@pytest.mark.parametrize("spelling", [
    ["echo.py", *SCRIPT_ARGS],
    ["echo.py", "--", *SCRIPT_ARGS],     # the spelling that kept them apart before
    ["--", "echo.py", *SCRIPT_ARGS],     # -- ending the auditor's options
])
def test_run_hands_the_scripts_options_to_it(echo, spelling):
    assert main(["run", "--run-dir", "ours", *spelling]) == 0
    got = received(echo)
    assert got["argv"] == SCRIPT_ARGS
    assert got["parsed"] == {"batch": 4, "run_dir": "theirs", "stage": "s1", "layers": 3}
    record = auditor.load(echo / "ours")  # the auditor's --run-dir, not the script's
    assert not record.stages and not (echo / "theirs").exists()


def test_a_later_dash_dash_is_the_scripts_own(echo):
    assert main(["run", "--run-dir", "ours", "echo.py", "--batch", "4", "--", "x"]) == 0
    assert received(echo)["argv"] == ["--batch", "4", "--", "x"]


def test_module_and_code_take_what_follows_them(echo):
    (echo / "echo_module.py").write_text(textwrap.dedent(ECHO))
    assert main(["run", "--run-dir", "m", "-m", "echo_module", "--stage", "s1", "--run-dir", "theirs"]) == 0
    assert received(echo)["argv"] == ["--stage", "s1", "--run-dir", "theirs"]
    code = "import json, sys; json.dump({'argv': sys.argv[1:]}, open('received.json', 'w'))"
    assert main(["run", "--run-dir", "c", "-c", code, "--name", "n", "-m", "x"]) == 0
    assert received(echo)["argv"] == ["--name", "n", "-m", "x"]
    assert auditor.load(echo / "c").name == "code"  # --name went to the code, not to the auditor


@pytest.mark.parametrize("argv, message", [
    (["run", "--run", "ours", "echo.py"], "unrecognized arguments: --run"),   # no abbreviation of --run-dir
    (["run", "--live", "echo.py"], "unrecognized arguments: --live"),
    (["run", "--run-dir", "ours"], "run needs a script"),
    (["run", "--run-dir", "ours", "--"], "run needs a script"),
    (["run", "-m"], "-m needs a module name"),
    (["validate-projection", "--target-lay", "2", "--model-from", "json:dumps", "echo.py"],
     "unrecognized arguments: --target-lay"),
])
def test_bad_input_is_one_line_and_exit_2(echo, capsys, argv, message):
    assert main(argv) == 2
    assert message in one_error_line(capsys)
    assert not (echo / "received.json").exists() and not (echo / "ours").exists()


def test_validate_projection_gives_the_script_options_named_as_its_own():
    args = parse(build_parser(), ["validate-projection", "--batch-size", "2", "--model-from", "m:f",
                                  "prune.py", "--batch", "4", "--batches", "1", "--layers", "2",
                                  "--run-dir", "x", "--held-out-args", "y"])
    assert args.script == "prune.py"
    assert args.args == ["--batch", "4", "--batches", "1", "--layers", "2", "--run-dir", "x",
                         "--held-out-args", "y"]
    assert (args.batch_size, args.layers, args.run_dir, args.held_out_args) == (2, None, None, None)


def test_each_program_commands_help_says_how_its_arguments_are_separated():
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for command in ("run", "validate-projection"):
        text = " ".join(commands.choices[command].format_help().split())
        assert "everything after the program is its own, options included" in text, command


# -- validate-projection --held-out-args that build another model than the target ---------

def test_held_out_args_for_another_model_compare_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    driver = write_driver(tmp_path)
    wrong = ["--layers", "3", "--hidden", "128", "--intermediate", "256"]
    try:
        status = main(["validate-projection", *TARGET, "--run-dir", "v", "--model-from", f"{driver}:build",
                       "--stage", f"{driver}:forward", "--held-out-args", " ".join(wrong), "drive.py", *SMALL])
    finally:
        sys.modules.pop(driver, None)  # imported by the checks
    assert status == 1
    err = capsys.readouterr().err
    assert "--held-out-args must build the --target model" in err
    assert not (tmp_path / "v" / "validation.md").exists()
