"""The `gradprobe` command: a full run in a fresh process, and every input mistake."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from test_gradprobe_pruner import STORY, save_word_tokenizer

from gradprobe.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--layers", "2", "--hidden", "64", "--vocab", "256", "--heads", "4", "--seq-len", "16"]


def gradprobe(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gradprobe", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_a_checkpoint_folder_with_text_calibration_prints_the_summary(tmp_path, tiny_gpt_neo):
    tiny_gpt_neo.save_pretrained(tmp_path / "model")
    (tmp_path / "story.txt").write_text(STORY)
    save_word_tokenizer(tmp_path / "tokenizer", STORY)
    done = gradprobe("--arch", str(tmp_path / "model"), "--seq-len", "16", "--threads", "1",
                     "--text", str(tmp_path / "story.txt"), "--tokenizer", str(tmp_path / "tokenizer"))
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0, err
    assert out.startswith(f"gradprobe: {tmp_path / 'model'} (gpt_neo), magnitude global, s=0.1 r=0.1 tau=2.0, "
                          "2 batches of 1x16 tokens, fp32 storage, cpu, 1 threads")
    fields = dict(re.findall(r"^(\w[\w ]*?)\s{2,}(.+)$", out, re.M))
    assert fields["parameters"] == "247,168" and fields["prunable parameters"] == "245,760"
    assert fields["candidates"].startswith("24,576 (10.000% of prunable)")
    assert re.fullmatch(r"(9\.9\d\d|10\.000)% of prunable parameters", fields["final sparsity"])
    for label in ("RSS before build", "RSS after build", "RSS after prune", "peak RSS"):
        assert re.fullmatch(r"[\d,]+\.\d MiB|[\d,]+\.\d\d GiB", fields[label]), label
    assert re.fullmatch(r"[0-9a-f]{64}", fields["mask digest"])


# One of each kind of mistake, in a fresh process: no traceback, one line, status 2.
IN_A_FRESH_PROCESS = [
    (["--sparsity", "1.5"], "sparsity must be between 0 and 1"),          # ValueError from the API
    (["--strategy", "random"], "argument --strategy: invalid choice: 'random'"),  # argparse
    (["--arch", "gpt-5"], "unknown architecture 'gpt-5'; known: gpt-neo-1.3b"),
    (["--arch", "/no/such/checkpoint"], "checkpoint folder '/no/such/checkpoint' does not exist"),
]
IN_PROCESS = [
    (["--sparsity", "0"], "sparsity must be between 0 and 1"),
    (["--reduction", "0"], r"reduction factor must be in \(0, 1\]"),
    (["--reduction", "1.5"], r"reduction factor must be in \(0, 1\]"),
    (["--batches", "0"], "num_batches must be an integer >= 1"),
    (["--threshold", "-1"], "gradient threshold must be >= 0"),
    (["--storage-dtype", "fp8"], "argument --storage-dtype: invalid choice"),
    (["--seq-len", "1"], "--seq-len must be at least 2"),
    (["--text", "story.txt"], "--text and --tokenizer go together"),
    (["--sparsity", "ten"], "argument --sparsity: invalid float value: 'ten'"),
    (["--hidden", "65"], "not divisible by 4 heads"),
    (["--text", "/no/story.txt", "--tokenizer", "/no/tokenizer"], "text file '/no/story.txt' does not exist"),
]


def check_one_line(err: str, message: str) -> None:
    assert err.count("\n") == 1 and err.startswith("gradprobe: error: "), err
    assert re.search(message, err), err


def test_bad_input_in_a_fresh_process_is_one_line_and_exit_status_2():
    running = [(gradprobe(*TINY, *args), message) for args, message in IN_A_FRESH_PROCESS]  # in parallel
    for process, message in running:
        out, err = process.communicate(timeout=120)
        assert (process.returncode, out) == (2, ""), err
        check_one_line(err, message)


@pytest.mark.parametrize("args, message", IN_PROCESS + IN_A_FRESH_PROCESS)
def test_every_bad_input_is_one_line_and_exit_status_2(args, message, capsys):
    with pytest.raises(SystemExit) as exit:
        main(TINY + args)
    assert exit.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    check_one_line(err, message)
