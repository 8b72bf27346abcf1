"""Bad input, command by command: one table per command, each row a real process started in a
folder that holds a sentinel file, a finished run, a committed report and a few broken inputs.

Every row must end with exit status 2 and exactly one line on stderr, `PROGRAM: error: ...`, with
no traceback; nothing new may appear in the folder (nor at the output paths the row names), every
file in it must stay byte-identical, and the answer must come in under 1.5 s: the checks run
before torch is imported, and before anything is built, run or written.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

LIMIT_S = 1.5
UNWRITABLE = "readonly"  # a folder no one may create files in (see `_make_unwritable`)
TINY = ["--layers", "1", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq-len", "16"]


# -- the folder every row starts in -------------------------------------------------------------
# Plain functions under the fixtures: benchmarks/reliability.py prepares its folders with them too.

def make_finished_run(folder: Path) -> Path:
    """A real run folder (run.json + events.jsonl) made in `folder` by `auditor run`."""
    (folder / "script.py").write_text("print('hello')\n")
    done = subprocess.run([sys.executable, "-m", "auditor", "run", "--out", "run", "script.py"],
                          cwd=folder, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (folder / "run" / "run.json").is_file() and (folder / "run" / "events.jsonl").is_file()
    return folder / "run"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A real run folder, made once."""
    return make_finished_run(tmp_path_factory.mktemp("finished"))


@pytest.fixture
def workspace(tmp_path, finished_run):
    """The row's current folder. Yields (folder, whether `readonly/` is really unwritable)."""
    with prepared_workspace(tmp_path, finished_run) as prepared:
        yield prepared


@contextmanager
def prepared_workspace(tmp_path: Path, finished_run: Path):
    """Fills the empty folder `tmp_path`: a copy of `finished_run`, a sentinel, a committed report,
    broken inputs, an unwritable folder. Yields (folder, whether `readonly/` is really unwritable);
    makes `readonly/` writable again on leaving."""
    import shutil
    shutil.copytree(finished_run, tmp_path / "run")
    record = json.loads((finished_run / "run.json").read_text())
    (tmp_path / "typed").mkdir()  # a record whose fields have the wrong types
    (tmp_path / "typed" / "run.json").write_text(json.dumps({**record, "peak": {"rss": "x", "stage": None}}))
    (tmp_path / "sentinel.txt").write_text("do not touch\n")
    (tmp_path / "script.py").write_text("print('hello')\n")
    (tmp_path / "notjson.json").write_text("{not json")
    (tmp_path / "otherschema.json").write_text('{"schema": "someone-else/9"}')
    (tmp_path / "empty").mkdir()
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "gradprobe-tinystories-33m.md").write_text("# the committed report\n")
    for name, config in [("ckpt-notjson", "{not json"), ("ckpt-nomodeltype", '{"hidden_size": 64}'),
                         ("ckpt-unknowntype", '{"model_type": "no-such-model-type"}'),
                         ("ckpt-list", "[1, 2]"), ("ckpt-badsize", '{"model_type": "gpt_neo", "num_layers": "x"}'),
                         ("ckpt-badheads", '{"model_type": "mistral", "num_key_value_heads": 3}')]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(config)
    for name in ("one/model", "two/model"):  # two checkpoints, one folder name
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "config.json").write_text('{"model_type": "gpt_neo"}')
    (tmp_path / "ckpt-noconfig").mkdir()
    (tmp_path / "ckpt-noconfig" / "model.safetensors").write_bytes(b"\0" * 8)
    (tmp_path / UNWRITABLE).mkdir()
    undo = _make_unwritable(tmp_path / UNWRITABLE)
    try:
        yield tmp_path, not os.access(tmp_path / UNWRITABLE, os.W_OK)
    finally:
        undo()


def _make_unwritable(folder: Path):
    """chmod for a user; root ignores modes, so for root the immutable flag (chattr +i), which
    even root cannot create files under. Returns what undoes it."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return lambda: folder.chmod(0o755)
    done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True)
    if done.returncode != 0:
        return lambda: None
    return lambda: subprocess.run(["chattr", "-i", str(folder)], capture_output=True)


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder`: a file's bytes, None for a folder."""
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes())
            for p in sorted(folder.rglob("*"))}


@dataclass
class Attempt:
    """What one row did: its process's ending and output, and the folder's paths it added or changed."""
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float
    written: list[str]  # paths that were not in the folder before
    changed: list[str]  # paths whose bytes changed, or that are gone


def attempt(program: str, args: list[str], folder: Path) -> Attempt:
    """`python -m PROGRAM ARGS` run in `folder`, timed, with the folder compared before and after."""
    before = _snapshot(folder)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", program, *args], cwd=folder, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    elapsed = time.perf_counter() - start
    after = _snapshot(folder)
    return Attempt(done.returncode, done.stdout, done.stderr, elapsed,
                   written=sorted(set(after) - set(before)),
                   changed=[path for path in before if after.get(path, b"gone") != before[path]])


def needs_unwritable(args: list[str]) -> bool:
    return any(UNWRITABLE in arg for arg in args)


def check_refused(program: str, args: list[str], says: str, workspace) -> float:
    folder, unwritable = workspace
    if needs_unwritable(args) and not unwritable:
        pytest.skip("no folder can be made unwritable here (root without chattr)")
    done = attempt(program, args, folder)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, f"exit {done.returncode}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{program}: error: "), lines[0]
    assert says in lines[0], lines[0]
    assert done.stdout == "", done.stdout
    assert done.written == [], "written"
    assert done.changed == [], "changed or removed"
    assert done.elapsed_s < LIMIT_S, f"{done.elapsed_s:.2f} s for a usage error"
    return done.elapsed_s


# -- auditor run --------------------------------------------------------------------------------

RUN = [
    ([], "needs a script"),
    (["nothere.py"], "does not exist"),
    (["empty"], "is not a file"),
    (["--out", "run", "script.py"], "already holds a run record"),
    (["--out", "sentinel.txt", "script.py"], "is not a folder"),
    (["--out", "sentinel.txt/sub", "script.py"], "is not a folder"),
    (["--run-dir", "", "script.py"], "--run-dir is empty"),
    (["--run-dir", "d" * 300, "script.py"], "over the file system's 255"),
    (["--out", f"{UNWRITABLE}/new", "script.py"], "not writable"),
    (["--stage", "no_such_module_here:f", "script.py"], "no module named"),
    (["--stage", "json:no_such_function", "script.py"], "has no attribute"),
    (["--stage", "not-a-target", "script.py"], "should look like module:function"),
    (["--stage", "script:nothere", "script.py"], "script.py binds no 'nothere' at its top level"),
    (["--stage", "__main__:Pruner.prune_layr", "-c", "class Pruner:\n    def prune_layer(self): pass"],
     "defines class Pruner without 'prune_layr' in its body or bases; did you mean Pruner.prune_layer?"),
    (["--stage", "builtins:dict.get", "script.py"], "cannot be patched: dict is a type written in C"),
    (["--label", "no_such_module_here:f", "script.py"], "--label: no module named"),
    (["--label", "json:no_such_function", "script.py"], "has no attribute"),
    (["--label", "json", "script.py"], "should look like module:function"),
    (["--label", "json:decoder", "script.py"], "is not a function"),
    (["--bogus", "script.py"], "unrecognized arguments"),
]


@pytest.mark.parametrize("args, says", RUN)
def test_auditor_run(args, says, workspace):
    check_refused("auditor", ["run", *args], says, workspace)


# -- auditor report -----------------------------------------------------------------------------

REPORT = [
    ([], "required: RUN"),
    (["nothere"], "no run record"),
    (["notjson.json"], "not valid JSON"),
    (["sentinel.txt"], "not valid JSON"),
    (["otherschema.json"], "schema"),
    (["typed"], "peak.rss"),
    (["empty"], "no run record"),
    (["run", "run"], "several runs"),
    (["run", "-o", "run/run.json"], "run record"),
    (["run", "-o", "run/events.jsonl"], "run record"),
    (["run", "-o", "empty"], "is a folder"),
    (["run", "-o", "run"], "run record"),
    (["run", "-o", "missing/report.md"], "does not exist"),
    (["run", "-o", "report.png"], ".md"),
    (["run", "-o", f"{UNWRITABLE}/report.md"], "not writable"),
]


@pytest.mark.parametrize("args, says", REPORT)
def test_auditor_report(args, says, workspace):
    check_refused("auditor", ["report", *args], says, workspace)


# -- auditor gradprobe --------------------------------------------------------------------------

GRADPROBE_JOB = [
    (["--seq-len", "1"], "--seq-len must be at least 2"),
    (["--seq-len", "100000000"], "exceeds tinystories-33m's maximum of 2048 positions"),
    (["--seq-len", "4096"], "exceeds tinystories-33m's maximum of 2048 positions"),
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--threads", "-3"], "--threads must be at least 1"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--device", "cuda:x"], "unknown device 'cuda:x'"),
    (["--arch", "ckpt-notjson"], "config.json is not JSON"),
    (["--arch", "ckpt-list"], "holds no JSON object"),
    (["--arch", "ckpt-nomodeltype"], "names no model_type"),
    (["--arch", "ckpt-unknowntype"], "'no-such-model-type'"),
    (["--arch", "ckpt-noconfig"], "has no config.json"),
    (["--arch", "ckpt-badsize"], "num_layers must be a positive integer"),
    (["--arch", "ckpt-badheads"], "not a multiple of 3 key/value heads"),
    (["--arch", "gpt-5"], "unknown architecture 'gpt-5'"),
    (["--layers", "0"], "must be a positive integer"),
    (["--hidden", "65"], "not divisible by"),
    (["--sparsity", "nan"], "not a finite number"),
    (["--sparsity", "1.5"], "sparsity must be between 0 and 1"),
    (["--threshold", "inf"], "not a finite number"),
    (["--reduction", "0"], "reduction factor"),
    (["--batches", "0"], "num_batches"),
    (["--variant", "nope"], "unknown variant 'nope'"),
    (["--strategy", "random"], "invalid choice"),
    (["--weights-dtype", "bf16"], "only streaming prunes from"),  # the baseline builds fp32
    (["--variant", "streaming", "--weights-dtype", "int8"], "invalid choice"),
    (["--seed", str(2**70)], "--seed must be between"),
    (["--target", "gpt-5"], "--target: unknown architecture"),
    (["--target", "mistral-7b", "--target", "mistral-7b"], "--target mistral-7b is given twice"),
    (["--arch", "mistral-7b", "--seq-len", "8000", "--target", "llama-2-7b"],
     "exceeds llama-2-7b's maximum of 4096 positions"),  # the traced projection runs the target
    (["-o", "missing/report.md"], "does not exist"),
    (["-o", "report.png"], "ending in .md"),
    (["-o", "run/run.json"], "ending in .md"),
    (["-o", "empty"], "folder"),
    (["-o", ""], "folder"),
    (["-o", f"{UNWRITABLE}/report.md"], "permission denied"),
    (["--run-dir", "run"], "run"),
    (["--run-dir", "sentinel.txt"], "not a folder"),
]


@pytest.mark.parametrize("args, says", GRADPROBE_JOB)
def test_auditor_gradprobe(args, says, workspace):
    check_refused("auditor", ["gradprobe", *TINY, "--no-memray", *args], says, workspace)


# -- auditor train-step -------------------------------------------------------------------------

TRAIN_STEP = [
    (["--lr", "-1"], "--lr must be a finite number > 0"),
    (["--lr", "0"], "--lr must be a finite number > 0"),
    (["--lr", "nan"], "not a finite number"),
    (["--lr", "inf"], "not a finite number"),
    (["--seq-len", "4096"], "exceeds tinystories-33m's maximum of 2048 positions"),
    (["--seq-len", "1"], "--seq-len must be at least 2"),
    (["--seq-len", "16", "100000000"], "exceeds"),
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--accumulation", "0"], "--accumulation must be at least 1"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--optimizer", "lion"], "unknown optimizer 'lion'"),
    (["--precision", "fp8"], "invalid choice"),
    (["--amp", "bf16", "--precision", "fp32"], "not both"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--arch", "tinystories-33m", "gpt-5"], "unknown architecture 'gpt-5'"),
    (["--arch", "ckpt-notjson"], "config.json is not JSON"),
    (["--arch", "ckpt-unknowntype"], "'no-such-model-type'"),
    (["--arch", "ckpt-badsize"], "num_layers must be a positive integer"),
    (["--seed", str(-2**70)], "--seed must be between"),
    (["--arch", "tinystories-33m", "tinystories-33m"], "--arch tinystories-33m is given twice"),
    (["--arch", "one/model", "two/model"], "share the name 'model'"),
    (["--seq-len", "16", "16"], "--seq-len 16 is given twice"),
    (["--precision", "fp32", "fp32"], "--precision fp32 is given twice"),
    (["-o", "missing/report.md"], "does not exist"),
    (["-o", "report.png"], "ending in .md"),
    (["-o", "empty"], "folder"),
    (["-o", f"{UNWRITABLE}/report.md"], "permission denied"),
    (["--run-dir", "sentinel.txt"], "not a folder"),
]


@pytest.mark.parametrize("args, says", TRAIN_STEP)
def test_auditor_train_step(args, says, workspace):
    check_refused("auditor", ["train-step", *TINY, "--steps", "1", "--no-memray", *args], says, workspace)


# -- auditor compare ----------------------------------------------------------------------------

TINY_SIDES = ["--", *TINY, "--threads", "1"]
COMPARE = [
    ([], "nothing to compare"),
    (["--variant", "lean", "--repeats", "0"], "--repeats must be at least 1"),
    (["--variant", "nope"], "unknown variant 'nope'"),
    (["--variant", "lean", "-o", "x.png"], "markdown"),
    (["--variant", "lean", "-o", "empty"], ".md"),
    (["--variant", "lean", "--tolerance", "lean=abc"], "--tolerance"),
    (["--variant", "lean", "--tolerance", "nope=1"], "--tolerance"),
    (["--variant", "lean", "--tolerance", "lean=nan"], "--tolerance"),
    (["--variant-cmd", "a", "no-such-command-here"], "not an executable"),
    (["--variant-cmd", " ", "ls"], "needs a name"),
    (["--baseline", "baseline", "--baseline-cmd", "a", "ls", "--variant", "lean"], "not both"),
    (["--from", "nothere.json"], "nothere.json"),
    (["--from", "notjson.json"], "notjson.json"),
    (["--variant", "lean", "--keep-runs", "run"], "not empty"),
    (["--variant", "lean", "--variant", "lean"], "twice"),
    (["--variant", "lean", "-o", "run/compare.md"], "run folder"),
    (["--variant", "lean", "-o", "missing/compare.md"], "does not exist"),
    (["--variant", "lean", "-o", f"{UNWRITABLE}/compare.md"], "permission denied"),
    # GradProbe's own arguments: its process refuses them before torch loads, and compare says so.
    (["--variant", "lean", *TINY_SIDES, "--seq-len", "1"], "--seq-len must be at least 2"),
    (["--variant", "lean", *TINY_SIDES, "--threads", "0"], "--threads must be at least 1"),
]


@pytest.mark.parametrize("args, says", COMPARE)
def test_auditor_compare(args, says, workspace):
    # Tiny GradProbe sides, one repeat: a row the checks let through runs seconds, not minutes.
    repeats = [] if {"--repeats", "--from"} & set(args) else ["--repeats", "1"]
    sides = [] if "--" in args or "--from" in args or not args else TINY_SIDES
    check_refused("auditor", ["compare", *repeats, *args, *sides], says, workspace)


# -- auditor validate-projection ----------------------------------------------------------------

VALIDATE = [
    (["--seq-len", "1"], "--seq-len must be at least 2"),
    (["--seq-len", "4096"], "exceeds tinystories-33m's maximum of 2048 positions"),
    (["--target", "gpt-5"], "--target: unknown architecture 'gpt-5'"),
    (["--target", "ckpt-notjson"], "config.json is not JSON"),
    (["--arch", "gpt-5"], "unknown architecture 'gpt-5'"),
    (["--target-layers", "0"], "must be a positive integer"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--available", "8G"], "--available"),
    (["--available", "0"], "--available"),
    (["--margin", "lots"], "--margin"),
    (["--sparsity", "nan"], "not a finite number"),
    (["--variant", "nope"], "unknown variant 'nope'"),
    (["-o", "missing/validation.md"], "does not exist"),
    (["-o", "validation.txt"], "ending in .md"),
    (["-o", "empty"], "folder"),
    (["-o", f"{UNWRITABLE}/validation.md"], "permission denied"),
    (["--run-dir", "run"], "run"),
]


@pytest.mark.parametrize("args, says", VALIDATE)
def test_auditor_validate_projection(args, says, workspace):
    check_refused("auditor", ["validate-projection", *TINY, *args], says, workspace)


# -- auditor export -----------------------------------------------------------------------------

EXPORT = [
    ([], "required: RUN"),
    (["nothere"], "no run record"),
    (["notjson.json"], "not valid JSON"),
    (["sentinel.txt"], "not valid JSON"),
    (["typed"], "peak.rss"),
    (["empty"], "no run record"),
    (["run/events.jsonl"], "not valid JSON"),
    (["run", "-o", "run/run.json"], "run record"),
    (["run", "-o", "run/events.jsonl"], "run record"),
    (["run", "-o", "empty"], "is a folder"),
    (["run", "-o", "run"], "is a folder"),
    (["run", "-o", "missing/trace.json"], "does not exist"),
    (["run", "-o", f"{UNWRITABLE}/trace.json"], "not writable"),
    (["run", "-o", "script.py"], "not a .json file"),
    (["run", "-o", "t" * 300 + ".json"], "over the file system's limit"),
    (["t" * 300], "over the file system's limit"),
    (["run", "--format", "pprof"], "invalid choice"),
]


@pytest.mark.parametrize("args, says", EXPORT)
def test_auditor_export(args, says, workspace):
    check_refused("auditor", ["export", *args], says, workspace)


# -- gradprobe ----------------------------------------------------------------------------------

GRADPROBE = [
    (["--seq-len", "1"], "--seq-len must be at least 2"),
    (["--seq-len", "4096"], "exceeds tinystories-33m's maximum of 2048 positions"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--threads", "-3"], "--threads must be at least 1"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--sparsity", "nan"], "not a finite number"),
    (["--threshold", "-1"], "gradient threshold must be >= 0"),
    (["--masks-out", "missing/masks.safetensors"], "does not exist"),
    (["--masks-out", "empty"], "is a folder"),
    (["--masks-out", f"{UNWRITABLE}/masks.safetensors"], "permission denied"),
    (["--masks-out", "out.bin", "--summary-json", "out.bin"], "both name"),
    (["--variant", "nope"], "unknown variant 'nope'"),
    (["--arch", "ckpt-notjson"], "config.json is not JSON"),
    (["--arch", "ckpt-unknowntype"], "'no-such-model-type'"),
    (["--text", "script.py"], "--text and --tokenizer go together"),
    (["--text", "nothere.txt", "--tokenizer", "empty"], "does not exist"),
    (["--text", "script.py", "--tokenizer", "empty"], "holds none of tokenizer.json"),
    (["--arch", "ckpt-badheads"], "not a multiple of 3 key/value heads"),
    (["--storage-dtype", "int8"], "invalid choice"),
    (["--hidden", "65"], "not divisible by"),
    (["--seed", str(2**70)], "--seed must be between"),
]


@pytest.mark.parametrize("args, says", GRADPROBE)
def test_gradprobe(args, says, workspace):
    check_refused("gradprobe", [*TINY, *args], says, workspace)


# -- one option, one definition -----------------------------------------------------------------

@pytest.mark.parametrize("program, command", [
    ("gradprobe", []), ("auditor", ["gradprobe"]), ("auditor", ["train-step"]),
    ("auditor", ["validate-projection"]),
])
def test_every_command_refuses_a_one_token_sequence_in_the_same_words(program, command, workspace):
    """--seq-len was >= 1 in some commands and >= 2 in others; a causal LM's loss needs two."""
    check_refused(program, [*command, "--seq-len", "1"],
                  "error: --seq-len must be at least 2 (a causal LM's loss needs a next token to predict), "
                  "got 1", workspace)


def test_the_names_checked_without_torch_are_the_registries_names():
    from gradprobe import settings
    from gradprobe.strategies import STRATEGIES
    from gradprobe.streaming.pruner import STRATEGIES as STREAMING_STRATEGIES
    from gradprobe.variants import VARIANTS
    assert tuple(VARIANTS) == settings.VARIANTS
    assert settings.STRATEGIES == tuple(STRATEGIES) == tuple(STREAMING_STRATEGIES)


def test_a_refused_sweep_leaves_no_reports_folder_behind(tmp_path):
    """The default report folder is made only once every check has passed, the run folders' too."""
    (tmp_path / "runs" / "tinystories-33m-seq16-fp32").mkdir(parents=True)
    (tmp_path / "runs" / "tinystories-33m-seq16-fp32" / "run.json").write_text("{}")
    before = _snapshot(tmp_path)
    done = subprocess.run([sys.executable, "-m", "auditor", "train-step", *TINY, "--run-dir", "runs"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "never reused" in done.stderr, done.stderr
    assert _snapshot(tmp_path) == before
