"""The ``tlaunch`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

import tlaunch

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from tlaunch.cli.demo import run_demo

    return run_demo(args.hosts, args.producers, args.local)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``tlaunch``."""
    parser = argparse.ArgumentParser(
        prog="tlaunch", description="Launch Launchpad-style programs on one host or many."
    )
    parser.add_argument("--version", action="version", version=f"tlaunch {tlaunch.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="run the consumer/producer demo (on SSH test hosts if possible, else locally)"
    )
    demo.add_argument(
        "--hosts", type=int, default=3, help="test hosts to use when they can be made (default 3)"
    )
    demo.add_argument("--producers", type=int, default=6, help="producer nodes (default 6)")
    demo.add_argument("--local", action="store_true", help="run on this machine, without test hosts")
    demo.set_defaults(func=_demo)
    ps = sub.add_parser("ps", help="list runs, or the nodes of one run")
    ps.add_argument("run", nargs="?", help="a run id (or a unique prefix of one)")
    ps.set_defaults(func=lambda a: _runs().ps(a.run))
    logs = sub.add_parser("logs", help="print the logs of a run's nodes")
    logs.add_argument("run", help="a run id (or a unique prefix of one)")
    logs.add_argument("node", nargs="?", help="one node, as label/index")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    logs.set_defaults(func=lambda a: _runs().logs(a.run, a.node, a.follow))
    attach = sub.add_parser("attach", help="open a node's tmux window (default: the run's coordinator)")
    attach.add_argument("run", help="a run id (or a unique prefix of one)")
    attach.add_argument("node", nargs="?", help="one node, as label/index")
    attach.set_defaults(func=lambda a: _runs().attach(a.run, a.node))
    stop = sub.add_parser("stop", help="stop a run on every host and wait until nothing is left")
    stop.add_argument("run", help="a run id (or a unique prefix of one)")
    stop.set_defaults(func=lambda a: _runs().stop(a.run))
    debug = sub.add_parser(
        "debug",
        help="list the nodes waiting in a debugger (breakpoint(), post-mortem) and attach to one",
        description="Without NODE: list the paused nodes of RUN (or of every run) and attach to the "
        "only one, or to the one picked. With NODE: attach to it (pdb: p, n, s, up, c, q...). "
        "c or q lets the node go on, as does leaving (Ctrl-D, Ctrl-C, a closed terminal).",
    )
    debug.add_argument("run", nargs="?", help="a run id (or a unique prefix of one)")
    debug.add_argument("node", nargs="?", help="one node, as label/index")
    debug.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS", help="wait this long for NODE to pause"
    )
    debug.add_argument(
        "--dap",
        action="store_true",
        help="serve the Debug Adapter Protocol (debugpy on the node's host) on a local port for an "
        "editor (VS Code: attach, connect to 127.0.0.1:PORT) instead of pdb; needs RUN and NODE",
    )
    debug.add_argument("--port", type=int, default=0, help="the local port of --dap (default: a free one)")
    debug.set_defaults(func=lambda a: _debug().main(a.run, a.node, a.wait, dap=a.dap, port=a.port))
    top = sub.add_parser("top", help="every node of a run, live: CPU, memory, GPU, restarts, last line")
    top.add_argument(
        "run", nargs="?", help="a run id (or a unique prefix of one; default: the newest running)"
    )
    top.add_argument(
        "--sort",
        default="cpu",
        help="cpu (default), mem, gpu, gpu_mem, threads, fds, restarts, node, host, state",
    )
    top.add_argument("--once", action="store_true", help="print the table once and return")
    top.add_argument(
        "--interval", type=float, default=1.0, metavar="SECONDS", help="refresh every (default 1)"
    )
    top.set_defaults(func=lambda a: _top().main(a.run, a.sort, a.once, a.interval))
    from tlaunch.cli.job import add_job_commands, add_server_command

    add_job_commands(sub)
    add_server_command(sub)
    from tlaunch.cli.torch import add_torch_commands

    add_torch_commands(sub)
    from tlaunch.cli.k8s import add_k8s_commands

    add_k8s_commands(sub)
    return parser


def _debug() -> ModuleType:
    from tlaunch.cli import debug

    return debug


def _top() -> ModuleType:
    from tlaunch.cli import top

    return top


def _runs() -> ModuleType:
    from tlaunch.cli import runs

    return runs


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tlaunch``; returns the exit code."""
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["server"]:  # a program of its own, with its own options
        from tlaunch.cli.job import serve

        return serve(given[1:])
    args = build_parser().parse_args(given)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:  # Ctrl-C (`logs -f`, `stop`): quietly, as the shell expects
        return 130
    except tlaunch.TLaunchError as exc:  # a host that cannot be reached, a run that cannot be stopped...
        print(f"tlaunch: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
