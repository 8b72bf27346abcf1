"""Stage and mark names as reports and the terminal show them: control characters escaped.

A name is the program's text (auditor.capture.stage takes any object as a name), so it may hold a
newline, a tab or a terminal's escape sequence (`"\\x1b[31m"`). The record keeps it as given;
wherever it is shown, each control character (and each bidirectional override, which would
reorder what follows it) is written as Python writes it in a string: `\\n`, `\\t`, `\\x1b`,
`\\u202e`. So a name is one line in a table and never drives the terminal. A name longer than
`LONGEST` characters is shown by its head, its length and a short digest of the whole (two long
names sharing a head stay apart), each part between slashes on its own, so a stage's shown path
is still its parent's shown path, a slash and its own shown name.

    escaped("load\\nx")          # 'load\\\\nx'
    as_shown(record)             # the same record, or a copy whose names are escaped
"""
from __future__ import annotations

import unicodedata
import zlib

from auditor.record.schema import RunRecord

_BIDI = {0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069}
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
LONGEST = 120  # characters of a name shown whole
HEAD = 80  # characters shown of a longer one


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _needs(char: str) -> bool:
    return unicodedata.category(char) == "Cc" or ord(char) in _BIDI


def escaped(text: str) -> str:
    """`text` with its control characters escaped and its long parts shortened (unchanged when
    it has neither)."""
    if text.isprintable() and len(text) <= LONGEST:  # the common case, one pass in C
        return text
    if len(text) > LONGEST:
        return "/".join(_shortened(part) for part in text.split("/"))
    return "".join(_escape(char) if _needs(char) else char for char in text)


def _shortened(part: str) -> str:
    if len(part) <= LONGEST:
        return escaped(part)
    digest = zlib.crc32(part.encode("utf-8", "surrogatepass")) & 0xFFFF
    return f"{escaped(part[:HEAD])}... ({len(part):,} characters, #{digest:04x})"


def _shown(value):
    return escaped(value) if isinstance(value, str) else value


# Where a record holds stage or mark names (each a key of an object, or of each object of a list).
_NAME_FIELDS = {
    "stages": ("name", "path", "parent"),
    "unstaged": ("parent", "after", "before"),
    "marks": ("name", "stage"),
}
_PEAK_FIELDS = ("stage",)
_WHERE_FIELDS = ("stage", "parent", "after", "before")


def as_shown(record: RunRecord) -> RunRecord:
    """`record` itself when no stage or mark name needs escaping; else a copy whose names (in
    its stages, unstaged intervals, marks, peak and memray's peak stage) and warnings are escaped,
    consistently, so a stage's parent still names its parent's path."""
    names = [s.name for s in record.stages] + [m.name for m in record.marks]
    if all(name.isprintable() and len(name) <= LONGEST for name in names):
        return record
    data = record.to_json()
    for key, fields in _NAME_FIELDS.items():
        for item in data.get(key) or ():
            for name in fields:
                if name in item:
                    item[name] = _shown(item[name])
    peak = data.get("peak") or {}
    for name in _PEAK_FIELDS:
        if name in peak:
            peak[name] = _shown(peak[name])
    where = peak.get("where") or {}
    for name in _WHERE_FIELDS:
        if name in where:
            where[name] = _shown(where[name])
    memray = data.get("memray") or {}
    if "stage" in memray:
        memray["stage"] = _shown(memray["stage"])
    data["warnings"] = [_shown(line) for line in data.get("warnings") or ()]
    return RunRecord.from_json(data, where="run.json")
