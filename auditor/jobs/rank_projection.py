"""Per-rank projection of a sharded run: rank r of an N-rank job traced in one process, on the
target's fake tensors, with no peers and no memory.

    traced = traced_ranks(settings, world_size=8, out=RUN)     # {rank: traced record}, RUN/rank-N/
    real = real_ranks(settings, world_size=2, out=REAL)        # a real torchrun (gloo), REAL/rank-N/

How: torch's fake process group (`torch.testing._internal.distributed.fake_pg`, backend "fake")
answers every collective at once without peers, so one process is rank r of N: FSDP2 shards the
model as it would on that rank (its `torch.chunk` rows, padded as FSDP pads them), all-gathers a
layer into a buffer of the whole layer's size and reduce-scatters into the rank's shard, and the
project's traced run (FakeTensorMode, auditor.capture.tracing.fake_tensors) measures every tensor at its nominal size.
A collective's result holds no real values (fake tensors have none anyway).

One thing breaks under FakeTensorMode: FSDP2 builds its default DeviceMesh from `torch.arange`
and reads its values back (`tolist`); under fake tensors those values do not exist (the project's
value-free mode reads them as 0, and every rank became rank 0 of a mesh of zeros: empty shards).
So the mesh is built before tracing begins, on real tensors, and `fully_shard` is given it when it
asks for its default (`default_mesh`).

And one thing differs: FSDP2 keeps a padded shard (a rank whose rows do not divide evenly) only if
its storage's data pointer is nonzero and unchanged (`FSDPParam.reset_sharded_param`); a fake
storage's pointer reads 0, so a traced rank padded a second copy of every padded shard that a real
rank does not (+9-11% on the last rank); FSDP2 also checks the shard is a plain `torch.Tensor`,
which a FakeTensor is not. While tracing, a fake shard still on the storage FSDP2 padded is kept
as a real one is (`keep_padded_shards`, around `FSDPParam.reset_sharded_param`). Nothing else of
FSDP2 is replaced.

Both modes run the same audited program (`rank_workload`): build, "shard model" (the pruner joins
the process group and fully_shards), "prune". Ranks whose shards have the same shapes, other than
rank 0, run the same program on the same shapes; `rank_classes` names one rank per class, which
`traced_ranks(..., every_rank=False)` traces for the others (the report says so).
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch

import auditor
from auditor.analysis.ranks.projection import ProjectedWorld
from auditor.capture.audit import Audit
from auditor.facts import safe_files
from auditor.jobs import gradprobe as job
from auditor.jobs.gradprobe import Settings
from auditor.jobs.settings import RANK_VARIANT as VARIANT
from auditor.record.schema import RunRecord


def rank_workload(settings: Settings) -> dict:
    """Build the model, shard it (the pruner joins the group and fully_shards), prune. Returns the
    record's annotations: the result's counts and the units' `gather_buffers`."""
    import architectures
    from architectures.calibration import synthetic_batches
    from gradprobe.variants import make_pruner
    with auditor.stage("build model"):
        model = architectures.build_model(settings.architecture, seed=settings.seed, **settings.overrides)
    from transformers import PreTrainedModel  # imported by the build: the stage above counted its import
    assert isinstance(model, PreTrainedModel)  # a causal LM: its config gives the vocabulary
    auditor.track("model", model)
    batches = synthetic_batches(model.config.vocab_size, settings.sequence_length, settings.batch_size,
                                settings.batches, seed=settings.seed)
    buffers = gather_buffers(model, _world_size())
    with auditor.stage("shard model"):
        pruner = make_pruner(settings.variant, model, settings.strategy)
        auditor.track("pruner", pruner, categories=job.pruner_categories(settings.variant))
    with auditor.stage("prune"):
        result = pruner.prune(batches, sparsity=settings.sparsity, num_batches=settings.batches,
                              reduction_factor=settings.reduction, gradient_threshold=settings.threshold)
    return {"result": {"candidates": result.candidates, "pruned": result.pruned, "prunable": result.prunable},
            "gather_buffers": buffers}


def rank_audit(settings: Settings, out: Path, *, fake: bool, observed_sizes: list | None = None,
               estimate_sizes: bool = True) -> RunRecord:
    """This rank's audited run (RUN/rank-N/ under a process group or torchrun's environment)."""
    name = f"gradprobe-{settings.variant}-{settings.architecture}" + ("-traced" if fake else "")
    with Audit(out=out, name=name, census=True, live_tensors=True, traced=fake,
               stage_targets=job.stage_targets(settings.variant), stage_label=job.phase_label(settings.variant),
               record_sizes=not fake, observed_sizes=observed_sizes, estimate_sizes=estimate_sizes) as run:
        run.annotate("workload", job.workload(settings))
        for key, value in rank_workload(settings).items():
            run.annotate(key, value)
    return RunRecord.from_json(run.record, str(run.run_json))


def gather_buffers(model: torch.nn.Module, world_size: int) -> dict[str, int]:
    """Bytes of each FSDP2 unit's whole flat buffer (its all-gather output): every parameter of the
    unit padded to `world_size` equal chunks of rows. A real gloo rank was seen holding one more
    all-gather output than the traced rank at a gradient pass's peak, in about half of its runs (the
    root's and a layer's together; consistent with gloo's worker thread dropping the collective's
    last reference after FSDP let it go; the fake process group has no such thread), so the
    projection's upper bound adds the largest unit's (auditor.analysis.ranks.projection)."""
    from gradprobe.variants.shards import decoder_layers
    units = {name: m for name, m in model.named_modules() if m in set(decoder_layers(model))}
    inside = {id(p) for m in units.values() for p in m.parameters()}
    sizes = {name: _padded_bytes(m.parameters(), world_size) for name, m in units.items()}
    sizes["(root)"] = _padded_bytes((p for p in model.parameters() if id(p) not in inside), world_size)
    return sizes


def _padded_bytes(parameters, world_size: int) -> int:
    total = 0
    for p in parameters:
        rows = p.shape[0] if p.dim() else 1
        total += -(-rows // world_size) * world_size * (p.numel() // max(rows, 1)) * p.element_size()
    return total


def _world_size() -> int:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


# -- one rank of N in this process: the fake process group -------------------------------------

def join_fake_group(rank: int, world_size: int):
    """This process as rank `rank` of `world_size` on torch's fake process group; returns the
    device mesh FSDP2 would build, made here on real tensors (see the module docstring)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    return init_device_mesh("cpu", (world_size,))


@contextlib.contextmanager
def default_mesh(mesh):
    """fully_shard's default mesh is `mesh` (built outside the fake mode) while inside."""
    from torch.distributed.fsdp._fully_shard import _fully_shard as module
    original = module._init_default_mesh
    module._init_default_mesh = lambda *args, **kwargs: mesh
    try:
        yield
    finally:
        module._init_default_mesh = original


@contextlib.contextmanager
def keep_padded_shards():
    """While inside, FSDP2's `reset_sharded_param` keeps a fake padded shard whose storage is the
    one it padded, as it keeps a real one (see the module docstring); any other case is FSDP2's."""
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    from auditor.capture.census.take import is_fake
    original = FSDPParam.reset_sharded_param

    def reset_sharded_param(self):
        info, kept = self._module_info, self._sharded_param_data
        param = getattr(info.module, info.param_name)
        local = getattr(param, "_local_tensor", None)
        if (param is self.sharded_param and local is not None and is_fake(kept) and not local.is_meta
                and not self.pin_memory
                and kept.untyped_storage()._cdata == local.untyped_storage()._cdata):
            self._sharding_spec = param._spec  # all a real rank's call changes when its shard is kept
            return
        original(self)

    FSDPParam.reset_sharded_param = reset_sharded_param  # type: ignore[method-assign]
    try:
        yield
    finally:
        FSDPParam.reset_sharded_param = original  # type: ignore[method-assign]


def _traced_rank_main(argv: list[str]) -> None:
    """python -m auditor.jobs.rank_projection traced SETTINGS OUT WORLD RANK SIZES_JSON"""
    settings, out, world, rank, sizes = argv
    torch.set_num_threads(1)
    sizes = json.loads(Path(sizes).read_text())
    mesh = join_fake_group(int(rank), int(world))
    with default_mesh(mesh), keep_padded_shards():
        rank_audit(Settings(**json.loads(settings)), Path(out), fake=True,
                   observed_sizes=sizes.get("observed"), estimate_sizes=sizes.get("estimate", True))


def _real_rank_main(argv: list[str]) -> None:
    """python -m auditor.jobs.rank_projection real SETTINGS OUT (under torchrun: gloo)"""
    import torch.distributed as dist
    settings, out = argv
    torch.set_num_threads(1)
    rank_audit(Settings(**json.loads(settings)), Path(out), fake=False)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


# -- the parent's side: fresh processes ------------------------------------------------------

def traced_rank(settings: Settings, world_size: int, rank: int, out: Path, observed_sizes: list | None,
                timeout_s: int = 3600, lower_bound: bool = True) -> RunRecord:
    """Rank `rank` of `world_size` traced in a fresh process into OUT/rank-R/; where sizes were
    estimated, traced again with them empty (OUT/lower-bound/rank-R/) to measure the bytes that rest
    on them (the record's `estimated_bytes`), as the single-process traced audit does."""
    from auditor.analysis.projection.estimated_bytes import estimated_bytes, has_estimates
    record = _traced_child(settings, world_size, rank, Path(out), observed_sizes, True, timeout_s)
    if lower_bound and has_estimates(record):
        lower = _traced_child(settings, world_size, rank, Path(out) / "lower-bound", None, False, timeout_s)
        record.annotations["estimated_bytes"] = estimated_bytes(record, lower)
    return record


def _traced_child(settings, world_size, rank, out: Path, observed, estimate, timeout_s) -> RunRecord:
    """The traced record in OUT/rank-R/: traced now, or the one a finished earlier trace left there
    (a 7B trace takes minutes) if it traced these settings at this world size."""
    from auditor.capture.fresh_process import run_module
    from auditor.record.run_folder import RUN_FILE, load, rank_folder_name
    if (out / rank_folder_name(rank) / RUN_FILE).is_file():
        earlier = load(out / rank_folder_name(rank))
        if (earlier.annotations["workload"]["settings"] != asdict(settings)
                or (earlier.rank.world_size if earlier.rank else None) != world_size):
            raise ValueError(f"{out / rank_folder_name(rank)} holds a trace of other settings: choose a new folder")
        return earlier
    out.mkdir(parents=True, exist_ok=True)
    sizes = out / f"sizes-rank-{rank}.json"
    safe_files.write_text(sizes, json.dumps({"observed": observed, "estimate": estimate}))
    env_free = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k in os.environ}
    try:
        child = run_module("auditor.jobs.rank_projection", "traced", json.dumps(asdict(settings)), str(out),
                           str(world_size), str(rank), str(sizes), run_folder=out / rank_folder_name(rank),
                           timeout_s=timeout_s)
    finally:
        os.environ.update(env_free)
    if not child.ok or child.record is None:
        raise RuntimeError(child.failure(f"traced rank {rank} of {world_size} for {settings.architecture}"))
    return child.record


def rank_classes(settings: Settings, world_size: int) -> list[list[int]]:
    """Ranks that run the same program on the same shapes, each class's first rank first: rank 0
    alone (its own class: a program may do more there), the others grouped by the rows
    (`torch.chunk`, as FSDP2 shards on dim 0) they hold of every parameter."""
    from transformers import AutoModelForCausalLM

    import architectures
    with torch.device("meta"):  # shapes only: nothing allocated, no weights initialised
        model = AutoModelForCausalLM.from_config(architectures.make_config(settings.architecture, **settings.overrides))
    rows = [p.shape[0] if p.dim() else 1 for p in model.parameters()]
    classes: dict[tuple, list[int]] = {}
    for rank in range(world_size):
        key = (rank == 0, tuple(_chunk_rows(n, world_size, rank) for n in rows))
        classes.setdefault(key, []).append(rank)
    return sorted(classes.values())


def _chunk_rows(rows: int, world_size: int, rank: int) -> int:
    per = -(-rows // world_size)  # torch.chunk's chunk size
    return max(0, min(per, rows - rank * per))


def traced_ranks(settings: Settings, world_size: int, out: Path, real: dict[int, RunRecord],
                 every_rank: bool = True, timeout_s: int = 3600,
                 lower_bound: bool = True) -> dict[int, RunRecord]:
    """{rank: traced record} for every rank of `world_size` (traced one by one), or, with
    `every_rank=False`, one traced rank per `rank_classes` class standing for the class (each such
    record's `traced_as` names the rank that was traced). Data-dependent sizes come from `real`
    (the audited run's records by rank): the paired rank's (auditor.analysis.ranks.projection).
    `lower_bound=False` skips the second trace that measures the estimated bytes."""
    from auditor.analysis.ranks.projection import paired_rank
    settings = Settings(**{**asdict(settings), "variant": VARIANT})
    found: dict[int, RunRecord] = {}
    for ranks in ([[r] for r in range(world_size)] if every_rank else rank_classes(settings, world_size)):
        observed = real[paired_rank(ranks[0], real)].annotations.get("data_dependent_sizes")
        record = traced_rank(settings, world_size, ranks[0], out, observed, timeout_s, lower_bound)
        record.annotations["traced_as"] = ranks[0]  # the one record stands for each rank of its class
        for rank in ranks:
            found[rank] = record
    return found


def project_world_sizes(small: Settings, target: Settings, world_sizes: list[int], out: Path, ranks: int = 2,
                        every_rank: bool = False, progress=lambda text: None) -> list[ProjectedWorld]:
    """`auditor project-ranks`: `small` audited for real on `ranks` ranks (OUT/audited-R-ranks/), the
    target traced at each world size (OUT/traced-N-ranks/), each rank projected
    (auditor.analysis.ranks.projection.project_ranks; `to_json` leaves out the per-stage rows, which
    stay in the traced records)."""
    from auditor.analysis.ranks.projection import project_ranks
    progress(f"auditing {small.architecture} on {ranks} real ranks (torchrun, gloo)")
    real = real_ranks(small, ranks, out / f"audited-{ranks}-ranks")
    traced = {}
    for world in sorted(set(world_sizes)):
        progress(f"tracing {target.architecture} at {world} ranks on fake tensors")
        traced[world] = traced_ranks(target, world, out / f"traced-{world}-ranks", real, every_rank=every_rank)
    return project_ranks(real, traced)


def real_ranks(settings: Settings, world_size: int, out: Path, timeout_s: int = 1800) -> dict[int, RunRecord]:
    """A real torchrun of `world_size` ranks (gloo on CPU, one thread each): {rank: its record}.
    torchrun and its ranks run in a process group of their own, ended on Ctrl-C or a signal
    (auditor.capture.process_group); torchrun gets SIGTERM if we die, and ends its ranks."""
    import signal
    import subprocess
    import tempfile

    from auditor.analysis.ranks.merged import load_ranks
    from auditor.capture.process_group import child_group, kill_group
    settings = Settings(**{**asdict(settings), "variant": VARIANT})
    command = real_command(settings, world_size, out)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    with tempfile.TemporaryFile() as stderr, \
            child_group(command, death_signal=signal.SIGTERM, env={**env, "OMP_NUM_THREADS": "1"},
                        stdout=subprocess.DEVNULL, stderr=stderr) as process:  # a file: no pipe fills up
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(process)
            process.wait()
            raise
        stderr.seek(max(stderr.seek(0, os.SEEK_END) - 3000, 0))
        tail = stderr.read().decode("utf-8", "replace")
    if returncode:
        raise RuntimeError(f"torchrun of {world_size} ranks failed ({returncode}):\n{tail}")
    return load_ranks(out)


def real_command(settings: Settings, world_size: int, out: Path) -> list[str]:
    """The torchrun command line of a real run (the report prints it)."""
    from auditor.capture.fresh_process import python_command
    python = python_command("torch.distributed.run")
    return [*python, "--standalone", "--nproc-per-node", str(world_size), "-m", "auditor.jobs.rank_projection",
            "real", json.dumps(asdict(settings)), str(out)]


if __name__ == "__main__":
    {"traced": _traced_rank_main, "real": _real_rank_main}[sys.argv[1]](sys.argv[2:])
