"""``tlaunch job pool`` and ``tlaunch job priority``: the job server's pool of hosts, on the command line."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["add_pool_commands", "pool_tables", "queue_cell"]


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f}Gi"


def queue_cell(job: dict[str, Any]) -> str:
    """A waiting job's place and reason (``#2 waiting for 4 GPUs: ...``), or ``""``."""
    queue = job.get("queue")
    return f"#{queue['position']} {queue['reason']}" if queue else ""


def pool_tables(pool: dict[str, Any]) -> list[Table]:
    """The pool as tables: its hosts (GPUs and who holds each), then its queue."""
    hosts = Table("host", "pool", "state", "GPUs", "CPUs", "memory", "jobs", title="hosts")
    for h in pool["hosts"]:
        gpus = []
        for g in h["gpus"]:
            who = g["job"] or ", ".join(f"pid {o['pid']} {o['name']}" for o in g["others"]) or "free"
            gpus.append(f"{g['index']}: {who}")
        state = "up" if h["up"] else f"down ({h['reason']})"
        hosts.add_row(
            *(
                Text(x)
                for x in (
                    h["name"],
                    h["pool"],
                    state,
                    "\n".join(gpus) or "-",
                    f"{h['cpus_used']}/{h['cpus']}",
                    f"{_gib(h['memory_used'])}/{_gib(h['memory'])}",
                    ", ".join(h["jobs"]),
                )
            )
        )
    queue = Table("#", "job", "user", "priority", "reason", title="queue")
    for q in pool["queue"]:
        queue.add_row(
            *(Text(str(x)) for x in (q["position"], q["job"], q["user"], q["priority"], q["reason"]))
        )
    return [hosts, queue]


def _pool(a: argparse.Namespace, console: Console, client: Any) -> int:
    with client() as c:
        pool = c.pool()
    if a.json:
        print(json.dumps(pool, indent=2))
        return 0
    for table in pool_tables(pool):
        console.print(table)
    return 0


def _priority(a: argparse.Namespace, console: Console, client: Any) -> int:
    with client() as c:
        done = c.set_priority(a.name, a.priority)
    console.print(
        Text(
            f"job {a.name}: priority {done['priority']}" + (f", {queue_cell(done)}" if done["queue"] else "")
        )
    )
    return 0


def add_pool_commands(jobs: Any, console: Console, client: Any) -> None:
    """Add ``pool`` and ``priority`` to ``tlaunch job``'s subcommands."""
    p = jobs.add_parser(
        "pool", help="the server's pool of hosts: GPUs, CPUs, memory, who holds what, the queue"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _pool(a, console, client))
    pr = jobs.add_parser("priority", help="set a waiting job's priority in the pool's queue (an admin's)")
    pr.add_argument("name")
    pr.add_argument("priority", type=int)
    pr.set_defaults(func=lambda a: _priority(a, console, client))
