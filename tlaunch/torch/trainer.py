"""A basic-mode trainer: what each trainer is given, then its script (the body of its node).

Every trainer of a basic job, on every backend, gets the same things (the
table is in ``docs/torch.md``; a pod of a basic LPJob gets them from
:mod:`tlaunch.k8s.children`):

=====================  ==============================================================
``RANK``               its index, ``0`` to ``N - 1``
``WORLD_SIZE``         ``N``, the job's ``num_trainer`` (also ``TLAUNCH_NUM_TRAINER``)
``LOCAL_RANK``         its index among the trainers on its host
``LOCAL_WORLD_SIZE``   how many trainers its host runs
``MASTER_ADDR``        rank 0's host, as the other hosts reach it
``MASTER_PORT``        a port free there (rank 0 chose it as it started)
``TLAUNCH_SHARE_FILE`` the shared file, with ``set_share_file``
``GLOO_SOCKET_IFNAME`` the interface of its host's address, unless set
``PATH``               the trainer's interpreter first: ``python`` is the one tlaunch runs
arguments              ``--rank R --world_size N`` (and ``--share_file F``) after its own
=====================  ==============================================================

so a script written for the original TLaunch's basic mode (``--rank``,
``--world_size``, ``--share_file``, ``init_method=f"file://{share_file}"``)
and one that calls ``dist.init_process_group("gloo")`` (``env://``) both
join one process group. Variables the job's ``env`` sets itself are left as
they are; ``rank_args=False`` passes no arguments.

When every trainer runs on the launcher's machine, rank 0's address is
``127.0.0.1`` and the launcher chooses its port; else rank 0 publishes its
address and port at the job's rendezvous node (a
:class:`~tlaunch.torch.collector.Collector` on rank 0's host) and the other
trainers look them up before their script starts.
"""

from __future__ import annotations

import os
import runpy
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tlaunch import context
from tlaunch.runtime.method_pods import rank_arguments
from tlaunch.torch.agent import free_port, socket_env
from tlaunch.torch.env import source_env_file
from tlaunch.torch.interpreter import python_first

__all__ = ["MASTER_NAMES", "TrainerSpec", "run_trainer", "trainer_env"]

MASTER_NAMES = ("MASTER_ADDR", "MASTER_PORT")
"""Where rank 0 listens: found at the rendezvous unless the job's ``env`` gives them."""

_MASTER_KEY = "master"
_LOOKUP_TIMEOUT = 600.0


@dataclass(frozen=True)
class TrainerSpec:
    """One trainer of a basic job: its command and its place in the job.

    Attributes:
        command: the script and its arguments (``["-m", module, ...]``: a module), or,
            with ``as_command``, any program's argv.
        rank: its rank.
        world_size: the job's trainers.
        local_rank: its index among the trainers of its host.
        local_world_size: the trainers of its host.
        share_file: the shared file, or None.
        rank_args: pass ``--rank``, ``--world_size`` (and ``--share_file``) after the script's
            own arguments (scripts only: a command runs as it is).
        as_command: ``command`` is a program's argv, run in a process of its own.
        env_file: a file sourced (bash) on the host first.
        given: variable names the job's ``env`` sets: tlaunch leaves them as they are.
        master: rank 0's address and port, when the launcher knows them (every trainer on
            its machine); else rank 0 chooses and publishes them.
    """

    command: tuple[str, ...]
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    share_file: str | None = None
    rank_args: bool = True
    as_command: bool = False
    env_file: str | None = None
    given: frozenset[str] = frozenset()
    master: tuple[str, int] | None = None


def trainer_env(spec: TrainerSpec, master: tuple[str, int]) -> dict[str, str]:
    """The variables ``spec``'s trainer gets, rank 0 listening at ``master`` (without those it is given)."""
    env = {
        "RANK": str(spec.rank),
        "WORLD_SIZE": str(spec.world_size),
        "LOCAL_RANK": str(spec.local_rank),
        "LOCAL_WORLD_SIZE": str(spec.local_world_size),
        "MASTER_ADDR": master[0],
        "MASTER_PORT": str(master[1]),
        "TLAUNCH_NUM_TRAINER": str(spec.world_size),
    }
    if spec.share_file is not None:
        env["TLAUNCH_SHARE_FILE"] = spec.share_file
    return {k: v for k, v in env.items() if k not in spec.given}


def _master(rendezvous: Any, spec: TrainerSpec) -> tuple[str, int]:
    """Rank 0's address and port: chosen here by rank 0 (and published), looked up by the others."""
    if spec.master is not None:
        return spec.master
    if spec.rank == 0 or rendezvous is None:
        master = (context.get_context().address, free_port())
        if rendezvous is not None:
            rendezvous.publish(_MASTER_KEY, list(master))
        return master
    addr, port = rendezvous.lookup(_MASTER_KEY, _LOOKUP_TIMEOUT)
    return str(addr), int(port)


def run_trainer(rendezvous: Any, spec: TrainerSpec) -> None:
    """Run ``spec``'s trainer in this process (the body of its node; see the module docstring).

    ``rendezvous``: the job's rendezvous client (None: rank 0 needs telling nobody).
    ``python`` on its ``PATH`` is the interpreter it runs with (:mod:`tlaunch.torch.interpreter`).
    A command (``as_command``) that fails ends this process with its exit code.
    """
    if spec.env_file:
        os.environ.update(source_env_file(spec.env_file))
    os.environ.update(trainer_env(spec, _master(rendezvous, spec)))
    os.environ.update(socket_env(context.get_context().address, dict(os.environ)))
    with python_first():
        if spec.as_command:
            code = _run_command(list(spec.command))
        else:
            command = list(spec.command)
            if spec.rank_args:
                command += rank_arguments(spec.rank, spec.world_size, spec.share_file)
            _run_script(command)
            return
    if code != 0:
        sys.stdout.flush()
        os._exit(code)  # the command's exit code is the trainer's (a raise would make it 1)


def _run_script(command: Sequence[str]) -> None:
    """``script args`` or ``-m module args`` in this process, as ``python`` would run it."""
    if command[0] == "-m":
        sys.argv = [command[1], *command[2:]]
        runpy.run_module(command[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(command)
        sys.path.insert(0, os.path.dirname(os.path.abspath(command[0])))
        runpy.run_path(command[0], run_name="__main__")


def _run_command(command: list[str]) -> int:
    """Any program (the ``command`` method), its output the trainer's; its exit code (a signal's:
    128 + N), said on stderr when it is not 0."""
    code = subprocess.call(command)
    if code != 0:
        code = 128 - code if code < 0 else code
        print(f"tlaunch: {shlex.join(command)} exited with code {code}", file=sys.stderr, flush=True)
    return code
