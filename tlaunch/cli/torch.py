"""``tlaunch torchrun``, ``deepspeed`` and ``basic``: torch jobs on many hosts from one command.

One subcommand per launch method whose job's entry is a script (its help is
the method's summary in :data:`tlaunch.runtime.methods.METHODS`); each is the
torch mode of that name with its own options (:data:`_COMMANDS`, which a test
keeps equal to those methods).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, Literal

from tlaunch.cli.methods import setting_flag
from tlaunch.runtime.methods import METHODS, SETTINGS

__all__ = ["add_torch_commands", "env_pairs"]


def _hosts(text: str | None) -> list[str] | str:
    if text is None:
        return "auto"
    if text in ("auto", "slurm"):
        return text
    return [h.strip() for h in text.split(",") if h.strip()]


def echo_ranks(text: str) -> list[int] | None:
    """``--echo-ranks``: ``0,1``, ``all`` or ``none``.

    Raises:
        argparse.ArgumentTypeError: anything else (argparse names the option and exits 2).
    """
    if text == "none":
        return None
    if text == "all":
        return list(range(1 << 16))
    parts = text.split(",")
    if not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not ranks: give global ranks as 0,1,2 (each >= 0), 'all' or 'none'"
        )
    return [int(p) for p in parts]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ssh-config", help="the ssh config (default ~/.ssh/config)")
    p.add_argument("--working-dir", help="a folder shipped to every host; ranks start in it")
    p.add_argument(
        "--no-ship",
        action="store_true",
        help="ship nothing: every host shares this filesystem and runs the script from its path here",
    )
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="set in every rank")
    p.add_argument("--env-file", help="a file each host sources (bash) before starting its ranks")
    p.add_argument("--log-dir", help="where <run id>/<host>[<local rank>].log go (default ./tlaunch_logs)")
    p.add_argument(
        "--debug",
        choices=["post-mortem"],
        help="post-mortem: a rank that raises waits at its exception for `tlaunch debug` (default: "
        "$TLAUNCH_DEBUG; breakpoint() needs none)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="the script and its arguments")


def env_pairs(items: list[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` options as a dict.

    Raises:
        LaunchError: an item without ``=`` or without a name.
    """
    from tlaunch.errors import LaunchError

    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise LaunchError(f"--env {item!r} is not NAME=VALUE")
        out[name] = value
    return out


def _working_dir(a: argparse.Namespace) -> str | Literal[False] | None:
    """``--working-dir DIR``, or False for ``--no-ship``.

    Raises:
        LaunchError: both were given.
    """
    from tlaunch.errors import LaunchError

    if a.no_ship and a.working_dir is not None:
        raise LaunchError(
            f"--no-ship ships nothing and --working-dir {a.working_dir!r} ships a folder: give one of them"
        )
    return False if a.no_ship else a.working_dir


def _run(what: str, fn: Any, a: argparse.Namespace, **kwargs: Any) -> int:
    """Run the mode's function ``fn`` with its own ``kwargs`` and the options every mode takes (``a``'s)."""
    from tlaunch.errors import TLaunchError

    common = {"command": a.command, "ssh_config_file": a.ssh_config, "working_dir": _working_dir(a),
              "env": env_pairs(a.env), "env_file": a.env_file, "log_dir": a.log_dir,
              "debug": a.debug}  # fmt: skip
    try:
        result = fn(**common, **kwargs)
    except TLaunchError as exc:
        print(f"tlaunch {what}: {exc}", file=sys.stderr)
        return 1
    print(f"tlaunch {what}: done; logs in {result.log_dir}", file=sys.stderr)
    return 0


def _torchrun_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hosts", help="h1,h2,... (default: the SLURM allocation, else localhost)")
    p.add_argument("--nnodes", help="N or MIN:MAX (elastic); default: every host")
    p.add_argument("--nproc-per-node", default="1", help="ranks per host: an int, gpu, cpu or auto")
    p.add_argument("--max-restarts", type=int, default=0, help="torch's restart budget of each host")
    p.add_argument("--host-restarts", type=int, default=0, help="restarts of a host's agent that dies")
    p.add_argument("--rdzv-port", type=int, help="the rendezvous port on the first host (default: free)")
    p.add_argument(
        "--echo-ranks", type=echo_ranks, default=[0], help="ranks echoed here: 0,1 / all / none (default 0)"
    )


def _torchrun(a: argparse.Namespace) -> int:
    from tlaunch.torch.torchrun import torchrun

    nproc: int | str = int(a.nproc_per_node) if a.nproc_per_node.isdigit() else a.nproc_per_node
    return _run(
        "torchrun",
        torchrun,
        a,
        hostnames=_hosts(a.hosts),
        nnodes=a.nnodes,
        nproc_per_node=nproc,
        max_restarts=a.max_restarts,
        echo_ranks=a.echo_ranks,
        host_restarts=a.host_restarts,
        rdzv_port=a.rdzv_port,
    )


def _deepspeed_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hostfile", help="DeepSpeed hostfile: 'HOST slots=N' lines")
    p.add_argument(
        "--hosts", help="h1,h2,... when there is no hostfile (default: the SLURM allocation, else localhost)"
    )
    p.add_argument("--include", default="", help="e.g. 'h1:0,1@h2'")
    p.add_argument("--exclude", default="", help="e.g. 'h1:1'")
    p.add_argument("--num_nodes", "--num-nodes", type=int, default=-1, help="use the first N hosts")
    p.add_argument(
        "--num_gpus",
        "--num-gpus",
        type=int,
        default=-1,
        help="use the first N slots of each host (without a hostfile: N slots each; default 1)",
    )
    p.add_argument("--master_port", "--master-port", type=int, help="rank 0's port (default: free)")


def _deepspeed(a: argparse.Namespace) -> int:
    from tlaunch.torch.deepspeed import deepspeed

    return _run(
        "deepspeed",
        deepspeed,
        a,
        hostfile=a.hostfile,
        hostnames=None if a.hosts is None else _hosts(a.hosts),
        include=a.include,
        exclude=a.exclude,
        num_nodes=a.num_nodes,
        num_gpus=a.num_gpus,
        master_port=a.master_port,
    )


def _basic_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-trainer", "--num_trainer", type=int, required=True, help="how many trainers")
    p.add_argument("--hosts", help="h1,h2,... (round-robin; default: the SLURM allocation, else localhost)")
    for name in ("set_share_file", "rank_args"):  # the job settings of the method (tlaunchrun's too)
        setting_flag(p, SETTINGS[name])
    p.add_argument("--share-file", help="the shared file's path (on a filesystem all hosts see)")
    p.add_argument("--max-restarts", type=int, default=0, help="restarts of a trainer that fails")
    p.add_argument(
        "--command",
        action="store_true",
        dest="as_command",
        help="run the arguments as a command (any program, e.g. 'bash run.sh'), not a Python script",
    )


def _basic(a: argparse.Namespace) -> int:
    from tlaunch.torch.basic import basic

    return _run(
        "basic",
        basic,
        a,
        num_trainer=a.num_trainer,
        hostnames=_hosts(a.hosts),
        set_share_file=a.set_share_file,
        share_file=a.share_file,
        max_restarts=a.max_restarts,
        as_command=a.as_command,
        rank_args=a.rank_args,
    )


_COMMANDS: dict[
    str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
] = {
    "torchrun": (_torchrun_arguments, _torchrun),
    "deepspeed": (_deepspeed_arguments, _deepspeed),
    "basic": (_basic_arguments, _basic),
}
"""The ``tlaunch`` command of each method that has one: its own options, and what runs it."""


def add_torch_commands(sub: Any) -> None:
    """Add a command for each launch method that has one (``torchrun``, ``deepspeed``, ``basic``)."""
    for method in METHODS.values():
        if method.name not in _COMMANDS:
            continue
        arguments, run = _COMMANDS[method.name]
        p = sub.add_parser(
            method.name,
            help=method.summary,
            description=f"{method.summary}; Ctrl-C stops every host.",
        )
        arguments(p)
        _common(p)
        p.set_defaults(func=run)
