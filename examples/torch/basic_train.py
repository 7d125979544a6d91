"""basic mode as the original TLaunch's MNIST example uses it: the trainer reads its rank from its arguments.

    tlaunch basic --num-trainer 2 --set-share-file examples/torch/basic_train.py --steps 3
    tlaunch basic --num-trainer 2 --hosts h1,h2 --share-file /shared/tiny \
        examples/torch/basic_train.py --steps 3
    tlaunch basic --num-trainer 2 --hosts h1,h2 examples/torch/basic_train.py --steps 3
    tlaunchrun --backend slurm --lpjob_name tiny --set_save_path --set_checkpoint_path \
        basic --num_trainer 2 --set_share_file basic_train.py

basic mode gives every trainer ``--rank R --world_size N`` (and, with a shared
file, ``--share_file F``) after its own arguments, on every backend (this
machine, SSH hosts, SLURM, Kubernetes pods), as well as ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` (the table is in
``docs/torch.md``). With a shared file the trainers meet through it
(``init_method="file://..."``, the original example's way); without one,
through rank 0's address (``dist.init_process_group("gloo")``: ``env://``).

A tiny model trained on random tensors (no dataset) with DistributedDataParallel
over gloo; each trainer prints its rank and, at the end, a checksum of its
weights and whether every rank has the same (they do when they trained as one group).
With ``--save_path`` (``set_save_path``) rank 0 saves the model there; with
``--checkpoint_path`` (``set_checkpoint_path``: ``.../last.tar.gz``) it goes on
from that checkpoint when there is one, and keeps its own there at the end.
"""

from __future__ import annotations

import argparse
import io
import os
import tarfile
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def init_distributed(args: argparse.Namespace) -> str:
    """Join the trainers' process group; how it met (``file://...`` or ``env://``)."""
    if args.world_size == 1:
        return "alone"
    if args.share_file:
        how = f"file://{args.share_file}"
        dist.init_process_group("gloo", init_method=how, world_size=args.world_size, rank=args.rank)
    else:
        how = "env://"
        dist.init_process_group("gloo")  # MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    return how


def load_checkpoint(path: str) -> dict[str, Any] | None:
    """The checkpoint in ``path`` (a ``.tar.gz`` holding ``checkpoint.pt``), or None if there is none."""
    if not path or not os.path.exists(path):
        return None
    with tarfile.open(path, "r:gz") as tar:
        member = tar.extractfile("checkpoint.pt")
        assert member is not None
        return dict(torch.load(io.BytesIO(member.read())))


def save_checkpoint(path: str, checkpoint: dict[str, Any]) -> None:
    """Write ``checkpoint`` to ``path`` as a ``.tar.gz`` of ``checkpoint.pt`` (aside, then renamed)."""
    data = io.BytesIO()
    torch.save(checkpoint, data)
    info = tarfile.TarInfo("checkpoint.pt")
    info.size = len(data.getvalue())
    with tarfile.open(path + ".part", "w:gz") as tar:
        tar.addfile(info, io.BytesIO(data.getvalue()))
    os.replace(path + ".part", path)


def main() -> None:
    parser = argparse.ArgumentParser(description="a tiny distributed training loop on random tensors")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--rank", type=int, default=0, help="this trainer's rank (given by tlaunch basic)")
    parser.add_argument("--world_size", type=int, default=1, help="how many trainers (given by tlaunch)")
    parser.add_argument("--share_file", default="", help="a file every trainer sees (--set-share-file)")
    parser.add_argument("--save_path", default="", help="a folder for the model (--set_save_path)")
    parser.add_argument("--checkpoint_path", default="", help="go on from there (--set_checkpoint_path)")
    args = parser.parse_args()

    how = init_distributed(args)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    told = f"arguments: rank {args.rank} of {args.world_size}"
    print(f"rank {rank} of {world} ({told}) met by {how}", flush=True)

    torch.manual_seed(0)  # the same first weights everywhere (DDP broadcasts rank 0's anyway)
    model: nn.Module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    first = 0
    checkpoint = load_checkpoint(args.checkpoint_path)
    if checkpoint is not None:  # rank 0's weights reach every rank as DDP starts
        model.load_state_dict(checkpoint["model"])
        first = int(checkpoint["steps"])
        print(f"rank {rank} goes on from step {first} ({args.checkpoint_path})", flush=True)
    plain = model
    if dist.is_initialized():
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own batches
    for step in range(first, first + args.steps):
        x = torch.randn(32, 8, generator=data)
        y = torch.randint(0, 2, (32,), generator=data)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients over every rank
        optimizer.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)

    checksum = round(sum(p.detach().double().sum().item() for p in model.parameters()), 6)
    sums = [checksum]
    if dist.is_initialized():
        sums = [0.0] * world
        dist.all_gather_object(sums, checksum)
    agree = "the same on every rank" if len(set(sums)) == 1 else f"NOT the same on every rank: {sums}"
    print(f"rank {rank} of {world} done: weights {checksum:.6f}, {agree}", flush=True)
    if args.save_path and rank == 0:
        os.makedirs(args.save_path, exist_ok=True)
        torch.save(plain.state_dict(), os.path.join(args.save_path, "tiny.pt"))
        print(f"rank 0 saved the model in {args.save_path}", flush=True)
    if args.checkpoint_path and rank == 0:
        save_checkpoint(args.checkpoint_path, {"model": plain.state_dict(), "steps": first + args.steps})
        print(f"rank 0 kept a checkpoint at step {first + args.steps} in {args.checkpoint_path}", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
