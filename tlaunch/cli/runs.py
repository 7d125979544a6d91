"""``tlaunch ps``, ``tlaunch logs`` and ``tlaunch stop``: a run seen from another process."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from tlaunch.errors import RPCError
from tlaunch.launcher import runs_dir
from tlaunch.rpc.client import RPCClient, fixed_resolver
from tlaunch.runtime.records import RunRecord, list_records, read_keys

__all__ = ["find_run", "logs", "ps", "stop"]

# Piped output (scripts, tests) gets full run ids rather than an 80-column cut.
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 240)


def find_run(prefix: str) -> tuple[str, RunRecord]:
    """The run whose id is, or starts with, ``prefix``.

    Raises:
        SystemExit: no run, or several, match (the message lists them).
    """
    records = list_records(runs_dir())
    exact = [r for r in records if r[1].run_id == prefix]
    matches = exact or [r for r in records if r[1].run_id.startswith(prefix)]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(r.run_id for _, r in records[:10]) or "none"
    if not matches:
        raise SystemExit(f"tlaunch: no run {prefix!r} in {runs_dir()}; known runs: {known}")
    raise SystemExit(f"tlaunch: {prefix!r} matches several runs: {', '.join(r.run_id for _, r in matches)}")


def _coordinator(run_dir: str, record: RunRecord) -> RPCClient:
    resolver = fixed_resolver(record.coordinator)
    return RPCClient("coordinator", read_keys(run_dir), resolver, resolve_timeout=3.0, default_timeout=5.0)


def _status(run_dir: str, record: RunRecord) -> tuple[str, dict[str, Any] | None]:
    if record.ended:
        return "ended", record.final_status
    try:
        client = _coordinator(run_dir, record)
    except OSError:
        return "unknown", None
    try:
        return "running", client.status()
    except RPCError:
        return "unreachable (launcher gone?)", None
    finally:
        client.close()


def ps(run: str | None) -> int:
    """List runs, or one run's nodes."""
    if run is None:
        table = Table("run", "program", "backend", "hosts", "state", "nodes")
        for run_dir, rec in list_records(runs_dir()):
            state, status = _status(run_dir, rec)
            counts = Counter(v["state"] for v in (status or {}).values())
            table.add_row(
                rec.run_id,
                rec.program,
                rec.backend,
                ",".join(rec.hosts),
                state,
                " ".join(f"{k}={n}" for k, n in sorted(counts.items())),
            )
        console.print(table)
        return 0
    run_dir, rec = find_run(run)
    state, status = _status(run_dir, rec)
    console.print(f"run {rec.run_id} ({rec.program}, {rec.backend}): {state}")
    table = Table("node", "host", "state", "pid", "exit", "reason")
    for key, node in (status or {}).items():
        table.add_row(
            key,
            node["host"],
            node["state"],
            str(node["pid"] or ""),
            "" if node["exit_code"] is None else str(node["exit_code"]),
            node["reason"] or "",
        )
    console.print(table)
    return 0


def stop(run: str, timeout: float = 60.0) -> int:
    """Stop a run and wait until its launcher has torn it down."""
    run_dir, rec = find_run(run)
    if rec.ended:
        console.print(f"run {rec.run_id} has already ended")
        return 0
    client = _coordinator(run_dir, rec)
    try:
        client.stop(f"`tlaunch stop` from pid {os.getpid()}")
    except RPCError as exc:
        console.print(f"[red]cannot reach run {rec.run_id}'s coordinator at {rec.coordinator}: {exc}[/red]")
        return 1
    finally:
        client.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, rec = find_run(rec.run_id)
        if rec.ended:
            console.print(f"run {rec.run_id} stopped")
            return 0
        time.sleep(0.1)
    console.print(f"[red]run {rec.run_id} was asked to stop but has not ended after {timeout:.0f} s[/red]")
    return 1


def logs(run: str, node: str | None, follow: bool) -> int:
    """Print (and with ``follow``, keep printing) the logs of a run's nodes."""
    run_dir, rec = find_run(run)
    if rec.backend == "ssh":
        return _ssh_logs(rec, node)
    log_dir = rec.log_dir or os.path.join(run_dir, "logs")
    wanted = sorted(f for f in os.listdir(log_dir) if node is None or f == _log_file(node))
    if not wanted:
        raise SystemExit(
            f"tlaunch: no log of node {node!r} in {log_dir}; logs: {sorted(os.listdir(log_dir))}"
        )
    offsets = dict.fromkeys(wanted, 0)
    while True:
        for name in wanted:
            with open(os.path.join(log_dir, name), "rb") as f:
                f.seek(offsets[name])
                data = f.read()
            offsets[name] += len(data)
            for line in data.decode("utf-8", "replace").splitlines():
                sys.stdout.write(f"[{name[:-4]}] {line}\n")
        sys.stdout.flush()
        if not follow or find_run(rec.run_id)[1].ended:
            return 0
        time.sleep(0.2)


def _log_file(node: str) -> str:
    from tlaunch.backends.local import log_name

    return log_name(node)


def _ssh_logs(rec: RunRecord, node: str | None) -> int:
    from tlaunch.ssh import connect_all

    conns = connect_all(rec.hosts, ssh_config=rec.ssh_config)
    try:
        for host, conn in conns.items():
            pattern = _log_file(node) if node else "*.log"
            out = conn.run(
                [
                    "sh",
                    "-c",
                    f'cd {rec.log_dir} && for f in {pattern}; do [ -e "$f" ] && sed "s|^|[$f] |" "$f"; done',
                ],
                check=False,
            )
            for line in out.stdout.splitlines():
                sys.stdout.write(f"[{host}] {line}\n")
    finally:
        for conn in conns.values():
            conn.close()
    return 0
