"""Distributed PyTorch on tlaunch: function launch, torchrun mode, deepspeed mode and basic mode.

Every mode is a tlaunch program (one agent node per host that starts the
host's workers), so it runs wherever tlaunch runs: this machine, SSH hosts,
a SLURM allocation. Install with ``pip install 'tlaunch[torch]'``.

* :func:`launch` / :class:`Launcher`: run a function on N hosts x M workers
  and get every rank's result (the torchrunx model).
* :func:`torchrun`: torch's own elastic agent on every host, c10d rendezvous
  on the head, one command for all nodes (``tlaunch torchrun``).
* :func:`deepspeed`: DeepSpeed's per-node launcher on every host of a hostfile
  (``tlaunch deepspeed``).
* :func:`basic`: N trainers told their rank, world size and rank 0's address (in their
  environment and as ``--rank``/``--world_size`` arguments), and a shared file (the original TLaunch's).

Each takes the options of the backends that may place it typed
(``ssh=SSHOptions(...)``, ``slurm=SlurmOptions(...)``; see
:mod:`tlaunch.torch.placement`). basic, torchrun and deepspeed are also the
launch methods of jobs (``tlaunchrun``, the job server): one entry each in
:data:`tlaunch.runtime.methods.METHODS`.
"""

from __future__ import annotations

from tlaunch.torch.basic import basic
from tlaunch.torch.deepspeed import deepspeed
from tlaunch.torch.errors import (
    AgentFailedError,
    JobFailedError,
    TorchLaunchError,
    WorkerFailedError,
    WorkerRaisedError,
)
from tlaunch.torch.function import Launcher, LaunchResult, launch
from tlaunch.torch.torchrun import JobResult, torchrun

__all__ = [
    "AgentFailedError",
    "JobFailedError",
    "JobResult",
    "LaunchResult",
    "Launcher",
    "TorchLaunchError",
    "WorkerFailedError",
    "WorkerRaisedError",
    "basic",
    "deepspeed",
    "launch",
    "torchrun",
]
