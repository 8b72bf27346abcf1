"""A model sharded by FSDP2 over the ranks of a torch.distributed job, and what GradProbe reads of it.

    model = shard_model(model)          # fully_shard per decoder layer, then the root; no-op alone
    local_shard(p)                      # this rank's rows of a parameter or gradient (DTensor or not)
    sum_over_ranks(counts)              # exact integer sums: candidate counts, histograms

FSDP2 (`torch.distributed.fsdp.fully_shard`) keeps each parameter as a DTensor sharded on dim 0
(`torch.chunk` rows: a rank may hold fewer rows, or none); a layer's full weights exist only
while FSDP all-gathers it for that layer's forward or backward (`reshard_after_forward=True`
frees them after forward too). After a layer's backward FSDP reduce-scatters its gradients, so a
rank's `.grad` is its own shard, and the parameter's post-accumulate-grad hooks run then.

Every rank runs the same batches: GradProbe's record is a maximum over batches of each batch's
gradient, which a sum over ranks of different batches cannot give. So the compute is replicated
and the memory is sharded, and every rank's gradient of a layer is the same (the same weights,
batch and deterministic CPU kernels). FSDP's reduce-scatter would sum the N equal gradients and
divide by N, which is not exact in fp32: on 3 ranks about 7% of G's values at candidates
differed from one process's (benchmarks/sharded_gradient_identity.py). So `REDUCTIONS`:

    "own rows"     (default) FSDP's reduce-scatter is replaced (`set_custom_reduce_scatter`) by
                   each rank keeping its own rows of its own gradient: the mean of N equal values
                   is any of them, exactly, with no communication and no buffer beyond FSDP's own.
    "float64 sum"  FSDP's own reduce-scatter in float64 (`MixedPrecisionPolicy.reduce_dtype`):
                   N equal fp32 values sum exactly in float64 (24 + log2 N significant bits <= 53),
                   FSDP's power-of-two pre-division is exact, the final division's exact quotient
                   x is what IEEE division returns, and the cast back is exact. Its reduce-scatter
                   buffers are twice fp32's, for one layer at a time, and it communicates.
    "float32 sum"  FSDP's default, inexact: kept to measure what it changes.

Alone (no process group of more than one rank) nothing is sharded: one rank holds every shard.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, cast, overload

import torch

if TYPE_CHECKING:  # imported where used: torch.distributed loads only for a sharded run
    from torch.distributed.tensor import DTensor
    from typing_extensions import TypeIs

REDUCTIONS = ("own rows", "float64 sum", "float32 sum")  # why: the module docstring


def world_size() -> int:
    import torch.distributed as dist
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def join_torchrun_group(device: torch.device) -> None:
    """Initialise the default process group from torchrun's environment (WORLD_SIZE > 1), if the
    program has not: gloo on CPU, NCCL for CUDA tensors. Alone, nothing to join."""
    import torch.distributed as dist
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    dist.init_process_group("gloo" if device.type == "cpu" else "cpu:gloo,cuda:nccl")


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: the classes Hugging Face names as never to be split."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} names no decoder layers (_no_split_modules): "
                         "the sharded variant shards a Hugging Face causal LM layer by layer")
    return layers


def shard_model(model: torch.nn.Module, reduction: str = "own rows") -> torch.nn.Module:
    """fully_shard each decoder layer, then the root (embeddings, final norm, head: a tied head
    shares the root's group), gradients reduced as `reduction` says. Alone, the model as it is."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if world_size() == 1:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(reduce_dtype=torch.float64 if reduction == "float64 sum" else None)
    units = [fully_shard(unit, mp_policy=policy, reshard_after_forward=True)  # each unit itself, now FSDP's
             for unit in [*decoder_layers(model), model]]
    if reduction == "own rows":
        for unit in units:  # OwnRows has FSDP's interface; its ABC is private (fsdp._fully_shard._fsdp_api)
            unit.set_custom_reduce_scatter(OwnRows())  # type: ignore[arg-type]
    return model


class OwnRows:
    """A reduce-scatter of equal gradients: each rank keeps its own rows (FSDP2's `ReduceScatter`
    interface: `allocate` its buffers, then be called on them). FSDP lays the input out as one
    chunk per rank, in rank order."""

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op,
                 async_op: bool = False) -> None:
        output_tensor.copy_(input_tensor.view(group.size(), -1)[group.rank()])


def is_sharded(tensor: torch.Tensor) -> TypeIs[DTensor]:
    from torch.distributed.tensor import DTensor
    return isinstance(tensor, DTensor)


@overload
def local_shard(tensor: torch.Tensor) -> torch.Tensor: ...
@overload
def local_shard(tensor: None) -> None: ...
def local_shard(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's rows as a plain tensor sharing the parameter's storage (writes reach the shard
    FSDP all-gathers next); a tensor that is not sharded is its own shard."""
    if tensor is None or not is_sharded(tensor):
        return tensor
    return cast("DTensor", tensor.detach()).to_local()  # a DTensor detached is one (typed as Tensor)


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """An integer tensor summed over the ranks, in place (exact: integers); alone, itself."""
    if world_size() > 1:
        import torch.distributed as dist
        dist.all_reduce(tensor)
    return tensor


def gathered(local: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The whole tensor from every rank's shard of it, sharded as the parameter `like` is."""
    if not is_sharded(like):
        return local
    from torch.distributed.tensor import DTensor
    as_bytes = local.view(torch.uint8) if local.dtype == torch.bool else local  # gloo sends no bool
    whole = DTensor.from_local(as_bytes, like.device_mesh, like.placements, shape=like.shape,
                               stride=like.stride()).full_tensor()
    return whole.view(torch.bool) if local.dtype == torch.bool else whole
