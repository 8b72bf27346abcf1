"""Unowned tensors named by the line of the program that allocated them."""
from __future__ import annotations

import torch

import auditor
from auditor.facts import allocation_sites

MiB = 1 << 20


def _buffer(nbytes: int, dtype=torch.float32) -> torch.Tensor:
    return torch.zeros(nbytes // torch.tensor([], dtype=dtype).element_size(), dtype=dtype)


BUFFER_LINE = _buffer.__code__.co_firstlineno + 1


def test_the_site_is_the_innermost_frame_of_the_program_not_torch_or_the_auditor():
    site = allocation_sites.caller_site()
    line = test_the_site_is_the_innermost_frame_of_the_program_not_torch_or_the_auditor.__code__.co_firstlineno + 1
    assert site == f"tests/test_allocation_sites.py:{line} " \
                   "test_the_site_is_the_innermost_frame_of_the_program_not_torch_or_the_auditor"


def test_a_buffer_in_a_local_variable_is_a_component_named_by_its_line(tmp_path):
    with auditor.Audit(tmp_path / "run", census=True, live_tensors=True) as audit:
        with auditor.stage("calibrate"):
            inputs = _buffer(2 * MiB)  # held by this frame only: no census root reaches it
            flags = _buffer(MiB, torch.bool)
            small = _buffer(1024)  # below the site threshold: stays `unowned`
        del inputs, flags, small
    components = audit.record["stages"][0]["components"]
    name = f"allocated at tests/test_allocation_sites.py:{BUFFER_LINE} _buffer"
    assert components[name]["bytes"] == 3 * MiB  # the float buffer and the bool one share the line
    assert components[name]["category"] == "activations and temporaries"  # not all bool
    assert components["unowned"]["bytes"] >= 1024


def test_without_the_live_tensor_meter_the_census_keeps_them_unowned(tmp_path):
    with auditor.Audit(tmp_path / "run", census=True) as audit:
        with auditor.stage("calibrate"):
            inputs = _buffer(2 * MiB)
        del inputs
    components = audit.record["stages"][0]["components"]
    assert not any(n.startswith("allocated at") for n in components)
    assert components["unowned"]["bytes"] >= 2 * MiB
