"""Run records made fit to commit (auditor.record.portable_paths), and the committed ones: no folder of
the machine that made them, and reports that read them the same."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from auditor.analysis.run.source_paths import code_root, shown_command, shown_path
from auditor.record.portable_paths import main, portable_text
from auditor.record.schema import RunRecord

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "/home/ann/proj"
MACHINE_PATH = re.compile(r"""(?:^|["'\s=])(/(?!proc/|dev/)[\w.-]+/[\w.-]+)""")


def test_the_project_folder_goes_and_the_interpreter_and_temporary_folder_are_named():
    venv = sys.prefix
    tmp = tempfile.gettempdir()
    record = {"process": {"cwd": PROJECT},
              "command": f"{venv}/bin/python {PROJECT}/auditor/jobs/train_step.py '{{}}' {tmp}/run",
              "sites": [f"{PROJECT}/gradprobe/pruner.py:19", f"f at {sys.base_prefix}/lib/runpy.py:86",
                        "/home/ann/proj2/other.py:1", f"{PROJECT}:notes"]}
    text = json.dumps(record, indent=1)
    portable = json.loads(portable_text(text, PROJECT))
    assert portable == {"process": {"cwd": "."},
                        "command": "<python>/bin/python auditor/jobs/train_step.py '{}' <tmp>/run",
                        "sites": ["gradprobe/pruner.py:19", "f at <python>/lib/runpy.py:86",
                                  "/home/ann/proj2/other.py:1",  # another folder that starts alike
                                  ".:notes"]}
    assert portable_text(text, PROJECT).count("\n") == text.count("\n")  # the layout is kept


def test_a_virtual_environment_inside_the_project_is_the_interpreter():
    project = str(Path(sys.prefix).parent)
    text = f'"{sys.prefix}/lib/x.py", "{project}/train.py"'
    assert portable_text(text, project) == '"<python>/lib/x.py", "train.py"'


def test_a_portable_record_is_shown_as_the_absolute_one():
    absolute = RunRecord.from_json({
        "schema": "auditor.run/1", "name": "x", "started_at": "t", "device": "cpu", "environment": {},
        "command": f"{PROJECT}/.venv/bin/python {PROJECT}/train.py --out {PROJECT}/runs/a",
        "process": {"cwd": PROJECT}, "stages": [], "peak": {"rss": None},
        "memray": {"sites": [{"location": f"{PROJECT}/deep/er/pkg/mod.py:3", "bytes": 1, "allocations": 1,
                              "python_stack": [f"f at {PROJECT}/.venv/lib/python3.11/site-packages/torch/x.py:1"]}]}})
    text = json.dumps(absolute.to_json())
    portable = RunRecord.from_json(json.loads(portable_text(text, PROJECT)))
    for record in (absolute, portable):
        root = code_root(record)
        assert shown_command(record.command, root) == "python train.py --out runs/a"
        assert shown_path(record.memray.sites[0].location, root) == "deep/er/pkg/mod.py:3"
        assert shown_path(record.memray.sites[0].python_stack[0].partition(" at ")[2], root) == "torch/x.py:1"


def test_the_command_rewrites_a_folder_in_place_and_refuses_a_missing_one(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "events.jsonl").write_text(json.dumps({"cwd": str(tmp_path)}) + "\n")
    (folder / "notes.txt").write_text(str(tmp_path))
    assert main(["--root", str(tmp_path), str(folder)]) == 0
    assert (folder / "events.jsonl").read_text() == '{"cwd": "."}\n'
    assert (folder / "notes.txt").read_text() == str(tmp_path)  # not a record file
    assert main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip().endswith("nowhere")


def test_committed_records_name_no_folder_of_the_machine_that_made_them():
    tracked = subprocess.run(["git", "ls-files", "reports"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    named = {}
    for name in tracked:
        if name.endswith((".json", ".jsonl", ".md")):
            found = MACHINE_PATH.findall((ROOT / name).read_text(encoding="utf-8"))
            if found:
                named[name] = found[0]
    assert not named, (f"{len(named)} committed report files name this machine's folders, e.g. "
                       f"{next(iter(named.items()))}: run `python -m auditor.record.portable_paths reports`")
