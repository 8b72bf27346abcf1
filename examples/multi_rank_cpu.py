"""A tiny data-parallel training step on CPU with the gloo backend, staged for the auditor.

    torchrun --nproc-per-node 2 -m auditor run --live-tensors --run-dir runs/ranks \
        examples/multi_rank_cpu.py
    auditor report runs/ranks

Each rank builds the same small MLP, all-reduces a buffer in place and with a functional
collective (whose output storage c10d creates), runs forward and backward on its own
batch, averages the gradients with all_reduce and takes an SGD step. `--heavy-rank N --extra-mib M`
makes rank N hold M MiB more in its forward stage (an imbalance the merged report should name).
"""
import argparse

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import auditor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--heavy-rank", type=int, default=None)
    parser.add_argument("--extra-mib", type=int, default=0)
    options = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    with auditor.stage("build"):
        model = torch.nn.Sequential(torch.nn.Linear(options.hidden, 4 * options.hidden),
                                    torch.nn.ReLU(), torch.nn.Linear(4 * options.hidden, options.hidden))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with auditor.stage("all_reduce"):
        buffer = torch.full((options.hidden, options.hidden), float(rank + 1))
        dist.all_reduce(buffer)  # in place: no new storage
        summed = funcol.all_reduce(buffer, "sum", dist.group.WORLD)  # a new storage, made by c10d
        summed = funcol.wait_tensor(summed)
    with auditor.stage("forward"):
        torch.manual_seed(1 + rank)
        batch = torch.randn(options.batch, options.hidden)
        loss = model(batch).square().mean()
        extra = None
        if rank == options.heavy_rank:  # rank-specific state, held through the stage's end
            extra = torch.ones(options.extra_mib * 2**20 // 4)
    with auditor.stage("backward"):
        loss.backward()
    with auditor.stage("gradient_all_reduce"):
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
            parameter.grad /= dist.get_world_size()
    with auditor.stage("step"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    del extra
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
