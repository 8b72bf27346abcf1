"""Training-step studies: components exact to the byte, saved-tensor accounting against the
live-tensor meter, one step against many, leak/spike verdicts from real planted faults, and
bad input on the command line."""
from __future__ import annotations

import gc
import re
import subprocess
import sys
import weakref

import pytest
import torch
from conftest import TINY_GPT_NEO, TINY_MISTRAL, one_error_line

from auditor.analysis.training import step as training
from auditor.capture.probes.saved_tensors import SavedTensorLedger
from auditor.cli import main
from auditor.jobs import train_step

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(arch="tinystories-33m", overrides=TINY_GPT_NEO, **fields) -> train_step.Settings:
    fields.setdefault("steps", 3)
    fields.setdefault("batch_size", 2)
    fields.setdefault("sequence_length", 16)
    return train_step.Settings(arch, overrides=dict(overrides), **fields)


# -- the saved-tensor ledger against known answers ---------------------------------------

def test_ledger_counts_a_linear_input_and_relu_output_not_the_weight():
    layer = torch.nn.Linear(16, 4)
    x = torch.randn(8, 16, requires_grad=True) * 2  # a new storage, saved by the Linear
    ledger = SavedTensorLedger(layer)
    with ledger:
        torch.relu(layer(x)).sum()
    summary = ledger.summary()
    assert summary["activations"] == 8 * 16 * 4 + 8 * 4 * 4  # input, relu output
    assert summary["autocast weight copies"] == 0


def test_ledger_splits_autocast_weight_copies_from_activations():
    layer = torch.nn.Linear(16, 4)
    x = torch.randn(8, 16, requires_grad=True) * 2
    ledger = SavedTensorLedger(layer)
    with ledger, torch.autocast("cpu", dtype=torch.bfloat16):
        torch.relu(layer(x)).float().sum()
    summary = ledger.summary()
    assert summary["autocast weight copies"] == 4 * 16 * 2  # the bf16 copy of the weight
    assert summary["activations"] == 8 * 16 * 2 + 8 * 4 * 2  # bf16 input cast, bf16 relu output


def test_a_forward_that_never_reaches_backward_leaves_nothing_alive():
    layer = torch.nn.Linear(16, 4)
    weight = weakref.ref(layer.weight)
    x = torch.randn(8, 16, requires_grad=True) * 2
    with SavedTensorLedger(layer):
        torch.softmax(layer(x), -1).sum()  # the graph is dropped unused
    del layer, x
    gc.collect()
    assert weight() is None


# -- components of a real step ------------------------------------------------------------

@pytest.mark.parametrize("arch, overrides, optimizer, precision", [
    ("tinystories-33m", TINY_GPT_NEO, "adamw", "fp32"),
    ("tinystories-33m", TINY_GPT_NEO, "sgd-momentum", "amp-bf16"),
    ("mistral-7b", TINY_MISTRAL, "adam", "bf16"),
    ("mistral-7b", TINY_MISTRAL, "sgd", "fp32"),
])
def test_parameters_gradients_and_optimizer_state_equal_the_config_to_the_byte(
        tmp_path, arch, overrides, optimizer, precision):
    record = train_step.audit(tiny(arch, overrides, optimizer=optimizer, precision=precision), tmp_path)
    rows = {row["name"]: row for row in training.study(record)["components"]}
    for name in ("parameters", "gradients", "optimizer state"):
        assert rows[name]["exact"] is True, rows[name]
    expected = record.annotations["workload"]["expected"]
    width = 2 if precision == "bf16" else 4
    assert expected["parameters"] == width * expected["parameter_count"]
    copies = {"adamw": 2, "adam": 2, "sgd-momentum": 1, "sgd": 0}[optimizer]
    scalars = 4 * expected["parameter_tensors"] if optimizer in ("adamw", "adam") else 0
    assert rows["optimizer state"]["measured"] == copies * expected["parameters"] + scalars


def test_a_local_checkpoint_folder_trains_with_its_own_weights(tmp_path, tiny_mistral):
    tiny_mistral.save_pretrained(tmp_path / "checkpoint")  # config.json + model.safetensors
    settings = train_step.Settings(str(tmp_path / "checkpoint"), batch_size=2, sequence_length=16,
                                   steps=2)
    record = train_step.audit(settings, tmp_path / "run")
    result = training.study(record)
    assert all(row["exact"] for row in result["components"] if row["exact"] is not None)
    calc = result["calculator"]
    assert calc["computed_total"] == calc["measured_total"]
    assert set(calc["measured_layers"]) == {calc["computed_per_layer"]}


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "bf16"])
def test_saved_activations_match_the_live_tensors_the_forward_leaves(tmp_path, precision):
    record = train_step.audit(tiny(precision=precision), tmp_path)
    check = training.study(record)["activation_check"]
    assert check["within_tolerance"], check
    assert abs(check["relative"]) < 0.02
    totals = record.annotations["measured"]["saved_totals"]
    assert len(totals) == 3 and len(set(totals)) == 1  # every step's forward saves the same


def test_optimizer_state_appears_in_step_one_and_accumulation_holds_gradients(tmp_path):
    record = train_step.audit(tiny(accumulation=2, steps=2), tmp_path)
    result = training.study(record)
    state = record.annotations["measured"]["optimizer_state"]
    first = training.stage(record, "step 1/optimizer").live_tensors
    assert first.end - first.start == state
    text = " ".join(result["explanations"])
    assert "Optimizer state appears at step 1" in text and "Accumulation over 2 micro-batches" in text
    backward = training.micro_stages(record, 1, "backward")
    assert [s.name for s in backward] == ["backward 1", "backward 2"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_steps_have_allocator_readings_and_a_memory_viz_pickle(tmp_path):
    record = train_step.audit(tiny(device="cuda", precision="amp-bf16", steps=4), tmp_path,
                              cuda_history=True)
    result = training.study(record)
    assert all(row["exact"] for row in result["components"] if row["exact"] is not None)
    assert result["activation_check"]["within_tolerance"]
    assert len(result["series"]["cuda_allocated"]) == 4
    assert result["stability"]["cuda_allocated"]["verdict"] == "stable"
    assert (tmp_path / record.files["cuda_history"]).stat().st_size > 0


# -- leak, spike, stable through the training loop ---------------------------------------

def test_a_clean_loop_is_stable(tmp_path):
    record = train_step.audit(tiny(steps=6), tmp_path)
    assert training.study(record)["stability"]["live_tensors"]["verdict"] == "stable"


def test_a_list_keeping_each_steps_loss_with_its_graph_is_a_leak(tmp_path):
    kept = []

    def log_loss(step, model, batch):  # the classic mistake: no .item(), no detach
        kept.append(model(input_ids=batch, labels=batch).loss)

    # Long enough that each kept graph (~9 MiB) stands out against whatever else is alive
    # in the test process (the verdict is relative to the median peak).
    record = train_step.audit(tiny(steps=6, batch_size=4, sequence_length=128), tmp_path,
                              on_step=log_loss)
    verdict = training.study(record)["stability"]["live_tensors"]
    assert verdict["verdict"] == "leak", verdict
    assert verdict["slope_bytes_per_step"] > 0


def test_one_large_temporary_is_a_spike(tmp_path):
    def spike(step, model, batch):
        if step == 4:
            torch.ones(16 << 20)  # 64 MiB, freed at once: several times the tiny step

    record = train_step.audit(tiny(steps=6), tmp_path, on_step=spike)
    verdict = training.study(record)["stability"]["live_tensors"]
    assert verdict["verdict"] == "spike", verdict
    assert verdict["largest_jump"]["step"] == 4


def test_the_command_reads_the_jobs_optimizers_and_precisions_without_torch():
    """One list of each (architectures.activation_size.PRECISIONS, jobs.optimizer_state), read
    by the command line before torch loads and by the job."""
    from architectures import activation_size
    from auditor.cli import train_step as command
    assert command.OPTIMIZERS is train_step.OPTIMIZERS
    assert set(train_step.PRECISIONS) == set(activation_size.PRECISIONS)
    assert train_step.PRECISIONS["amp-bf16"] == (torch.float32, torch.bfloat16)
    check = "import sys, auditor.cli.train_step; assert 'torch' not in sys.modules, 'torch loaded'"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# -- the command --------------------------------------------------------------------------

@pytest.mark.parametrize("argv, expected", [
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--seq-len", "0"], "--seq-len must be at least 2"),
    (["--accumulation", "0"], "--accumulation must be at least 1"),
    (["--seq-len", "4096"], "exceeds tinystories-33m's maximum of 2048 positions"),
    (["--optimizer", "lion"], "unknown optimizer 'lion'"),
    (["--precision", "fp8"], "invalid choice: 'fp8'"),
    (["--amp", "fp8"], "invalid choice: 'fp8'"),
    (["--amp", "bf16", "--precision", "fp32"], "not both"),
    (["--amp", "bf16", "--device", "cuda"], "no CUDA device is available"),
    (["--arch", "gpt-5"], "unknown architecture 'gpt-5'"),
    (["--device", "tpu"], "unknown device 'tpu'"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, expected):
    if expected.startswith("no CUDA") and torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert main(["train-step", *argv]) == 2
    assert expected in one_error_line(capsys)


@pytest.mark.slow
def test_the_command_writes_the_sweep_report(tmp_path, capsys):
    out = tmp_path / "report.md"
    overrides = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256"]
    # one sequence length, two precisions: two fresh processes (27 s each on 2 cores); the
    # commentary on sequence lengths is checked on the committed sweep's records
    # (test_reports_regenerate, test_train_step_report)
    code = main(["train-step", *overrides, "--seq-len", "8", "--precision", "fp32", "amp-bf16",
                 "--steps", "4", "--batch-size", "2", "--run-dir", str(tmp_path / "runs"),
                 "-o", str(out)])
    assert code == 0
    text = out.read_text()
    assert text.count("## tinystories-33m, sequence") == 2
    assert "yes, to the byte" in text and "**no**" not in text
    assert re.search(r"amp-bf16 (lowers|raises|leaves) the full-step peak", text)
    assert "of them are still float32" in text
    assert "### Largest allocations at the peak" in text
    # sites name the step's own lines, not the live-tensor meter every op passes through
    assert "`auditor/jobs/train_step.py:" in text and "__torch_dispatch__" not in text
    assert "equal to the computed" in text and "within the 2% tolerance" in text
    assert "report:" in capsys.readouterr().out
    assert (tmp_path / "report-components.png").stat().st_size > 0

    # The same report again from the run records alone
    again = tmp_path / "again.md"
    runs = sorted((str(p) for p in (tmp_path / "runs").iterdir()), reverse=True)  # not the sweep's order
    assert main(["report", *runs, "-o", str(again)]) == 0
    def sweep(report: str) -> list[str]:  # the table and its commentary
        section = report[report.index("## Peak memory"):report.index("## tinystories-33m, sequence")]
        return [line for line in section.splitlines() if line.startswith(("|", "- "))]
    assert len(sweep(again.read_text())) == 2 + 2 + 1  # head, 2 rows; 1 precision sentence
    assert sweep(again.read_text()) == sweep(text)  # in the order the configurations ran
    # ... and to the byte: the records name the sweep's command line
    assert again.read_text().replace("again-components", "report-components") == text


@pytest.mark.slow
def test_a_killed_configuration_keeps_its_finished_stages(tmp_path):
    settings = tiny(steps=100_000)  # far more than the time allowed
    record = train_step.audit_in_fresh_process(settings, tmp_path / "run", timeout_s=20)
    assert record.exit.status == "unfinished"
    finished = [s.path for s in record.stages if s.status == "ok"]
    assert "build model" in finished and "step 1/optimizer" in finished
    assert training.study(record)["complete"] is False
