"""Ranks started by torch.multiprocessing.spawn, each auditing itself into one shared run folder.

    python examples/multi_rank_spawn.py runs/spawned --ranks 2
    auditor report runs/spawned

Each worker initialises its process group (gloo) before it creates its Audit, so the audit reads
its rank from torch.distributed and writes into RUN/rank-N/.
"""
import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import auditor


def worker(rank: int, world_size: int, out: str, hidden: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    with auditor.Audit(out=out, name="spawned", live_tensors=True):
        with auditor.stage("build"):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(hidden, 4 * hidden), torch.nn.ReLU(),
                                        torch.nn.Linear(4 * hidden, hidden))
        with auditor.stage("forward_backward"):
            torch.manual_seed(1 + rank)
            model(torch.randn(32 * (rank + 1), hidden)).square().mean().backward()
        with auditor.stage("gradient_all_reduce"):
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    options = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    mp.spawn(worker, args=(options.ranks, options.out, options.hidden), nprocs=options.ranks)


if __name__ == "__main__":
    main()
