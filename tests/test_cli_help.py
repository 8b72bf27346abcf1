"""Every auditor command explains itself: each option has help, defaults are shown, each
command has an example, and output options use the same names everywhere."""
from __future__ import annotations

import argparse

import pytest

from auditor.cli import SUBCOMMANDS, build_parser


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", [name.replace("_", "-") for name in SUBCOMMANDS])
def test_every_option_has_help_and_every_command_an_example(name):
    command = subcommands()[name]
    silent = [a.option_strings[0] for a in command._actions if a.option_strings and not a.help]
    assert silent == [], f"auditor {name}: options without help: {silent}"
    text = command.format_help()
    assert "examples:\n  auditor " + name in text


def test_defaults_are_shown_where_an_option_has_one():
    text = " ".join(subcommands()["gradprobe"].format_help().split())
    for shown in ("(default: 2)", "(default: 0.1)", "(default: 2.0)", "(default: 1)", "(default: magnitude)"):
        assert shown in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_output_options_have_one_spelling():
    """A report or trace file is -o/--output FILE; a run folder is --run-dir DIR (old spellings
    stay as aliases)."""
    commands = subcommands()
    for name, command in commands.items():
        options = {o for a in command._actions for o in a.option_strings}
        if "--out" in options:  # an alias only
            assert "--output" in options or "--run-dir" in options, name
    assert {"-o", "--output"} <= {o for a in commands["report"]._actions for o in a.option_strings}
    run = commands["run"].parse_args(["--run-dir", "runs/x", "script.py"])
    assert run.run_dir == "runs/x" == commands["run"].parse_args(["--out", "runs/x", "script.py"]).run_dir


def test_gradprobe_explains_itself_too():
    from gradprobe.cli import build_parser as gradprobe_parser
    parser = gradprobe_parser()
    silent = [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
    assert silent == []
    text = " ".join(parser.format_help().split())
    assert "examples: gradprobe --arch" in text and "(default: magnitude)" in text
    assert "(default: None)" not in text
