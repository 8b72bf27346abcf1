"""A DDP training script in the usual third-party shape: torch.multiprocessing.spawn starts one
worker per rank, each joins a gloo group, wraps its model in DistributedDataParallel and trains.
It knows nothing of the auditor; audit it unchanged:

    auditor run --live-tensors --census --run-dir runs/ddp-spawn \
        --stage ddp_spawn_train:train_step examples/ddp_spawn_train.py --ranks 2
    auditor report runs/ddp-spawn

Each rank's batch grows with its rank (rank r trains on (r + 1) x --batch rows), so the ranks'
activations differ while their weights, gradients and AdamW state are the same.
"""
import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def build_model(hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(hidden, 4 * hidden), torch.nn.GELU(),
                               torch.nn.Linear(4 * hidden, hidden))


def train_step(model, optimizer, batch) -> float:
    loss = model(batch).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def worker(rank: int, world_size: int, port: int, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = DistributedDataParallel(build_model(args.hidden))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + rank)
    for step in range(args.steps):
        loss = train_step(model, optimizer, torch.randn(args.batch * (rank + 1), args.hidden))
        if rank == 0:
            print(f"step {step}: loss {loss:.4f}")
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    arguments = parser.parse_args()
    mp.spawn(worker, args=(arguments.ranks, free_port(), arguments), nprocs=arguments.ranks)
