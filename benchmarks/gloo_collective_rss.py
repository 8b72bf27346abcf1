"""How much RSS a gloo collective takes beyond the tensors it is given, on CPU ranks.

    .venv/bin/torchrun --nproc-per-node 2 benchmarks/gloo_collective_rss.py 16 64

For each size (MiB of the whole, unsharded tensor), rank 0 prints the RSS high during three
`reduce_scatter_tensor` and three `all_gather_into_tensor` calls over what it held before
(sampled every 0.5 ms on a thread), and what stayed after. Gloo does its work on worker threads,
in buffers that are no torch tensor the program holds, so the per-rank projection (which counts
tensors) cannot see them; this measures them.
"""
from __future__ import annotations

import sys
import threading
import time

import psutil
import torch
import torch.distributed as dist

MIB = 2**20


def _high_during(work) -> tuple[int, int]:
    """(RSS high during `work()` over the RSS before it, RSS after it over before)."""
    process = psutil.Process()
    before = process.memory_info().rss
    high, done = [before], threading.Event()

    def sample():
        while not done.is_set():
            high[0] = max(high[0], process.memory_info().rss)
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    work()
    dist.barrier()
    done.set()
    sampler.join()
    return high[0] - before, process.memory_info().rss - before


def measure(mib: int) -> dict[str, tuple[int, int]]:
    world = dist.get_world_size()
    whole = torch.ones(mib * MIB // 4)
    shard, gathered = torch.zeros(whole.numel() // world), torch.zeros(whole.numel())
    dist.barrier()
    return {
        "reduce_scatter_tensor": _high_during(lambda: [dist.reduce_scatter_tensor(shard, whole) for _ in range(3)]),
        "all_gather_into_tensor": _high_during(lambda: [dist.all_gather_into_tensor(gathered, shard)
                                                        for _ in range(3)]),
    }


def main() -> None:
    dist.init_process_group("gloo")
    for mib in [int(a) for a in sys.argv[1:]] or [16, 64]:
        found = measure(mib)
        if dist.get_rank() == 0:
            for name, (high, kept) in found.items():
                print(f"{name:24s} whole {mib:4d} MiB on {dist.get_world_size()} ranks: "
                      f"RSS high +{high / MIB:6.1f} MiB, kept after +{kept / MIB:6.1f} MiB")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
