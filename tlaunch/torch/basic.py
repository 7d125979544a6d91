"""basic mode: N trainers, each told its rank, world size and maybe a shared file; the script does the rest.

::

    tlaunch basic --num-trainer 4 --hosts h1,h2 --set-share-file train.py --epochs 3

Each trainer is a node of a plain tlaunch program (placed round-robin over the
hosts), so it has tlaunch's supervision, logs, restarts and failure report.
It runs the script in its own process with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``TLAUNCH_NUM_TRAINER`` and, with a shared file,
``TLAUNCH_SHARE_FILE`` set (the seed's ``set_share_file``: a path the trainers
use to exchange what they need; it must be on a filesystem every host sees).
"""

from __future__ import annotations

import os
import runpy
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from tlaunch.errors import LaunchError
from tlaunch.launcher import launch
from tlaunch.nodes.python import PyNode
from tlaunch.program import Program
from tlaunch.torch.job import all_local
from tlaunch.torch.placement import resolve_hostnames
from tlaunch.torch.torchrun import JobResult, job_name, script_job

__all__ = ["basic", "run_trainer"]


def run_trainer(command: list[str], env: dict[str, str]) -> None:
    """Run ``command`` (``script args`` or ``-m module args``) in this process with ``env`` added."""
    os.environ.update(env)
    if command[0] == "-m":
        sys.argv = [command[1], *command[2:]]
        runpy.run_module(command[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(command)
        sys.path.insert(0, os.path.dirname(os.path.abspath(command[0])))
        runpy.run_path(command[0], run_name="__main__")


def basic(
    command: Sequence[str],
    num_trainer: int,
    hostnames: Sequence[str] | str = "auto",
    *,
    set_share_file: bool = False,
    share_file: str | None = None,
    working_dir: str | None = None,
    ssh_config_file: str | None = None,
    **launch_options: Any,
) -> JobResult:
    """Run ``num_trainer`` trainers of ``command`` over the hosts (round-robin) and wait for them.

    Args:
        command: the script and its arguments (or ``["-m", module, ...]``).
        num_trainer: how many trainers.
        hostnames: the hosts (see :func:`tlaunch.torch.launch`).
        set_share_file: give the trainers a shared file path (``TLAUNCH_SHARE_FILE``);
            by default ``./tlaunch-share/<id>``, which must be on a filesystem all hosts see.
        share_file: that path, chosen by you.
        working_dir, ssh_config_file: as for SSH launches.
        **launch_options: for :func:`tlaunch.launch` (``max_restarts``...).

    Raises:
        RunFailedError: a trainer failed (its traceback, host and rank).
        LaunchError: bad arguments.
    """
    cmd = list(command)
    if not cmd:
        raise LaunchError("basic mode needs a script to run, e.g. ['train.py', '--epochs', '3']")
    if isinstance(num_trainer, bool) or not isinstance(num_trainer, int) or num_trainer < 1:
        raise LaunchError(f"num_trainer={num_trainer!r} must be an int >= 1")
    hosts = resolve_hostnames(hostnames)
    cmd, options = script_job(cmd, hosts, working_dir, ssh_config_file, launch_options)
    if set_share_file and share_file is None:
        share_file = os.path.abspath(os.path.join("tlaunch-share", uuid.uuid4().hex[:12]))
    if share_file is not None:
        os.makedirs(os.path.dirname(os.path.abspath(share_file)), exist_ok=True)
    local = all_local(hosts)
    program = Program(job_name("basic", cmd))
    per_host: dict[str, int] = {}
    with program.group("trainer"):
        for rank in range(num_trainer):
            host = hosts[rank % len(hosts)]
            env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(num_trainer),
                "LOCAL_RANK": str(per_host.get(host, 0)),
                "TLAUNCH_NUM_TRAINER": str(num_trainer),
            }
            if share_file is not None:
                env["TLAUNCH_SHARE_FILE"] = share_file
            per_host[host] = per_host.get(host, 0) + 1
            node = PyNode(run_trainer, cmd, env)
            if not local:
                node.to_host(host)
            program.add_node(node)
    run = launch(program, **options)
    return JobResult(run.run_id, run.log_dir, {h: 0 for h in per_host}, [])
