"""A training step with the model sharded by FSDP2, on CPU with the gloo backend, staged for the auditor.

    torchrun --standalone --nproc-per-node 2 -m auditor run --live-tensors --census \
        --run-dir runs/fsdp-step examples/fsdp_train_step.py --arch tinystories-33m
    auditor report runs/fsdp-step
    auditor run --live-tensors --census --run-dir runs/one-step examples/fsdp_train_step.py   # alone

Each rank builds the model from the same seed, shards it with `fully_shard` (each decoder layer,
then the root), and takes `--steps` AdamW steps on its own batch (data parallel: FSDP averages
the gradients over the ranks with its reduce-scatter). Stages: build, shard, then per step
forward, backward (each layer's gradients reduce-scattered to its shard as backward goes), optimizer
(AdamW's state made on the first step, for this rank's shard only) and zero grad. Alone (not under
torchrun) the same step runs unsharded, in one process: the figures to set the ranks' beside.
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import auditor
from architectures import build_model
from architectures.options import add_size_arguments, size_overrides
from gradprobe.loss import causal_lm_loss
from gradprobe.variants.shards import decoder_layers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="tinystories-33m")
    add_size_arguments(parser)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2)
    options = parser.parse_args()
    sharded = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if sharded:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if sharded else 0
    with auditor.stage("build"):
        model = build_model(options.arch, seed=0, **size_overrides(options))
    with auditor.stage("shard"):
        if sharded:
            for layer in decoder_layers(model):
                fully_shard(layer)
            fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, model.config.vocab_size, (1, options.seq_len),
                           generator=torch.Generator().manual_seed(1 + rank))  # this rank's batch
    for step in range(options.steps):
        with auditor.stage(f"step {step}"):
            with auditor.stage("forward"):
                loss = causal_lm_loss(model(tokens), tokens)
            with auditor.stage("backward"):
                loss.backward()
            with auditor.stage("optimizer"):
                optimizer.step()
            with auditor.stage("zero grad"):
                optimizer.zero_grad(set_to_none=True)
    if sharded:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
