"""The torchrunx seed's two launches: train on 2 hosts x 2 workers, then test on this machine.

    python examples/torch/function_launch.py                  # makes 2 SSH test hosts (root)
    python examples/torch/function_launch.py --hosts=a,b      # your own hosts (~/.ssh/config)

``tlaunch.torch.launch`` runs the function in every worker with the process
group ready (gloo here: CPUs), returns every rank's result, and leaves
nothing running before the next launch.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from absl import app

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hosts_flag import example_hosts

import tlaunch.torch


def train(steps: int) -> dict[str, torch.Tensor]:
    """Data-parallel least squares: each rank has its own data, gradients are all-reduced."""
    torch.manual_seed(dist.get_rank())
    x = torch.randn(64, 4)
    y = x @ torch.tensor([1.0, -2.0, 3.0, 0.5])
    model = torch.nn.Linear(4, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    for _ in range(steps):
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x).squeeze(1), y).backward()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.data -= 0.1 * p.grad / dist.get_world_size()
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} on {os.uname().nodename}: done", flush=True)
    return model.state_dict()


def test(state: dict[str, torch.Tensor]) -> float:
    """Mean squared error of the trained model on fresh data."""
    model = torch.nn.Linear(4, 1, bias=False)
    model.load_state_dict(state)
    x = torch.randn(256, 4)
    y = x @ torch.tensor([1.0, -2.0, 3.0, 0.5])
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x).squeeze(1), y))


def main(_: list[str]) -> None:
    with example_hosts(2) as (hosts, ssh_config):
        trained = tlaunch.torch.launch(
            train, (200,), hostnames=hosts, workers_per_host=2, backend="gloo", ssh_config_file=ssh_config
        ).rank(0)
        error = tlaunch.torch.launch(test, (trained,), hostnames=["localhost"], workers_per_host=1).rank(0)
        print(f"weights {trained['weight'].numpy().round(3).tolist()}, test error {error:.5f}")


if __name__ == "__main__":
    app.run(main)
