"""What a compared command may tell the auditor: a small JSON file whose path the auditor
puts in the environment variable `AUDITOR_RESULT`. Every field is optional:

    {"loaded_rss": 681574400,            bytes of RSS once the inputs (the model) are loaded
     "result_file": "masks.safetensors", the result, compared element by element
     "result_digest": "3f2a...",         the result's digest, compared when there is no file
     "tolerance": {"elements": 10} | {"fraction": 0.001}}   differing elements it allows itself

Any other field is kept in the comparison record as reported. A relative `result_file` is
relative to the command's working folder. A command in any language can write this file; from
Python, `loaded()` and `result()` below do it (and do nothing when no comparison is running).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from auditor.facts import safe_files

ENV = "AUDITOR_RESULT"
FIELDS = {"loaded_rss": int, "result_file": str, "result_digest": str, "tolerance": dict}


def loaded() -> None:
    """Call once the inputs are loaded: records the current RSS as `loaded_rss`."""
    path = os.environ.get(ENV)
    if path:
        import psutil
        _merge(path, {"loaded_rss": psutil.Process().memory_info().rss})


def result(file: str | os.PathLike | None = None, digest: str | None = None,
           tolerance: dict | None = None, **extra) -> None:
    """Declares the result (a safetensors file and/or a digest), a tolerance and extra fields."""
    path = os.environ.get(ENV)
    if path:
        fields = {"result_file": None if file is None else os.path.abspath(file),
                  "result_digest": digest, "tolerance": tolerance, **extra}
        _merge(path, {key: value for key, value in fields.items() if value is not None})


def _merge(path: str, fields: dict) -> None:
    data = json.loads(Path(path).read_text()) if os.path.exists(path) else {}
    data.update(fields)
    safe_files.write_text(path, json.dumps(data))


def read(path: Path, cwd: Path) -> dict:
    """The fields a finished command wrote ({} if it wrote nothing); ValueError if malformed."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{ENV} file is not JSON ({error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{ENV} file holds {type(data).__name__}, not an object")
    check(data)
    if data.get("result_file") is not None:
        data["result_file"] = str(cwd / data["result_file"])  # an absolute path stays as it is
    return data


def check(fields: dict) -> None:
    for key, kind in FIELDS.items():
        value = fields.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise ValueError(f"{ENV} field {key!r} should be {kind.__name__}, got {value!r}")
