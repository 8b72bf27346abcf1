"""Source paths as a report's reader should see them: no folders of the machine that ran it.

The record keeps every path as it was (absolute, so a site can be opened where the run
happened). A report shows a library file from its package (`torch/autograd/graph.py`), a
standard-library file by its name (`linecache.py`), and the audited code relative to the
folder its files share (`gradprobe/pruner.py`), so a committed report names no machine.
"""
from __future__ import annotations

import os
import re
import shlex

from auditor.facts.allocation_sites import is_auditor_code
from auditor.record.schema import RunRecord

_LIBRARY = re.compile(r".*?/(?:site|dist)-packages/")
_STDLIB = re.compile(r".*?/lib/python\d+\.\d+/")


_CONSOLE_SCRIPT = re.compile(r".*/bin/auditor$")


def _auditors_own(path: str) -> bool:
    """A frame of the auditor's measuring code (its jobs/ are workloads) or its console script."""
    return bool(_CONSOLE_SCRIPT.match(path)) or is_auditor_code(path)


def code_root(record: RunRecord) -> str | None:
    """The folder that the audited code's files in the memray sites share, if any: the
    working folder the run started in when every such file lies inside it (the folder that
    names allocation sites, auditor.facts.allocation_sites; also when there are no sites), else
    their common folder. The auditor's own frames (its wrappers pass through the stacks) are
    not the audited code."""
    files = set()
    for site in record.memray.sites if record.memray else []:
        for frame in [site.location] + [f.partition(" at ")[2] for f in site.python_stack]:
            path = frame.rsplit(":", 1)[0]
            if path.startswith("/") and not (_LIBRARY.match(path) or _STDLIB.match(path) or _auditors_own(path)):
                files.add(path)
    cwd = record.process.cwd
    if not (isinstance(cwd, str) and cwd.startswith("/") and cwd != "/"):
        cwd = None
    if cwd is not None and all(f.startswith(os.path.join(cwd, "")) for f in files):
        return cwd  # also with no memray sites: the command's paths are shown from it
    if not files:
        return None
    root = os.path.commonpath([os.path.dirname(f) for f in files])
    return root if root != "/" else None


def shown_path(path: str, root: str | None) -> str:
    """`path` without the machine's folders (a trailing `:line` is kept)."""
    for pattern in (_LIBRARY, _STDLIB):
        if pattern.match(path):
            return pattern.sub("", path, count=1)
    if root and path.startswith(os.path.join(root, "")):
        return path[len(os.path.join(root, "")):]
    if not path.startswith("/"):  # relative already (a record made portable: auditor.record.portable_paths)
        return path
    parts = path.split("/")
    return "/".join(parts[-3:]) if len(parts) > 3 else path


def shown_command(command: str, root: str | None) -> str:
    """The command as run, with the interpreter by name and the audited code's paths shortened."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    if not words:
        return command
    first = os.path.basename(words[0])  # the interpreter by name, wherever it lies
    rest = [shown_path(w, root) if w.startswith("/") and root and w.startswith(os.path.join(root, ""))
            else w for w in words[1:]]
    return shlex.join([first, *rest])
