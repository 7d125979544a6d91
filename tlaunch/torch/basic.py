"""basic mode: N trainers, each told its rank, world size and maybe a shared file; the script does the rest.

::

    tlaunch basic --num-trainer 4 --hosts h1,h2 --set-share-file train.py --epochs 3

Each trainer is a node of a plain tlaunch program (placed round-robin over the
hosts), so it has tlaunch's supervision, logs, restarts and failure report.
It runs the script in its own process with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``TLAUNCH_NUM_TRAINER`` and, with a shared file,
``TLAUNCH_SHARE_FILE`` set (the seed's ``set_share_file``: a path the trainers
use to exchange what they need; it must be on a filesystem every host sees).
An ``env_file`` is sourced (bash) by each trainer on its host; with a
``log_dir``, each trainer's lines also go to
``<log_dir>/<run id>/<host>[<local_rank>].log`` (0600, in a 0700 folder).
Inside a SLURM allocation whose nodes are the hosts, the trainers are steps of
it (``srun``), one host or many.
"""

from __future__ import annotations

import dataclasses
import os
import runpy
import shlex
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from typing import Literal

from tlaunch.backends.slurm.options import SlurmOptions
from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.display import Printer
from tlaunch.errors import LaunchError
from tlaunch.launcher import launch
from tlaunch.nodes.python import PyNode
from tlaunch.options import LaunchOptions
from tlaunch.program import Program
from tlaunch.runtime.pyenv import MARKER
from tlaunch.runtime.records import private_dirs
from tlaunch.torch.env import source_env_file
from tlaunch.torch.job import PendingSink
from tlaunch.torch.logs import JobLogs
from tlaunch.torch.placement import HostOptions, Placed, Placement, resolve_hostnames
from tlaunch.torch.torchrun import JobResult, job_name, place_script

__all__ = ["basic", "run_command", "run_trainer"]

_TRAINER = "trainer"


def run_trainer(command: list[str], env: dict[str, str], env_file: str | None = None) -> None:
    """Run ``command`` (``script args`` or ``-m module args``) in this process with ``env`` added.

    ``env_file`` is sourced (bash) on this host first; ``env`` (the trainer's rank) wins over it.
    """
    if env_file:
        os.environ.update(source_env_file(env_file))
    os.environ.update(env)
    if command[0] == "-m":
        sys.argv = [command[1], *command[2:]]
        runpy.run_module(command[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(command)
        sys.path.insert(0, os.path.dirname(os.path.abspath(command[0])))
        runpy.run_path(command[0], run_name="__main__")


def run_command(command: list[str], env: dict[str, str], env_file: str | None = None) -> None:
    """Run ``command`` (any program: the ``command`` method) as a trainer, with ``env`` added.

    Its output is the trainer's; a non-zero exit is the trainer's exit code. In a
    runtime environment (:mod:`tlaunch.runtime.pyenv`) its ``bin`` comes first on
    ``PATH``, so the command's ``python`` is the environment's.

    A command that fails ends the trainer's process with its exit code (a signal's ``128 + N``).
    """
    if env_file:
        os.environ.update(source_env_file(env_file))
    os.environ.update(env)
    if os.path.isfile(os.path.join(sys.prefix, MARKER)):
        os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    code = subprocess.call(command)
    if code != 0:
        code = 128 - code if code < 0 else code
        print(f"tlaunch: {shlex.join(command)} exited with code {code}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(code)  # the command's exit code is the trainer's (a raise would make it 1)


def basic(
    command: Sequence[str],
    num_trainer: int,
    hostnames: Sequence[str] | str = "auto",
    *,
    set_share_file: bool = False,
    share_file: str | None = None,
    working_dir: str | Literal[False] | None = None,
    ssh_config_file: str | None = None,
    env: Mapping[str, str] | None = None,
    env_file: str | None = None,
    log_dir: str | None = None,
    max_restarts: int = 0,
    ssh: SSHOptions | None = None,
    slurm: SlurmOptions | None = None,
    run_id: str | None = None,
    as_command: bool = False,
) -> JobResult:
    """Run ``num_trainer`` trainers of ``command`` over the hosts (round-robin) and wait for them.

    Args:
        command: the script and its arguments (or ``["-m", module, ...]``).
        num_trainer: how many trainers.
        hostnames: the hosts (see :func:`tlaunch.torch.launch`).
        set_share_file: give the trainers a shared file path (``TLAUNCH_SHARE_FILE``);
            by default ``./tlaunch-share/<id>``, which must be on a filesystem all hosts see.
        share_file: that path, chosen by you.
        working_dir, ssh_config_file: as for SSH launches (``working_dir=False``: a
            shared filesystem, nothing shipped, the script's path on every host).
        env: more variables for every trainer (never on a command line).
        env_file: a file each trainer sources (bash) on its host before it starts.
        log_dir: also write each trainer's lines to ``<log_dir>/<run id>/<host>[<local_rank>].log``.
        max_restarts: restarts of a trainer that fails.
        ssh, slurm, run_id: as for :func:`tlaunch.torch.torchrun`.
        as_command: ``command`` is any program's argv (run as it is, in each trainer's
            working directory), not a Python script: the ``command`` method.

    Returns:
        A :class:`JobResult` (every host's exit code 0).

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
    options = HostOptions.given(ssh, slurm, ssh_config_file, working_dir)
    if not as_command:  # a script: remote hosts get its folder (a command runs as it is)
        cmd, options = place_script(cmd, hosts, options)
    placed = options.placed(hosts)
    common = LaunchOptions(max_restarts=max_restarts, env=dict(env) if env else None)
    if set_share_file and share_file is None:
        share_file = os.path.abspath(os.path.join("tlaunch-share", uuid.uuid4().hex[:12]))
    if share_file is not None:
        folder = os.path.dirname(os.path.abspath(share_file))
        private_dirs(folder, top=folder)  # made 0700 if new; an existing (shared) folder keeps its mode
    remote = options.placement(hosts) is not Placement.LOCAL
    program = Program(job_name("command" if as_command else "basic", cmd))
    places: dict[str, tuple[str, int, int]] = {}  # node key -> (host, local rank, rank)
    per_host: dict[str, int] = {}
    with program.group(_TRAINER):
        for rank in range(num_trainer):
            host = hosts[rank % len(hosts)]
            env_vars = {
                "RANK": str(rank),
                "WORLD_SIZE": str(num_trainer),
                "LOCAL_RANK": str(per_host.get(host, 0)),
                "TLAUNCH_NUM_TRAINER": str(num_trainer),
            }
            if share_file is not None:
                env_vars["TLAUNCH_SHARE_FILE"] = share_file
            places[f"{_TRAINER}/{rank}"] = (host, per_host.get(host, 0), rank)
            per_host[host] = per_host.get(host, 0) + 1
            node = PyNode(run_command if as_command else run_trainer, cmd, env_vars, env_file)
            if remote:
                node.to_host(host)
            program.add_node(node)
    if log_dir is None:
        run = launch(program, placed.launch_type, options=common, backend_options=placed.backend_options,
                     run_id=run_id)  # fmt: skip
        return JobResult(run.run_id, run.log_dir, dict.fromkeys(per_host, 0), [])
    return _with_logs(program, placed, common, run_id, log_dir, places)


def _with_logs(
    program: Program,
    placed: Placed,
    common: LaunchOptions,
    run_id: str | None,
    log_dir: str,
    places: dict[str, tuple[str, int, int]],
) -> JobResult:
    """Launch ``program`` with each trainer's lines printed as always and filed under ``log_dir`` too."""

    def worker_of(prefix: str) -> tuple[str, int, int] | None:
        return places.get(prefix.rsplit(" ", 1)[-1])

    pending = PendingSink()
    common = dataclasses.replace(common, output=_Tee(Printer(), pending))
    backend = placed.backend_options
    run = launch(
        program, placed.launch_type, wait=False, options=common, backend_options=backend, run_id=run_id
    )
    try:
        logs = JobLogs(log_dir, run.run_id, lambda p: None, lambda h, lr: None, None, worker_of=worker_of)
    except BaseException:
        run.stop()
        raise
    try:
        pending.attach(logs)
        try:
            run.wait()
        except BaseException:  # Ctrl-C, a trainer's failure: nothing of the run may stay
            run.stop()
            raise
    finally:
        logs.close()
    hosts = {host for host, _, _ in places.values()}
    return JobResult(run.run_id, logs.dir, dict.fromkeys(hosts, 0), [])


class _Tee:
    """An output sink that hands every line to two others."""

    def __init__(self, first: Printer, second: PendingSink) -> None:
        self.first, self.second = first, second

    def line(self, prefix: str, text: str) -> None:
        self.first.line(prefix, text)
        self.second.line(prefix, text)
