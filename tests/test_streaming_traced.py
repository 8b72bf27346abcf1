"""Streaming GradProbe on fake tensors: its weights files, hidden states and scratch records are laid
out as a real run lays them out, with no bytes read or written, so the auditor traces it at a
target's shapes; the traced run's tensors are the real run's at that scale."""
from __future__ import annotations

import os

import pytest
import torch

import architectures
from auditor.capture.tracing.fake_tensors import traced
from auditor.jobs import gradprobe as job
from gradprobe.streaming.hidden_states import SpilledStack
from gradprobe.streaming.safetensors_files import read_header
from gradprobe.streaming.writing import generate_random_weights

SMALL = dict(layers=1, hidden=64, heads=4, intermediate=172, vocab=512)
LARGER = dict(layers=2, hidden=128, heads=4, intermediate=344, vocab=1024)  # 6.3x the parameters


def settings(**overrides) -> job.Settings:
    return job.Settings(architecture="mistral-7b", overrides=overrides, variant="streaming",
                        strategy="wanda", sequence_length=32)


def test_a_traced_run_lays_out_the_weights_files_without_writing_their_bytes(tmp_path):
    config = architectures.make_config("mistral-7b", **LARGER)
    with traced():
        generate_random_weights(config, str(tmp_path), dtype=torch.bfloat16)
    files = sorted(tmp_path.glob("*.safetensors"))
    assert len(files) == 2 + LARGER["layers"]
    stored = {name: t for f in files for name, t in read_header(str(f)).items()}
    assert sum(t.nbytes for t in stored.values()) == 2 * architectures.count_parameters("mistral-7b", **LARGER)
    for file in files:  # full length, but sparse: nothing was written after the header
        size = file.stat().st_size
        assert size > max(t.nbytes for t in read_header(str(file)).values())
        assert file.stat().st_blocks * 512 < 64 * 1024, file.name


def test_spilled_fake_hidden_states_come_back_with_their_shapes(tmp_path):
    with traced():
        stack = SpilledStack(str(tmp_path / "hidden"))
        os.makedirs(stack.folder)
        stack.push([torch.empty(2, 8, 16), torch.empty(1, 8, 16)])
        stack.push([torch.empty(2, 8, 16)])  # spills the first list
        assert [tuple(t.shape) for t in stack.pop()] == [(2, 8, 16)]
        assert [tuple(t.shape) for t in stack.pop()] == [(2, 8, 16), (1, 8, 16)]
        stack.close()


@pytest.mark.slow
@pytest.mark.heavy
def test_streaming_traced_at_a_larger_scale_has_the_real_runs_peak(tmp_path, one_thread):
    small = job.audit(settings(**SMALL), tmp_path / "small")
    real = job.audit(settings(**LARGER), tmp_path / "real")
    fake = job.audit(settings(**LARGER), tmp_path / "traced", fake=True,
                     observed_sizes=small.annotations["data_dependent_sizes"])
    assert fake.annotations["result"]["prunable"] == real.annotations["result"]["prunable"]
    assert [s.path for s in fake.stages] == [s.path for s in real.stages]

    def peak(record):
        return max(s.live_tensors.peak for s in record.stages)
    assert peak(fake) == pytest.approx(peak(real), rel=0.02)
    loads = {s.path: s.live_tensors.peak for s in real.stages if s.path.endswith("load_stage")}
    for stage in fake.stages:  # a stage's weights are exact: shapes alone size them
        if stage.path in loads:
            assert stage.live_tensors.peak == loads[stage.path], stage.path
