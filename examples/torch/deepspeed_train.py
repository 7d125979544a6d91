"""A tiny DeepSpeed training step, runnable on CPUs (``DS_ACCELERATOR=cpu``) or GPUs.

    tlaunch deepspeed --hostfile hostfile --include "h1@h2:0" examples/torch/deepspeed_train.py \
        --deepspeed_config ds.json

Each rank builds a linear model with ``deepspeed.initialize``, takes a few
steps on its own batch, and prints its rank, world size and loss. Its
DeepSpeed config is the file of ``--deepspeed_config`` (DeepSpeed's own
argument; ``ds.json`` beside this script is one: on SSH hosts every rank
starts in the shipped copy of this folder, so the relative path holds on each
host), else the same settings, written here.
"""

from __future__ import annotations

import argparse

import deepspeed
import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--local_rank", type=int, default=-1)  # DeepSpeed's launcher passes it
    deepspeed.add_config_arguments(parser)  # --deepspeed_config FILE
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    model = torch.nn.Linear(8, 1)
    config = None
    if not args.deepspeed_config:
        config = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), config=config
    )
    torch.manual_seed(rank)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    for step in range(args.steps):
        loss = torch.nn.functional.mse_loss(engine(x.to(engine.device)), y.to(engine.device))
        engine.backward(loss)
        engine.step()
        print(
            f"step={step} rank={rank} world={world} local_rank={args.local_rank} loss={loss.item():.4f}",
            flush=True,
        )
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
