"""Run records made fit to commit: the machine's folders taken out of their paths.

A record keeps every path as the run saw it (absolute, so a site opens where the run
happened). A record committed beside a report must name no machine, so this rewrites the
record files of a folder in place, as text (their layout unchanged):

- the project's folder (`--root`, default: the working folder) becomes `.` where it is a
  path of its own (the run's working folder) and goes where it starts one
  (`/home/me/proj/gradprobe/pruner.py` -> `gradprobe/pruner.py`);
- the interpreter's installation (`sys.base_prefix`, `sys.prefix`) becomes `<python>`, and
  the temporary folder `<tmp>`.

Reports show such paths as they show the absolute ones (auditor.analysis.run.source_paths): a
library file from its package, the project's files from the project's folder.

    python -m auditor.record.portable_paths [--root DIR] FOLDER_OR_FILE ...
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

from auditor.facts import safe_files

RECORD_SUFFIXES = (".json", ".jsonl")
_END = r"""(?=["'\s:,)\]]|$)"""  # a path ends at a quote, a space, a `:line` or a bracket


def rewrites(root: str) -> list[tuple[re.Pattern, str]]:
    """(pattern, replacement) in the order they apply: the longest folders first, so a
    virtual environment inside the project is `<python>`, and a project inside the temporary
    folder is the project."""
    named = {os.path.realpath(root): ".", tempfile.gettempdir(): "<tmp>",
             sys.prefix: "<python>", sys.base_prefix: "<python>"}
    folders = sorted({os.path.normpath(f): name for f, name in named.items() if f != "/"}.items(),
                     key=lambda item: -len(item[0]))
    patterns = []
    for folder, name in folders:
        inside = "" if name == "." else name + "/"
        patterns.append((re.compile(re.escape(folder) + "/"), inside))
        patterns.append((re.compile(re.escape(folder) + _END), name))
    return patterns


def portable_text(text: str, root: str) -> str:
    for pattern, replacement in rewrites(root):
        text = pattern.sub(replacement, text)
    return text


def record_files(paths: list[Path]) -> list[Path]:
    """The JSON and JSON-lines files of each folder (recursively), and each file given."""
    found = []
    for path in paths:
        if path.is_dir():
            # a link planted in a folder is no record of it: its target stays unread and unwritten
            found.extend(sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink()
                                and p.suffix in RECORD_SUFFIXES))
        else:
            found.append(path)
    return found


def make_portable(paths: list[Path], root: str) -> list[Path]:
    """Rewrite the record files under `paths`; the files changed."""
    changed = []
    for path in record_files(paths):
        text = path.read_text(encoding="utf-8")
        portable = portable_text(text, root)
        if portable != text:
            safe_files.write_text(path, portable)  # a reader never sees half a file
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m auditor.record.portable_paths",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", metavar="FOLDER_OR_FILE", type=Path)
    parser.add_argument("--root", default=os.getcwd(), help="the project's folder (default: the working folder)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing or not os.path.isdir(args.root):
        print(f"portable_paths: error: no such {'folder' if not missing else 'path'}: "
              f"{missing[0] if missing else args.root}", file=sys.stderr)
        return 2
    changed = make_portable(args.paths, args.root)
    print(f"portable_paths: {len(changed)} record file(s) rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
