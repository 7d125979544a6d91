"""deepspeed mode: DeepSpeed's own per-node launcher on every host of a hostfile, started by tlaunch.

::

    tlaunch deepspeed --hostfile hostfile --include "h1:0,1@h2" train.py --deepspeed_config ds.json

The hostfile is DeepSpeed's (``host slots=N`` per line, ``#`` comments); a
duplicate or malformed line is an error naming the line. ``--include`` /
``--exclude`` (``host:0,1@host2``), ``--num_nodes`` and ``--num_gpus`` select
slots as DeepSpeed's runner does. Instead of pdsh, each selected host's agent
node runs ``python -m deepspeed.launcher.launch`` with the world info, its
node rank and the head's master address and a port free there. The
environment DeepSpeed users expect is forwarded whole: tlaunch's default
patterns plus DeepSpeed's exports (``MLFLOW*``, ``MV2*``, ``UCX*``, ``NCCL*``,
``DS_*``...) and a ``.deepspeed_env`` file (``$DS_ENV_FILE``) from the
current folder or home, not only DeepSpeed's prefix whitelist.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tlaunch import context
from tlaunch.errors import LaunchError
from tlaunch.torch.agent import free_port
from tlaunch.torch.env import DEFAULT_ENV_VARS, copied_env
from tlaunch.torch.hostjob import launcher_env, run_host_launcher
from tlaunch.torch.job import start_job
from tlaunch.torch.logs import default_log_dir
from tlaunch.torch.torchrun import JobResult, finish, job_name, script_job

__all__ = ["DEEPSPEED_ENV_VARS", "deepspeed", "deepspeed_env_file", "parse_hostfile", "select_slots"]

DEEPSPEED_ENV_VARS: tuple[str, ...] = ("MLFLOW*", "MV2*", "UCX*", "NCCL*", "DS_*", "CCL*", "FI_*", "I_MPI*")
"""Forwarded in deepspeed mode on top of the default patterns (DeepSpeed's runner exports these)."""

_LINE = re.compile(r"^(\S+)\s+slots=(\d+)\s*$")


def parse_hostfile(text: str, source: str = "hostfile") -> collections.OrderedDict[str, int]:
    """DeepSpeed's hostfile as host -> slots, in file order.

    Raises:
        LaunchError: a malformed or duplicate line (named with its number), or no hosts at all.
    """
    hosts: collections.OrderedDict[str, int] = collections.OrderedDict()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        if not m:
            raise LaunchError(
                f"{source} line {number}: {raw.strip()!r} is not 'HOST slots=N' (e.g. 'worker-1 slots=4')"
            )
        host, slots = m.group(1), int(m.group(2))
        if host in hosts:
            raise LaunchError(f"{source} line {number}: host {host!r} is listed twice; list each host once")
        if slots < 1:
            raise LaunchError(f"{source} line {number}: {host} has slots={slots}; give at least 1")
        hosts[host] = slots
    if not hosts:
        raise LaunchError(f"{source} lists no hosts; write one 'HOST slots=N' line per host")
    return hosts


def _parse_filter(text: str, what: str, pool: dict[str, list[int]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for part in text.split("@"):
        host, _, slots = part.strip().partition(":")
        if not host:
            raise LaunchError(f"{what}={text!r} has an empty entry; use e.g. 'worker-0:0,1@worker-1'")
        if host not in pool:
            raise LaunchError(
                f"{what}={text!r}: host {host!r} is not in the hostfile; its hosts: {list(pool)}"
            )
        ids: list[int] = []
        for s in filter(None, slots.split(",")):
            if not s.strip().isdigit() or int(s) not in pool[host]:
                raise LaunchError(
                    f"{what}={text!r}: host {host!r} has no slot {s!r}; its slots: {pool[host]}"
                )
            ids.append(int(s))
        out[host] = ids
    return out


def select_slots(
    hosts: collections.OrderedDict[str, int],
    include: str = "",
    exclude: str = "",
    num_nodes: int = -1,
    num_gpus: int = -1,
) -> collections.OrderedDict[str, list[int]]:
    """The slots to use on each host, as DeepSpeed's runner selects them (host order kept).

    Raises:
        LaunchError: both filters, an unknown host or slot, or nothing left.
    """
    if include and exclude:
        raise LaunchError("include and exclude cannot both be given; use one of them")
    pool = {h: list(range(n)) for h, n in hosts.items()}
    if include:
        chosen = _parse_filter(include, "include", pool)
        picked = {h: (ids or pool[h]) for h, ids in chosen.items()}
    else:
        picked = {h: list(ids) for h, ids in pool.items()}
        for h, ids in (_parse_filter(exclude, "exclude", pool) if exclude else {}).items():
            picked[h] = [s for s in picked[h] if ids and s not in ids]
    out = collections.OrderedDict((h, sorted(set(picked[h]))) for h in hosts if picked.get(h))
    if num_nodes > 0:
        out = collections.OrderedDict(list(out.items())[:num_nodes])
    if num_gpus > 0:
        out = collections.OrderedDict((h, ids[:num_gpus]) for h, ids in out.items())
    if not out:
        raise LaunchError("no host and slot is left after include/exclude; loosen the filter")
    return out


def deepspeed_env_file(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of DeepSpeed's ``.deepspeed_env`` (``$DS_ENV_FILE``) in this folder, else home."""
    env = os.environ if environ is None else environ
    name = env.get("DS_ENV_FILE", ".deepspeed_env")
    out: dict[str, str] = {}
    for folder in (os.path.expanduser("~"), "."):  # the current folder's wins, as in DeepSpeed
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
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
    ctx = context.get_context()
    stop = context.stop_event()
    work = tempfile.mkdtemp(prefix=f"tlaunch-deepspeed-{ctx.run_id}-")
    try:
        if index == 0:
            collector.publish("master", [ctx.address, spec.master_port or free_port()])
        addr, port = collector.lookup("master")
        env = launcher_env(spec.env_file, ctx.address, work, spec.hosts[index])
        world = base64.urlsafe_b64encode(json.dumps(spec.world).encode()).decode()
        argv = [
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
            "tlaunch.torch.record",
            ctx.run_id,
            *spec.command,
        ]
        run_host_launcher(collector, index, spec.hosts[index], argv, env, work, stop)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def deepspeed(
    command: Sequence[str],
    hostfile: str | None = None,
    hostnames: Sequence[str] | None = None,
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
    **launch_options: Any,
) -> JobResult:
    """Run ``command`` (a script and its arguments) with DeepSpeed's per-node launcher on the chosen hosts.

    Args:
        command: the training script and its arguments (``-m module ...`` also works).
        hostfile: a DeepSpeed hostfile (default: ``hostnames`` with ``slots_per_host`` each,
            or ``localhost``).
        hostnames: the hosts when there is no hostfile.
        include, exclude, num_nodes, num_gpus: DeepSpeed's slot selection.
        slots_per_host: slots of each host of ``hostnames``.
        master_port: rank 0's port (default: one free on the first host).
        ssh_config_file, working_dir, default_env_vars, extra_env_vars, env, env_file,
            log_dir: as for :func:`tlaunch.torch.torchrun`.
        launcher_args: more arguments for ``deepspeed.launcher.launch`` (``--bind_cores_to_rank``...).
        **launch_options: for :func:`tlaunch.launch`.

    Raises:
        JobFailedError: a rank failed; names it, with its traceback.
        LaunchError: a bad hostfile or filter, before anything starts.
    """
    cmd = list(command)
    if not cmd:
        raise LaunchError(
            "deepspeed needs a script to run, e.g. ['train.py', '--deepspeed_config', 'ds.json']"
        )
    if hostfile is not None:
        if not os.path.isfile(hostfile):
            raise LaunchError(f"hostfile {hostfile!r} does not exist; give the path of a DeepSpeed hostfile")
        with open(hostfile, encoding="utf-8") as f:
            pool = parse_hostfile(f.read(), hostfile)
    else:
        names = list(hostnames or ["localhost"])
        pool = collections.OrderedDict((h, slots_per_host) for h in names)
    world = select_slots(pool, include, exclude, num_nodes, num_gpus)
    hosts = list(world)
    extra = {**deepspeed_env_file(), **(env or {})}
    env_vars = copied_env([*default_env_vars, *extra_env_vars], extra)
    cmd, options = script_job(cmd, hosts, working_dir, ssh_config_file, launch_options, env_vars)
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
        launch_options=options,
    )
    try:
        outcome = job.outcome()
    finally:
        job.close()
    return finish(outcome, hosts, job.run_id, job.logs.dir, "deepspeed")
