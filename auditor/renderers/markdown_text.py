"""The markdown every report is written in: cells made safe, tables, links relative to the
report. Each renderer (run, training-step, comparison, validation reports) builds on these.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

LONGEST = 2000  # characters of one value shown (a program's error message can be megabytes)


def shortened(value) -> str:
    """`value` as text, its head only when over LONGEST characters, saying how much is left out."""
    value = str(value)
    if len(value) <= LONGEST:
        return value
    return f"{value[:LONGEST]}... ({len(value) - LONGEST:,} characters more, in the run record)"


def text(value) -> str:
    """Plain text safe inside a table cell."""
    shown = shortened(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
    for char, entity in (("<", "&lt;"), (">", "&gt;"), ("*", "\\*"), ("[", "\\["), ("]", "\\]")):
        shown = shown.replace(char, entity)
    return shown


def code(value) -> str:
    """Inline code safe inside a table cell."""
    return "`" + shortened(value).replace("`", "'").replace("|", "\\|").replace("\n", " ") + "`"


def table(headers: list[str], rows: list[list[str]], right: Iterable[int] = (), aligned: bool = False) -> str:
    """A table of cells already made safe; `right`: the columns aligned right (numbers).
    `aligned`: every column padded to its widest cell, for reading as plain text too."""
    right = set(right)
    if aligned:
        return "\n".join(_padded([headers, *rows], right))
    align = ["---:" if i in right else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _padded(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(row: list[str]) -> str:
        return "| " + " | ".join(cell.rjust(w) if i in right else cell.ljust(w)
                                 for i, (cell, w) in enumerate(zip(row, widths, strict=False))) + " |"
    rule = "|" + "|".join(("-" * (w + 1) + ":") if i in right else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return [line(rows[0]), rule, *[line(row) for row in rows[1:]]]


def relative_link(target: Path, report_folder: Path) -> str:
    """A markdown link target to `target`, relative to the folder holding the report."""
    relative = Path(os.path.relpath(Path(target).resolve(), Path(report_folder).resolve())).as_posix()
    return quote(relative, errors="surrogateescape")  # a file name that is not UTF-8: its own bytes


INDENT = "&emsp;"  # a nested row's name in a table


def phrase(value: str) -> str:
    """A phrase with `code` spans (from analysis) made safe for a table cell."""
    pieces = value.split("`")
    return "".join(code(p) if i % 2 else text(p) for i, p in enumerate(pieces))


def folded(summary: str, body: str) -> str:
    """`body` folded under a `<details>` line that says what it holds (GitHub renders the
    markdown inside when blank lines surround it)."""
    return f"<details><summary>{text(summary)}</summary>\n\n{body.strip()}\n\n</details>"


def anchor(heading: str) -> str:
    """The link target GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    kept = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
    return "#" + kept.replace(" ", "-")


def wrapped(line: str, width: int = 400, indent: str = "  ") -> str:
    """A long line of prose (a paragraph or a list item, never a table row) broken at spaces into
    lines of at most about `width` characters, continued with `indent`: markdown joins them again."""
    if len(line) <= width:
        return line
    lines, rest = [], line
    while len(rest) > width:
        cut = rest.rfind(" ", 0, width)
        if cut <= len(indent):
            break
        lines.append(rest[:cut])
        rest = indent + rest[cut + 1:]
    return "\n".join([*lines, rest])


SUPERSCRIPTS = "¹²³⁴⁵⁶⁷⁸⁹"


class Notes:
    """Reasons under a table, each once, marked where a figure rests on one: the first with
    `marks` (superscripts by default), the rest " (note N)"; `text()` lists them in order."""

    def __init__(self, marks: str = SUPERSCRIPTS) -> None:
        self.marks = marks
        self.texts: list[str] = []

    def mark(self, why: str) -> str:
        if why not in self.texts:
            self.texts.append(why)
        index = self.texts.index(why)
        return self.marks[index] if index < len(self.marks) else f" (note {index + 1})"

    def text(self) -> str:
        lines = [wrapped(f"{self.marks[i] if i < len(self.marks) else f'Note {i + 1}:'} {text(t[:1].upper() + t[1:])}.")
                 for i, t in enumerate(self.texts)]
        return "".join(f"\n\n{line}" for line in lines)
