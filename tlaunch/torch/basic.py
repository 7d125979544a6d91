"""basic mode: N trainers, each told its rank, world size, rank 0's address and maybe a shared file.

::

    tlaunch basic --num-trainer 4 --hosts h1,h2 --set-share-file train.py --epochs 3

Each trainer is a node of a plain tlaunch program (placed round-robin over the
hosts), so it has tlaunch's supervision, logs, restarts and failure report.
It runs the script in its own process with what every basic trainer gets on
every backend (:mod:`tlaunch.torch.trainer`): ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``TLAUNCH_NUM_TRAINER``, with a shared file ``TLAUNCH_SHARE_FILE`` (the seed's
``set_share_file``: a path the trainers use to exchange what they need; it
must be on a filesystem every host sees), and the original TLaunch's
arguments after the script's own: ``--rank R --world_size N`` (and
``--share_file F``), unless ``rank_args=False``. Rank 0's address reaches the
others through a rendezvous node on its host (on this machine: ``127.0.0.1``
and a port the launcher chose).
An ``env_file`` is sourced (bash) by each trainer on its host; with a
``log_dir``, each trainer's lines also go to
``<log_dir>/<run id>/<host>[<local_rank>].log`` (0600, in a 0700 folder).
Inside a SLURM allocation whose nodes are the hosts, the trainers are steps of
it (``srun``), one host or many.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from tlaunch.backends.slurm.options import SlurmOptions
from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.display import Printer
from tlaunch.errors import LaunchError
from tlaunch.launcher import launch
from tlaunch.nodes.courier import CourierNode
from tlaunch.nodes.python import PyNode
from tlaunch.options import LaunchOptions
from tlaunch.program import Program
from tlaunch.runtime.records import private_dirs
from tlaunch.torch.agent import free_port
from tlaunch.torch.collector import Collector
from tlaunch.torch.job import PendingSink
from tlaunch.torch.logs import JobLogs
from tlaunch.torch.placement import HostOptions, Placed, Placement, resolve_hostnames
from tlaunch.torch.torchrun import JobResult, job_name, place_script
from tlaunch.torch.trainer import MASTER_NAMES, TrainerSpec, run_trainer

__all__ = ["basic"]

_TRAINER = "trainer"
_RENDEZVOUS = "rendezvous"


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
    rank_args: bool = True,
    debug: str | None = None,
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
        env: more variables for every trainer (never on a command line); a variable
            tlaunch sets (``MASTER_ADDR``, ``RANK``...) given here keeps this value.
        env_file: a file each trainer sources (bash) on its host before it starts.
        log_dir: also write each trainer's lines to ``<log_dir>/<run id>/<host>[<local_rank>].log``.
        max_restarts: restarts of a trainer that fails.
        ssh, slurm, run_id: as for :func:`tlaunch.torch.torchrun`.
        as_command: ``command`` is any program's argv (run as it is, in each trainer's
            working directory), not a Python script: the ``command`` method.
        rank_args: pass ``--rank R --world_size N`` (and ``--share_file F``) after the
            script's own arguments, as the original TLaunch's basic mode does (a command
            gets none).
        debug: as for :func:`tlaunch.torch.torchrun` (a Python process the command starts too).

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
    common = LaunchOptions(max_restarts=max_restarts, env=dict(env) if env else None, debug=debug)
    if set_share_file and share_file is None:
        share_file = os.path.abspath(os.path.join("tlaunch-share", uuid.uuid4().hex[:12]))
    if share_file is not None:
        folder = os.path.dirname(os.path.abspath(share_file))
        private_dirs(folder, top=folder)  # made 0700 if new; an existing (shared) folder keeps its mode
    remote = options.placement(hosts) is not Placement.LOCAL
    program = Program(job_name("command" if as_command else "basic", cmd))
    given = frozenset(env or ())
    rendezvous, master = None, None
    if not remote:
        master = ("127.0.0.1", free_port())
    elif num_trainer > 1 and not given.issuperset(MASTER_NAMES):  # rank 0 tells the others where it is
        meeting: CourierNode[Any, Any] = CourierNode(Collector, num_trainer)
        meeting.to_host(hosts[0])
        rendezvous = program.add_node(meeting, label=_RENDEZVOUS)
    places: dict[str, tuple[str, int, int]] = {}  # node key -> (host, local rank, rank)
    ranks = [hosts[rank % len(hosts)] for rank in range(num_trainer)]
    per_host: dict[str, int] = {}
    with program.group(_TRAINER):
        for rank, host in enumerate(ranks):
            spec = TrainerSpec(
                tuple(cmd),
                rank,
                num_trainer,
                local_rank=per_host.get(host, 0),
                local_world_size=ranks.count(host),
                share_file=share_file,
                rank_args=rank_args,
                as_command=as_command,
                env_file=env_file,
                given=given,
                master=master,
            )
            places[f"{_TRAINER}/{rank}"] = (host, per_host.get(host, 0), rank)
            per_host[host] = per_host.get(host, 0) + 1
            node = PyNode(run_trainer, rendezvous, spec)
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
