"""The workload of bench/torch_launch.py: an all-reduce to a result, and a rank that raises.

As a script (``python bench/torch_workload.py [BACKEND]``) it is the same
all-reduce for plain processes and ``torchrun``: the rank environment comes
from outside. With ``nccl`` each rank reduces on the GPU of its local rank.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def allreduce(backend: str = "gloo") -> float:
    """All-reduce each rank's number (on its GPU with ``nccl``); every rank returns the sum."""
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend)
    t = torch.tensor([float(dist.get_rank())], device=device)
    dist.all_reduce(t)
    return float(t.item())


def raise_at_rank1(stamp: str) -> None:
    """Rank 1 raises (after writing the time to ``stamp``) while the others wait in a barrier."""
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(0.5)
        now = time.time()
        with open(stamp, "w") as f:
            f.write(repr(now))
        raise ValueError(f"raised at {now!r}")
    dist.barrier()


if __name__ == "__main__":
    import sys

    value = allreduce(*sys.argv[1:2])
    dist.destroy_process_group()
    if os.environ.get("RANK") == "0":
        print(f"sum {value}", flush=True)
