"""Reports name source files without the folders of the machine that ran them."""
from auditor.analysis.run.source_paths import code_root, shown_command, shown_path
from auditor.record.schema import RunRecord


def record_with(memray) -> RunRecord:
    """A minimal record with these memray results (each site's sizes filled in)."""
    if memray is not None:
        memray = {"sites": [{**site, "bytes": 1, "allocations": 1} for site in memray["sites"]]}
    return RunRecord.from_json({"schema": "auditor.run/1", "name": "x", "command": "x", "started_at": "t",
                                "device": "cpu", "environment": {}, "process": {}, "stages": [],
                                "peak": {"rss": None}, "memray": memray})

SITES = {"memray": {"sites": [
    {"location": "/home/ann/work/repo/gradprobe/gradients.py:19",
     "python_stack": ["gradient_passes at /home/ann/work/repo/gradprobe/gradients.py:19",
                      "backward at /home/ann/.venv/lib/python3.11/site-packages/torch/_tensor.py:623"]},
    {"location": "/home/ann/work/repo/architectures/__init__.py:175",
     "python_stack": ["run at /usr/lib/python3.11/runpy.py:86",
                      "main at /home/ann/work/repo/auditor/cli/__init__.py:60"]},
]}}


def test_the_audited_code_is_shown_from_the_folder_its_files_share():
    root = code_root(record_with(SITES["memray"]))
    assert root == "/home/ann/work/repo"
    assert shown_path("/home/ann/work/repo/gradprobe/gradients.py:19", root) == "gradprobe/gradients.py:19"
    assert (shown_path("/home/ann/.venv/lib/python3.11/site-packages/torch/_tensor.py:623", root)
            == "torch/_tensor.py:623")
    assert shown_path("/usr/lib/python3.11/runpy.py:86", root) == "runpy.py:86"
    assert shown_path("/opt/other/place/deep/file.py:3", root) == "place/deep/file.py:3"
    assert shown_path("<frozen importlib._bootstrap>:241", root) == "<frozen importlib._bootstrap>:241"


def test_a_record_without_sites_has_no_root_and_keeps_three_parts():
    assert code_root(record_with(None)) is None
    assert shown_path("/a/b/c/d/e.py:1", None) == "c/d/e.py:1"


def test_the_command_names_the_interpreter_and_shortens_the_audited_code():
    command = "/home/ann/.venv/bin/python /home/ann/work/repo/auditor/__main__.py gradprobe --run-dir '/tmp/a b'"
    assert shown_command(command, "/home/ann/work/repo") == (
        "python auditor/__main__.py gradprobe --run-dir '/tmp/a b'")
    assert shown_command("auditor run x.py", None) == "auditor run x.py"
    assert shown_command("python 'unclosed", None) == "python 'unclosed"
