"""Are a sharded run's gradient records the single process's, bit for bit, under each reduction?

    torchrun --standalone --nproc-per-node 3 benchmarks/sharded_gradient_identity.py --reduction "float32 sum"

Each rank prunes a small model twice: with the baseline alone (unsharded, in this process) and
with the sharded variant under FSDP2 (`gradprobe.variants.shards.REDUCTIONS`); it then counts the
candidates of its shard whose G0 or G1 differs from the baseline's at the same weight, and whether
the final masks are the same. s = 0.3 and tau = 0, so the gradients decide a quarter of the
candidates; vocab 250 splits unevenly over the ranks' rows.
"""
import argparse

import torch
import torch.distributed as dist

from architectures import build_model
from architectures.calibration import synthetic_batches
from gradprobe import GradProbe, mask_digest
from gradprobe.variants.sharded import ShardedGradProbe
from gradprobe.variants.shards import REDUCTIONS

SHAPES = {"tinystories-33m": dict(layers=2, hidden=64, vocab=250, heads=4),
          "mistral-7b": dict(layers=2, hidden=64, vocab=250, heads=4, kv_heads=2, intermediate=128)}
SETTINGS = dict(sparsity=0.3, gradient_threshold=0.0)


def differing(baseline: GradProbe, sharded: ShardedGradProbe, rank: int, world: int) -> dict:
    """Candidates of this rank's shard, and how many of their G0 and G1 differ from the baseline's."""
    counts = {"candidates": 0, "G0": 0, "G1": 0}
    for name in sharded.prunable:
        mine = torch.arange(sharded.sharded[name].shape[0]).chunk(world)  # FSDP2's rows: torch.chunk
        rows = mine[rank] if rank < len(mine) else mine[0][:0]
        chosen = sharded.candidates[name].unpack()
        counts["candidates"] += int(chosen.sum())
        for key, whole, shard in (("G0", baseline.gradients_original, sharded.gradients_original),
                                  ("G1", baseline.gradients_reduced, sharded.gradients_reduced)):
            counts[key] += int((whole[name][rows][chosen] != shard[name]).sum())
    return counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", choices=SHAPES, default="tinystories-33m")
    parser.add_argument("--reduction", choices=REDUCTIONS, default="own rows")
    args = parser.parse_args()
    torch.set_num_threads(1)
    shape = SHAPES[args.arch]
    batches = synthetic_batches(shape["vocab"], 16, 2, 2, seed=0)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    baseline = GradProbe(build_model(args.arch, seed=0, **shape))
    expected = baseline.prune(batches, **SETTINGS)
    sharded = ShardedGradProbe(build_model(args.arch, seed=0, **shape), reduction=args.reduction)
    result = sharded.prune(batches, **SETTINGS)
    counts = differing(baseline, sharded, rank, world)
    same = mask_digest(result.masks) == mask_digest(expected.masks)
    print(f"{args.arch} rank {rank} of {world}, {args.reduction}: {counts['candidates']} candidates, "
          f"G0 differs at {counts['G0']}, G1 at {counts['G1']}; masks "
          f"{'identical' if same else 'DIFFERENT'} ({result.pruned} pruned, baseline {expected.pruned})", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
