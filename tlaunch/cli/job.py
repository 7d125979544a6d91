"""``tlaunch job submit|ls|status|logs|stop|rm|debug``: the job server's client on the command line.

The server is ``$TLAUNCH_SERVER`` (default ``http://127.0.0.1:8765``), the
user's token ``$TLAUNCH_TOKEN``; ``tlaunch server`` starts one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tlaunch.cli.jobdebug import add_debug_command
from tlaunch.cli.methods import setting_flag
from tlaunch.cli.pool import add_pool_commands, queue_cell
from tlaunch.runtime.methods import (
    COMMAND,
    DEFAULT_METHOD,
    METHODS,
    REFERENCE,
    SETTINGS,
    describe,
    get_method,
    methods_of,
)

__all__ = ["add_job_commands", "add_server_command", "serve"]

_LS_LIMIT = 50
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 240)


def _client() -> Any:
    from tlaunch.jobs import Client

    return Client()


def _split(rest: list[str]) -> tuple[list[str], list[str]]:
    """``DIR options -- command``: the options, and the command."""
    if "--" in rest:
        at = rest.index("--")
        return rest[:at], rest[at + 1 :]
    return rest, []


def _submit_parser(add_help: bool = True) -> argparse.ArgumentParser:
    s = argparse.ArgumentParser(
        prog="tlaunch job submit DIR", usage="%(prog)s [options] -- python train.py ARGS", add_help=add_help
    )
    s.add_argument("--name", help="the job's name (default: the folder's)")
    s.add_argument("--method", default=DEFAULT_METHOD, choices=list(METHODS))
    s.add_argument(
        "--program",
        metavar="FILE:FUNCTION",
        help=f"methods {describe(methods_of(REFERENCE))}: what the job runs, {REFERENCE.what}",
    )
    s.add_argument("--num-trainer", type=int, help="trainers (default: the method's own)")
    for setting in SETTINGS.values():
        setting_flag(s, setting)
    s.add_argument("--hosts", help="h1,h2,... (default: the server's machine)")
    s.add_argument("--ssh-config", help="the ssh config the server reads for --hosts")
    s.add_argument("--slurm", nargs="?", const="", help="submit with sbatch (optionally: the partition)")
    s.add_argument("--time", help="slurm: the time limit")
    s.add_argument(
        "--k8s", nargs="?", const="", metavar="NAMESPACE", help="submit an LPJob (optionally: its namespace)"
    )
    s.add_argument("--image", help="k8s: the pods' image")
    s.add_argument("--cpu", type=int, help="CPUs of each pod (k8s) or task (slurm)")
    s.add_argument("--memory", help="memory of each pod (k8s) or node (slurm), e.g. 16Gi")
    s.add_argument("--gpus", type=int, help="GPUs of each pod (k8s) or node (slurm)")
    s.add_argument("--gpu-label", help="the server's pool: a host label or GPU model word (a100)")
    s.add_argument("--pool", help="the server's pool: one of its named pools")
    s.add_argument("--priority", type=int, default=0, help="the server's pool: higher first (an admin's)")
    s.add_argument(
        "--restart-policy",
        choices=("Never", "OnFailure"),
        default="Never",
        help="OnFailure: a job that fails (or is lost) runs again, --backoff-limit times at most",
    )
    s.add_argument("--backoff-limit", type=int, default=0, help="with --restart-policy OnFailure")
    s.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    s.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    return s


def _submit(folder: str, options: list[str], command: list[str]) -> int:
    from tlaunch.cli.torch import env_pairs

    a = _submit_parser().parse_args(options)

    method = get_method(a.method)
    fields: dict[str, Any] = {
        "launch_method": method.name,
        "env": env_pairs(a.env),
        "labels": env_pairs(a.label),
        **{name: getattr(a, name) for name in SETTINGS if getattr(a, name) != SETTINGS[name].default},
        "restart_policy": a.restart_policy,
        "backoff_limit": a.backoff_limit,
    }
    for key in ("gpu_label", "pool", "priority"):
        if getattr(a, key):
            fields[key] = getattr(a, key)
    if a.num_trainer is not None:
        fields["num_trainer"] = a.num_trainer
    if method.entry is COMMAND:  # any program, run as it is
        if not command:
            raise SystemExit(
                f"tlaunch job submit --method {method.name}: give the command last: ... -- bash run.sh"
            )
        fields["command"] = command
    elif method.entry is REFERENCE:
        if not a.program:
            raise SystemExit(f"tlaunch job submit --method {method.name}: give --program FILE:FUNCTION")
        fields.update(program=a.program, args=command)
    else:
        if command and os.path.basename(command[0]).startswith("python"):
            command = command[1:]
        if not command:
            raise SystemExit(
                "tlaunch job submit: give the entry point last: ... -- python train.py --lr 3e-4"
            )
        fields.update(entry_point=command[0], args=command[1:])
    if a.k8s is not None:
        fields.update(kubernetes={"namespace": a.k8s or None}, base_image=a.image)
    if a.cpu:
        fields["cpu_num"] = a.cpu
    if a.memory:
        fields["memory"] = a.memory
    if a.gpus:
        fields.update(use_gpu=True, gpu_num=a.gpus)
    if a.hosts:
        fields["hosts"] = [h.strip() for h in a.hosts.split(",") if h.strip()]
        fields["ssh_config"] = a.ssh_config
    if a.slurm is not None:
        fields["slurm"] = {"partition": a.slurm or None, "time": a.time}
    with _client() as c:
        package = c.upload(folder)
        job = c.submit(
            a.name or os.path.basename(os.path.abspath(folder)).lower().replace("_", "-"), package, **fields
        )
    run = job["refs"].get("run_id")
    said = f" (run {run})" if run else ""
    console.print(Text(f"submitted job {job['name']}{said}: {job['state']} ({job['message'] or 'accepted'})"))
    if job.get("queue"):
        console.print(Text(queue_cell(job)))
    return 0


def _ls(a: argparse.Namespace) -> int:
    if a.limit is not None and a.limit < 1:
        raise SystemExit(f"tlaunch job ls --limit {a.limit}: give 1 or more (or --all)")
    limit = None if a.all else (a.limit or _LS_LIMIT)
    with _client() as c:
        first = c.page(state=a.state, limit=min(limit or 500, 500))
        total = int(first["total"])
        jobs = first["jobs"] if limit is not None and limit <= 500 else c.list(state=a.state, limit=limit)
    table = Table("job", "owner", "state", "nodes", "message")
    for j in jobs:
        said = queue_cell(j) or j["message"]  # a job the pool has queued: its place and why it waits
        cells = (j["name"], j["owner"], j["state"], len(j["nodes"]), said)
        table.add_row(*(Text(str(x or "")) for x in cells))
    console.print(table)
    whose = f"{a.state.upper()} " if a.state else ""
    if len(jobs) < total:
        console.print(
            Text(f"{len(jobs)} of {total} {whose}jobs, newest first; --all lists every one, --limit N")
        )
    else:
        console.print(Text(f"{total} {whose}job{'s' * (total != 1)}"))
    return 0


def _status(a: argparse.Namespace) -> int:
    with _client() as c:
        job = c.get(a.name)
    if a.json:
        print(json.dumps(job, indent=2))
        return 0
    console.print(Text(f"job {job['name']} ({job['owner']}): {job['state']}"))
    if job["message"]:
        console.print(Text(str(job["message"])))
    if job.get("queue"):
        console.print(Text(queue_cell(job)))
    if job.get("placement"):
        where = ", ".join(f"{s['host']} GPUs {s['gpus']} CPUs {s['cpus']}" for s in job["placement"])
        console.print(Text(f"placed on {where}"))
    if job["failure"] and job["failure"].get("traceback"):
        console.print(Text(job["failure"]["traceback"], style="red"))
    table = Table("node", "host", "state", "exit", "restarts")
    for n in job["nodes"]:
        table.add_row(
            *(
                Text(str(x if x is not None else ""))
                for x in (n["key"], n["host"], n["state"], n["exit_code"], n["restarts"])
            )
        )
    console.print(table)
    return 0


def _logs(a: argparse.Namespace) -> int:
    with _client() as c:
        for line in c.logs(a.name, node=a.node, follow=a.follow, tail=a.tail):
            sys.stdout.write(
                f"[{line['where']}] {line['text']}\n" if line.get("where") else f"{line['text']}\n"
            )
            sys.stdout.flush()
    return 0


def _stop(a: argparse.Namespace) -> int:
    with _client() as c:
        console.print(Text(f"job {a.name}: {c.stop(a.name)['state']}"))
    return 0


def _rm(a: argparse.Namespace) -> int:
    with _client() as c:
        c.delete(a.name, force=a.force)
    console.print(Text(f"job {a.name} deleted"))
    return 0


def add_job_commands(sub: Any) -> None:
    """Add ``tlaunch job ...`` to the ``tlaunch`` subcommands."""
    job = sub.add_parser("job", help="submit and watch jobs on a tlaunch job server ($TLAUNCH_SERVER)")
    jobs = job.add_subparsers(dest="job_command", required=True)
    s = jobs.add_parser(
        "submit",
        help="upload a folder and run a script of it as a job",
        usage="tlaunch job submit DIR [options] -- python train.py ARGS",
        epilog="the job's options (after DIR, before --):\n"
        + _submit_parser(add_help=False).format_help().partition("options:\n")[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("dir", help="the folder to upload (the trainer package)")
    s.add_argument("rest", nargs=argparse.REMAINDER, help="options, then -- and the command")
    s.set_defaults(func=lambda a: _submit(a.dir, *_split(a.rest)))
    ls = jobs.add_parser("ls", help=f"list jobs (the newest {_LS_LIMIT}, and how many there are)")
    ls.add_argument("--state", help="only jobs in this state")
    shown = ls.add_mutually_exclusive_group()
    shown.add_argument("--all", action="store_true", help="every job")
    shown.add_argument("--limit", type=int, metavar="N", help=f"the newest N jobs (default {_LS_LIMIT})")
    ls.set_defaults(func=_ls)
    for name, func, text in (("status", _status, "a job's state and nodes"), ("stop", _stop, "stop a job")):
        p = jobs.add_parser(name, help=text)
        p.add_argument("name")
        if name == "status":
            p.add_argument("--json", action="store_true")
        p.set_defaults(func=func)
    lg = jobs.add_parser("logs", help="print a job's logs")
    lg.add_argument("name")
    lg.add_argument("node", nargs="?")
    lg.add_argument("-f", "--follow", action="store_true")
    lg.add_argument("--tail", type=int)
    lg.set_defaults(func=_logs)
    add_pool_commands(jobs, console, _client)
    add_debug_command(jobs, console, _client)
    rm = jobs.add_parser("rm", help="delete a job (--force: a running one too)")
    rm.add_argument("name")
    rm.add_argument("--force", action="store_true")
    rm.set_defaults(func=_rm)


def serve(args: list[str]) -> int:
    """``tlaunch server ARGS``: the job server is its own program, ``python -m tlaunch.server ARGS``."""
    os.execv(sys.executable, [sys.executable, "-m", "tlaunch.server", *args])
    return 0  # pragma: no cover


def add_server_command(sub: Any) -> None:
    """Add ``tlaunch server`` to the help (``main`` hands its arguments to :func:`serve` unparsed)."""
    sub.add_parser("server", help="serve the job server (--port, --home, --token-file; see --help)")
