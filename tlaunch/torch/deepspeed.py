"""deepspeed mode: DeepSpeed's own per-node launcher on every host of a hostfile, started by tlaunch.

::

    tlaunch deepspeed --hostfile hostfile --include "h1:0,1@h2" train.py --deepspeed_config ds.json

The hostfile is DeepSpeed's (:mod:`tlaunch.torch.hostfile`: ``host slots=N``
per line, ``#`` comments); a duplicate or malformed line is an error naming
the line. ``--include`` / ``--exclude`` (``host:0,1@host2``), ``--num_nodes``
and ``--num_gpus`` select slots as DeepSpeed's runner does. Instead of pdsh, each selected host's agent
node runs ``python -m deepspeed.launcher.launch`` with the world info, its
node rank and the head's master address and a port free there. The
environment DeepSpeed users expect is forwarded whole: tlaunch's default
patterns plus DeepSpeed's exports (``MLFLOW*``, ``MV2*``, ``UCX*``, ``NCCL*``,
``DS_*``...) and a ``.deepspeed_env`` file (``$DS_ENV_FILE``) from the
current folder or home, not only DeepSpeed's prefix whitelist.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shlex
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tlaunch.backends.slurm.options import SlurmOptions
from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.context import NodeContext
from tlaunch.errors import LaunchError
from tlaunch.torch.agent import free_port
from tlaunch.torch.env import DEFAULT_ENV_VARS, copied_env
from tlaunch.torch.hostfile import deepspeed_world
from tlaunch.torch.hostjob import launcher_agent, rank_entry
from tlaunch.torch.job import start_job
from tlaunch.torch.logs import default_log_dir
from tlaunch.torch.placement import HostOptions
from tlaunch.torch.torchrun import JobResult, finish, job_name, place_script

__all__ = ["DEEPSPEED_ENV_VARS", "deepspeed", "deepspeed_env_file"]

log = logging.getLogger("tlaunch.torch")

DEEPSPEED_ENV_VARS: tuple[str, ...] = ("MLFLOW*", "MV2*", "UCX*", "NCCL*", "DS_*", "CCL*", "FI_*", "I_MPI*")
"""Forwarded in deepspeed mode on top of the default patterns (DeepSpeed's runner exports these)."""


def deepspeed_env_file(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of DeepSpeed's ``.deepspeed_env`` (``$DS_ENV_FILE``) in this folder, else home.

    The file's variables reach every rank, so it is read only when it is the
    user's own and nobody else may write it (a ``.deepspeed_env`` in a shared
    folder could otherwise set ``LD_PRELOAD`` for the job); one that sets a
    loader or Python variable (``LD_*``, ``PYTHON*``) is announced (a warning
    of logger ``tlaunch.torch``) before anything starts.

    Raises:
        LaunchError: a file of another user, one others may write, or a line that is not NAME=VALUE.
    """
    env = os.environ if environ is None else environ
    name = env.get("DS_ENV_FILE", ".deepspeed_env")
    out: dict[str, str] = {}
    for folder in (os.path.expanduser("~"), "."):  # the current folder's wins, as in DeepSpeed
        path = os.path.abspath(os.path.join(folder, name))
        if not os.path.isfile(path):
            continue
        values = _read_env_file(path)
        risky = sorted(k for k in values if k.startswith(("LD_", "PYTHON")))
        if risky:
            log.warning("tlaunch deepspeed: %s sets %s for every rank of the job", path, ", ".join(risky))
        out.update(values)
    return out


def _read_env_file(path: str) -> dict[str, str]:
    """``NAME=VALUE`` lines of a ``.deepspeed_env`` that is the user's own and nobody else's to write."""
    fd = os.open(path, os.O_RDONLY)
    with os.fdopen(fd, encoding="utf-8") as f:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise LaunchError(
                f"{path} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}): its variables would "
                "reach every rank, so tlaunch reads only your own; remove it, or make it yours"
            )
        if st.st_mode & 0o022:
            raise LaunchError(
                f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}): its variables would "
                f"reach every rank; chmod go-w {shlex.quote(path)} (or remove it)"
            )
        out: dict[str, str] = {}
        for number, line in enumerate(f, 1):
            if line.strip() and not line.lstrip().startswith("#"):
                if "=" not in line:
                    raise LaunchError(f"{path} line {number}: {line.strip()!r} is not NAME=VALUE")
                key, _, value = line.rstrip("\n").partition("=")
                out[key.strip()] = value
        return out


@dataclass(frozen=True)
class DeepSpeedSpec:
    """What each host's deepspeed agent gets."""

    world: dict[str, list[int]]
    hosts: list[str]
    command: list[str]
    master_port: int | None = None
    env_file: str | None = None
    launcher_args: tuple[str, ...] = ()


def deepspeed_agent(collector: Any, index: int, spec: DeepSpeedSpec) -> None:
    """Run DeepSpeed's per-node launcher on host ``index`` (the body of its agent node)."""

    def per_node(ctx: NodeContext, env: dict[str, str], work: str) -> list[str]:
        if index == 0:
            collector.publish("master", [ctx.address, spec.master_port or free_port()])
        addr, port = collector.lookup("master")
        world = base64.urlsafe_b64encode(json.dumps(spec.world).encode()).decode()
        return [
            sys.executable,
            "-u",
            "-m",
            "deepspeed.launcher.launch",
            f"--world_info={world}",
            f"--node_rank={index}",
            f"--master_addr={addr}",
            f"--master_port={port}",
            *spec.launcher_args,
            "--module",
            *rank_entry(ctx.run_id, spec.command),
        ]

    launcher_agent(collector, index, "deepspeed", spec.hosts, spec.env_file, per_node)


def deepspeed(
    command: Sequence[str],
    hostfile: str | None = None,
    hostnames: Sequence[str] | str | None = None,
    include: str = "",
    exclude: str = "",
    num_nodes: int = -1,
    num_gpus: int = -1,
    *,
    slots_per_host: int = 1,
    master_port: int | None = None,
    ssh_config_file: str | None = None,
    working_dir: str | Literal[False] | None = None,
    default_env_vars: Sequence[str] = (*DEFAULT_ENV_VARS, *DEEPSPEED_ENV_VARS),
    extra_env_vars: Sequence[str] = (),
    env: dict[str, str] | None = None,
    env_file: str | None = None,
    log_dir: str | None = None,
    launcher_args: Sequence[str] = (),
    ssh: SSHOptions | None = None,
    slurm: SlurmOptions | None = None,
    run_id: str | None = None,
    debug: str | None = None,
) -> JobResult:
    """Run ``command`` (a script and its arguments) with DeepSpeed's per-node launcher on the chosen hosts.

    Args:
        command: the training script and its arguments (``-m module ...`` also works).
        hostfile: a DeepSpeed hostfile (default: ``hostnames``).
        hostnames: the hosts when there is no hostfile (see :func:`tlaunch.torch.launch`;
            default ``"auto"``: the SLURM allocation inside one, else this machine).
        include, exclude, num_nodes, num_gpus: DeepSpeed's slot selection; without a
            hostfile, ``num_gpus`` is each host's slots.
        slots_per_host: slots of each host of ``hostnames`` (when ``num_gpus`` is not given).
        master_port: rank 0's port (default: one free on the first host).
        ssh_config_file, working_dir, default_env_vars, extra_env_vars, env, env_file,
            log_dir: as for :func:`tlaunch.torch.torchrun`.
        launcher_args: more arguments for ``deepspeed.launcher.launch`` (``--bind_cores_to_rank``...).
        ssh, slurm, debug: as for :func:`tlaunch.torch.torchrun`.

    Raises:
        JobFailedError: a rank failed; names it, with its traceback.
        LaunchError: a bad hostfile or filter, before anything starts.
    """
    cmd = list(command)
    if not cmd:
        raise LaunchError(
            "deepspeed needs a script to run, e.g. ['train.py', '--deepspeed_config', 'ds.json']"
        )
    world = deepspeed_world(hostfile, hostnames, include, exclude, num_nodes, num_gpus, slots_per_host)
    hosts = list(world)
    extra = {**deepspeed_env_file(), **(env or {})}
    env_vars = copied_env([*default_env_vars, *extra_env_vars], extra)
    cmd, options = place_script(cmd, hosts, HostOptions.given(ssh, slurm, ssh_config_file, working_dir))
    spec = DeepSpeedSpec(dict(world), hosts, cmd, master_port, env_file, tuple(launcher_args))
    offsets = {h: sum(len(world[x]) for x in hosts[:i]) for i, h in enumerate(hosts)}
    job = start_job(
        job_name("deepspeed", cmd),
        hosts,
        deepspeed_agent,
        lambda i: (spec,),
        log_dir=log_dir or default_log_dir(),
        echo_ranks=(0,),
        rank_of=lambda host, lr: offsets[host] + lr,
        host_options=options,
        env=env_vars,
        run_id=run_id,
        debug=debug,
    )
    return job.end_with(lambda outcome: finish(outcome, hosts, job.run_id, job.logs.dir, "deepspeed"))
