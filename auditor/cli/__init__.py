"""The `auditor` command. Each subcommand is its own module `auditor/cli/<name>.py` with
`register(subparsers)` (which sets `handler`) and is listed in SUBCOMMANDS; nothing else
changes to add one.

Errors in what the user typed: a subcommand raises UsageError and the user sees one line,
`auditor: error: ...`, exit status 2, no traceback.

One meaning per option name across the subcommands, each defined once here: a run folder is
always `--run-dir DIR`, a file the command writes always `-o/--output FILE`, the program's
callables `--stage` and `--model-from`. Spellings an option had before stay as hidden aliases
(`old=`), so old command lines keep working. No option is ever matched by an abbreviation
(allow_abbrev=False): `--batch` is never taken for `--batch-size`.

A command that runs a program (`run`, `validate-projection`) declares it with
add_program_arguments: the command line is split at the program (SCRIPT, or -m MODULE / -c CODE)
before argparse reads it, and everything after the program is the program's own, whatever its
options are called (split_program).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import select
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

# the commands' shared help, taken from here
from architectures.options import HelpFormatter, epilog, examples, installed_version  # noqa: F401

SUBCOMMANDS = ["run", "gradprobe", "train_step", "report", "rebuild", "compare", "validate_projection", "project_ranks",
               "export"]


class UsageError(Exception):
    """Bad input on the command line: one line on stderr, exit status 2."""


def check_writable_report(output, create_folder: bool = False) -> None:
    """UsageError (one line) unless the report could be written at `output`; creates nothing.
    Its folder must exist, unless `create_folder` (a default path such as reports/, which the
    command creates): then the nearest folder that exists must be writable."""
    from pathlib import Path
    output = Path(output)
    where = f"cannot write the report to {str(output)!r}"
    if output.is_dir():
        raise UsageError(f"{where}: it is a folder; give a file name such as {str(output / 'report.md')!r}")
    check_not_special(output, where)
    if output.suffix.lower() != ".md":  # markdown in a .png or a run.json would pass for one
        raise UsageError(f"{where}: the report is markdown; give a name ending in .md, such as "
                         f"{str(output.with_suffix('.md'))!r}")
    folder = output.parent
    if not folder.exists() and not create_folder:
        raise UsageError(f"{where}: folder {str(folder)!r} does not exist")
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise UsageError(f"{where}: {str(folder)!r} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK) or (output.exists() and not os.access(output, os.W_OK)):
        raise UsageError(f"{where}: permission denied")


def check_file_writable(output, where: str) -> None:
    """UsageError `where: ...` unless `output`'s folder exists and `output` could be written
    there; creates nothing."""
    from pathlib import Path
    output = Path(output)
    check_not_special(output, where)
    folder = output.parent
    if not folder.is_dir():
        raise UsageError(f"{where}: folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{where}: folder {str(folder)!r} is not writable")
    if output.exists() and not os.access(output, os.W_OK):
        raise UsageError(f"{where}: the file is not writable")


def check_not_special(output, where: str) -> None:
    """UsageError unless `output` is new or a regular file (a link to one counts). A file is
    written beside its name and renamed over it (auditor.facts.safe_files): over /dev/stdout,
    /dev/null or a FIFO that would replace the device or pipe itself, for everyone."""
    import stat
    names = [os.path.abspath(output)]
    if os.path.islink(output):  # /dev/stdout -> /proc/self/fd/1, a regular file when redirected
        names.append(os.path.join(os.path.dirname(names[0]), os.readlink(output)))
    if any(os.path.normpath(name).startswith(("/dev/", "/proc/")) and not name.startswith("/dev/shm/")
           for name in names):
        raise UsageError(f"{where}: it is in /dev or /proc, where the file written would replace a device "
                         "or a stream (/dev/stdout, /dev/null); give a regular file's name")
    try:
        mode = os.stat(output).st_mode
    except OSError:  # nothing there (or a dangling link, which a write replaces)
        return
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise UsageError(f"{where}: it is not a regular file (a device, a pipe or a socket); give a file name")


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # an abbreviation would take the script's options
        kwargs.setdefault("formatter_class", HelpFormatter)  # every command's help written one way
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UsageError(f"{message}; see '{self.prog} --help'")


def check_script(text: str) -> Path:
    """The Python script a command runs, or UsageError (one line)."""
    script = Path(text)
    if not script.is_file():
        what = "is not a file" if script.exists() else "does not exist"
        raise UsageError(f"script {text!r} {what}; give the path of a Python script")
    return script


BAD_INPUT = (2, "bad input: one line on stderr saying what is wrong, before any work")
INTERRUPTED = (130, "Ctrl-C; what finished is kept")


def add_run_dir_argument(parser, help: str, old: tuple[str, ...] = ()) -> None:
    """--run-dir DIR (args.run_dir): the folder the command writes its run records into."""
    parser.add_argument("--run-dir", metavar="DIR", help=help)
    _hidden_aliases(parser, old, "run_dir", "DIR")


def add_output_argument(parser, help: str, metavar: str = "FILE", old: tuple[str, ...] = ()) -> None:
    """-o/--output FILE (args.output): the file the command writes."""
    parser.add_argument("-o", "--output", metavar=metavar, help=help)
    _hidden_aliases(parser, old, "output", metavar)


def _hidden_aliases(parser, old: tuple[str, ...], dest: str, metavar: str) -> None:
    """Deprecated spellings of an option: they still work, and help shows only the new name."""
    for spelling in old:
        parser.add_argument(spelling, dest=dest, metavar=metavar, help=argparse.SUPPRESS)


def add_stage_argument(parser) -> None:
    """--stage TARGET (args.stages), repeatable."""
    parser.add_argument("--stage", metavar="TARGET", action="append", default=[], dest="stages",
                        help="stage every call of module:function or module:Class.method "
                             "(__main__:function for the program's own; repeatable)")


def add_model_from_argument(parser, runs: str) -> None:
    """--model-from MODULE:NAME: what builds the program's model; `runs` says which runs build
    it at the target's sizes."""
    parser.add_argument("--model-from", metavar="MODULE:NAME",
                        help=f"what builds the program's model: a function, a class, a class's "
                             f"from_pretrained/from_config, or the model object the script binds "
                             f"(__main__:model); {runs} run it as written with the target's sizes in "
                             "its transformers config (the program runs unmodified)")


def add_memray_switch(parser) -> None:
    """--no-memray (args.memray False): memray's allocation trace is on by default; --memray, the
    default, is kept for old command lines."""
    parser.add_argument("--no-memray", dest="memray", action="store_false",
                        help="skip memray's allocation trace, on by default (the report then lists no "
                             "allocation sites)")
    parser.add_argument("--memray", dest="memray", action="store_true", default=True, help=argparse.SUPPRESS)


PROGRAM_ARGUMENTS = ("everything after the program is its own, options included (even one named as an "
                     "option here); `--` before the program ends these options, and a `--` right after it is "
                     "dropped")


@dataclass
class ProgramPart:
    """What follows the command's own options: the program and its own arguments. `how`: "script",
    "-m" or "-c"; `name`: the script's path, the module or the code (None: -m or -c without one)."""
    how: str
    name: str | None
    args: list[str] = field(default_factory=list)


def add_program_arguments(parser, group, script_help: str, modules: bool = False) -> None:
    """SCRIPT [ARGS...] (and -m MODULE / -c CODE with `modules`) in `group` of `parser`, shown
    in its help with how the program's arguments are separated. They are filled by main() from
    split_program, never by argparse: args.script, args.args, args.module and args.code
    (`[MODULE, ARGS...]`, `[CODE, ARGS...]`, as python's own -m and -c take them)."""
    parser.program_options = ("-m", "-c") if modules else ()
    if modules:
        # REMAINDER for the help alone ("-m MODULE [ARGS...]"): argparse never sees them
        group.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE",
                           help="run library module MODULE as __main__, as python -m does")
        group.add_argument("-c", dest="code", nargs=argparse.REMAINDER, metavar="CODE",
                           help="run the code string CODE, as python -c does")
    group.add_argument("script", nargs="?", metavar="SCRIPT", help=script_help)
    group.add_argument("args", nargs="*", metavar="ARGS", help=PROGRAM_ARGUMENTS)


def split_program(parser, tokens: list[str]) -> tuple[list[str], ProgramPart | None]:
    """`tokens` (a subcommand's, after its name) split into the command's own options and the
    program with its arguments: the program is the first token that is neither an option of
    `parser` nor one of its values, or what follows `--`, or -m/-c with what follows it.
    Nothing after it is read as the command's. A `--` right after the program is dropped, so
    `SCRIPT -- ARGS` (the spelling that kept them apart before) still gives ARGS."""
    options = getattr(parser, "program_options", ())
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--":
            rest = tokens[i + 1:]
            return tokens[:i], (ProgramPart("script", rest[0], _own(rest[1:])) if rest else None)
        if token in options:
            rest = tokens[i + 1:]
            return tokens[:i], ProgramPart(token, rest[0] if rest else None, _own(rest[1:]))
        if token[:2] in options and not token.startswith("--"):  # python's -mjson.tool
            return tokens[:i], ProgramPart(token[:2], token[2:], _own(tokens[i + 1:]))
        if token.startswith("-") and token != "-":
            i += 1 + _values_taken(parser, token, tokens[i + 1:])
            continue
        return tokens[:i], ProgramPart("script", token, _own(tokens[i + 1:]))
    return tokens, None


def _own(args: list[str]) -> list[str]:
    return args[1:] if args[:1] == ["--"] else args


def _values_taken(parser, token: str, rest: list[str]) -> int:
    """How many of the tokens after option `token` argparse takes as its values (an unknown
    option takes none: argparse then says it is unknown)."""
    long = token.startswith("--")
    name = token.split("=", 1)[0] if long else token[:2]
    action = parser._option_string_actions.get(name)
    if action is None or (long and "=" in token) or (not long and len(token) > 2):
        return 0  # unknown, or its value attached (--opt=V, -oV)
    nargs = action.nargs
    if nargs is None:
        return 1
    if isinstance(nargs, int):
        return nargs
    if nargs == argparse.REMAINDER:
        return len(rest)
    values = 0
    while values < len(rest) and not (rest[values].startswith("-") and rest[values] != "-"):
        values += 1
    return min(values, 1) if nargs == argparse.OPTIONAL else values


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`argv` parsed by `parser`, the program a subcommand runs split off first (split_program)
    and put into args.script/args.args/args.module/args.code."""
    commands = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})
    at = next((i for i, token in enumerate(argv) if not token.startswith("-")), None)
    sub = commands.get(argv[at]) if at is not None else None
    if at is None or sub is None or not hasattr(sub, "program_options"):
        return parser.parse_args(argv)
    own, program = split_program(sub, argv[at + 1:])
    args = parser.parse_args([*argv[:at + 1], *own])
    args.script, args.args = None, []
    if sub.program_options:
        args.module = args.code = None
    if program is None:
        return args
    if program.how == "script":
        args.script, args.args = program.name, program.args
    else:
        given = [program.name, *program.args] if program.name is not None else []
        setattr(args, "module" if program.how == "-m" else "code", given)
    return args


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="auditor", description="Stage-by-stage memory audits of Python code.",
                     formatter_class=HelpFormatter,
                     epilog=epilog(["auditor run --stage mylib.prune:prune_layer prune.py",
                                    "auditor report runs/20250101-120000-prune",
                                    "auditor COMMAND --help"],
                                   [(0, "done (auditor run: the program's own exit status)"),
                                    (1, "a run failed, or a check the command makes did not pass"),
                                    BAD_INPUT, INTERRUPTED]))
    parser.add_argument("--version", action="version", version=f"auditor {installed_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                       parser_class=_Parser)
    for name in SUBCOMMANDS:
        importlib.import_module(f"auditor.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse(build_parser(), argv)
        args.command_line = ["auditor", *argv]
        status = args.handler(args)
        if args.command != "run":  # run's stdout is the program's: python flushes it at exit, as alone
            _flush(sys.stdout)  # now, so a reader gone (`| head -1`) is seen here
        return status
    except BrokenPipeError:
        if not _reader_gone(sys.stdout):
            raise
        # as a command a SIGPIPE ended (`cat | head -1`): no traceback, and nothing left for
        # python to flush at exit into the closed pipe; the files it wrote are whole
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except UsageError as error:
        print(f"auditor: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a path typed longer than a file name may be: any look at it fails
        if error.errno != errno.ENAMETOOLONG:
            raise
        name = str(error.filename or "")
        print(f"auditor: error: {name[:60]!r}{'...' if len(name) > 60 else ''} holds a name over the file "
              "system's limit (255 bytes); give a shorter one", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before a command's own handling began (checks, imports)
        print("auditor: interrupted", file=sys.stderr)
        return 130


def _flush(stream) -> None:
    if stream is not None:  # None: python was started with the stream closed
        stream.flush()


def _reader_gone(stream) -> bool:
    """Whether `stream` is a pipe whose reading end has been closed (poll says POLLERR)."""
    try:
        poller = select.poll()
        poller.register(stream.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False
