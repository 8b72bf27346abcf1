"""The `gradprobe` command's contract for comparing variants: --variant, --masks-out, --summary-json."""
from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from gradprobe import mask_digest
from gradprobe.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--layers", "2", "--hidden", "64", "--vocab", "256", "--heads", "4", "--seq-len", "16",
        "--threads", "1", "--threshold", "0"]
SUMMARY_KEYS = {"variant", "architecture", "parameters", "prunable", "candidates", "pruned", "sparsity",
                "mask_digest", "rss_before_build", "rss_after_build", "rss_after_prune", "peak_rss",
                "prune_seconds", "build_seconds"}


def run_variant(tmp_path, variant: str, *extra: str):
    masks_file, summary_file = tmp_path / f"{variant}.safetensors", tmp_path / f"{variant}.json"
    assert main(TINY + ["--variant", variant, "--masks-out", str(masks_file),
                        "--summary-json", str(summary_file), *extra]) == 0
    return load_file(masks_file), json.loads(summary_file.read_text())


def test_masks_and_summary_files_describe_the_run(tmp_path, capsys):
    masks, summary = run_variant(tmp_path, "lean")
    out = capsys.readouterr().out
    assert set(summary) == SUMMARY_KEYS
    assert summary["variant"] == "lean" and summary["architecture"] == "tinystories-33m"
    assert (summary["parameters"], summary["prunable"], summary["candidates"]) == (247_168, 245_760, 24_576)
    assert summary["sparsity"] == summary["pruned"] / summary["prunable"]
    rss = [summary[f"rss_{when}"] for when in ("before_build", "after_build", "after_prune")]
    assert all(isinstance(b, int) and 0 < b <= summary["peak_rss"] for b in rss)  # bytes
    assert summary["prune_seconds"] > 0 and summary["build_seconds"] > 0
    # Masks: one uint8 0/1 tensor per parameter name (the tied head is the embedding's name).
    assert "transformer.wte.weight" in masks and "lm_head.weight" not in masks and len(masks) == 30
    assert all(m.dtype == torch.uint8 and int(m.max()) <= 1 for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == summary["pruned"]
    assert mask_digest({name: m.bool() for name, m in masks.items()}) == summary["mask_digest"]
    fields = dict(re.findall(r"^(\w[\w ]*?)\s{2,}(.+)$", out, re.M))
    assert fields["variant"] == "lean" and fields["mask digest"] == summary["mask_digest"]
    assert "fp32 storage" in out.splitlines()[0]


def test_variants_compared_from_their_files(tmp_path, capsys):
    baseline, _ = run_variant(tmp_path, "baseline")
    exact, _ = run_variant(tmp_path, "sparse-state")
    rounded, _ = run_variant(tmp_path, "low-precision")
    assert "bf16 storage" in capsys.readouterr().out  # low-precision's own default
    differing = lambda a, b: sum(int((a[n] != b[n]).sum()) for n in a)  # noqa: E731
    assert baseline.keys() == exact.keys() == rounded.keys()
    assert differing(baseline, exact) == 0 and differing(baseline, rounded) > 0


def test_storage_dtype_overrides_the_variants_default(tmp_path, capsys):
    """What the pruner used, not what the headline repeats: low-precision's bf16 default rounds
    its records and changes decisions (test above); given fp32 it decides as the baseline does."""
    baseline, _ = run_variant(tmp_path, "baseline")
    overridden, _ = run_variant(tmp_path, "low-precision", "--storage-dtype", "fp32")
    assert baseline.keys() == overridden.keys()
    assert all(torch.equal(baseline[name], overridden[name]) for name in baseline)


@pytest.mark.parametrize("args, message", [
    (["--variant", "tiny"], "unknown variant 'tiny'; known: baseline, sparse-state, grad-in-backward, "
                            "checkpointed, low-precision, lean"),
    (["--masks-out", "/no/such/folder/masks.safetensors"], "--masks-out: folder '/no/such/folder' does not exist"),
    (["--summary-json", "/no/such/folder/s.json"], "--summary-json: folder '/no/such/folder' does not exist"),
])
def test_bad_variant_or_output_path_is_one_line_and_exit_status_2(args, message, capsys):
    with pytest.raises(SystemExit) as exit:
        main(TINY + args)
    out, err = capsys.readouterr()
    assert exit.value.code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("gradprobe: error: ") and message in err, err
