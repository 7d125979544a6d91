"""A tiny elastic training loop for torchrun mode: all-reduce a gradient each step, checkpoint, resume.

    tlaunch torchrun --hosts h1,h2,h3 --nnodes 2:3 --nproc-per-node 2 --max-restarts 3 \
        examples/torch/elastic_train.py --steps 30 --checkpoint /shared/ckpt.pt

Every rank prints its step, rank and world size; after a restart (a failure, or
a host leaving or joining) the job resumes from the last checkpoint with the
new world size, as torch's elastic agent intends.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-time", type=float, default=0.2)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--fail-rank", type=int, default=-1, help="this rank raises at step 3 (a demo)")
    args = parser.parse_args()
    # NCCL on GPUs (each rank on the GPU of its local rank), gloo on CPUs.
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    weight = torch.zeros(4, device=device)
    start = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location=device)
        weight, start = state["weight"], state["step"]
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    print(f"start step={start} rank={rank} world={world} restart={restart} backend={backend}", flush=True)
    for step in range(start, args.steps):
        if rank == args.fail_rank and step == 3:
            raise ValueError(f"rank {rank} fails at step {step} on purpose")
        grad = torch.full((4,), float(rank + 1), device=device)
        dist.all_reduce(grad)
        weight -= args.lr * grad / world
        if rank == 0 and args.checkpoint:
            torch.save({"weight": weight, "step": step + 1}, args.checkpoint + ".part")
            os.replace(args.checkpoint + ".part", args.checkpoint)
        print(f"step={step} rank={rank} world={world}", flush=True)
        time.sleep(args.step_time)
    dist.barrier()
    print(f"done rank={rank} world={world} weight={weight[0].item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
