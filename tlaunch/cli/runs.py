"""``tlaunch ps``, ``logs``, ``attach`` and ``stop``: a run seen from another process.

A run launched over SSH lives on without its launcher once detached: these
commands reach its coordinator on the head host with the keys of its local
record, and its hosts over SSH (logs, attach, the final state, teardown).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import sys
import time
from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tlaunch.cli.batch_runs import batch_logs, batch_status, batch_stop, is_batch
from tlaunch.cli.records import coordinator_client, mark_ended
from tlaunch.errors import RPCError, StopError
from tlaunch.launcher import runs_dir
from tlaunch.procs import pid_exists, process_start
from tlaunch.runtime.records import RunRecord, list_records, read_keys

__all__ = ["attach", "find_run", "logs", "ps", "stop"]

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


def _status(run_dir: str, record: RunRecord) -> tuple[str, dict[str, Any] | None]:
    if record.ended:
        return "ended", record.final_status
    if is_batch(record):
        return batch_status(run_dir, record)
    if not _outlives_launcher(record) and not _launcher_alive(record):
        # Its coordinator lived in its launcher, and its nodes died with it.
        mark_ended(run_dir, record, {"stop_reason": "its launcher is gone (the nodes ended with it)"})
        return "ended", record.final_status
    try:
        client = coordinator_client(run_dir, record)
    except OSError:
        return "unknown (its keys are gone)", None
    try:
        return "running", client.status()
    except RPCError:
        pass
    finally:
        client.close()
    if record.backend == "ssh":
        final = _fetch_final(record)
        if final is not None:
            mark_ended(run_dir, record, final)
            return "ended", record.final_status
    return "unreachable (its coordinator is gone)", None


def _outlives_launcher(record: RunRecord) -> bool:
    """Whether the run's coordinator lives apart from its launcher (an SSH head)."""
    return record.head is not None or record.backend == "ssh"


def _live_summary(run_dir: str, record: RunRecord) -> dict[str, Any]:
    """Stop reason and first failure of a running run (empty if its coordinator is unreachable)."""
    client = coordinator_client(run_dir, record)
    try:
        summary: dict[str, Any] = client.summary()
        return summary
    except RPCError:
        return {}
    finally:
        client.close()


def _fetch_final(record: RunRecord) -> dict[str, Any] | None:
    """The head's final.json of an SSH run whose coordinator has exited."""
    from tlaunch.backends.ssh import run_dir_of
    from tlaunch.errors import SSHError
    from tlaunch.ssh import connect_all

    head = record.head or record.hosts[0]
    try:
        conn = connect_all([head], ssh_config=record.ssh_config)[head]
    except Exception:
        return None
    try:
        data: dict[str, Any] = json.loads(conn.read_file(f"{run_dir_of(record.run_id)}/final.json"))
        return data
    except (SSHError, ValueError):
        return None
    finally:
        conn.close()


def _row(*cells: object) -> list[Text]:
    """Table cells as plain text: labels and reasons are never read as rich markup."""
    return [Text("" if c is None else str(c)) for c in cells]


def ps(run: str | None) -> int:
    """List runs, or one run's nodes."""
    if run is None:
        table = Table("run", "program", "backend", "hosts", "state", "nodes")
        for run_dir, rec in list_records(runs_dir()):
            state, status = _status(run_dir, rec)
            counts = Counter(v["state"] for v in (status or {}).values())
            nodes = " ".join(f"{k}={n}" for k, n in sorted(counts.items()))
            table.add_row(*_row(rec.run_id, rec.program, rec.backend, ",".join(rec.hosts), state, nodes))
        console.print(table)
        return 0
    run_dir, rec = find_run(run)
    state, status = _status(run_dir, rec)
    console.print(Text(f"run {rec.run_id} ({rec.program}, {rec.backend}): {state}"))
    summary = _live_summary(run_dir, rec) if state == "running" else {}
    reason = summary.get("stop_reason") or rec.stop_reason
    failure = summary.get("failure") or rec.failure
    if reason:
        console.print(Text(f"stopped because {reason}"))
    if failure:
        how = failure.get("reason") or f"exited with code {failure.get('exit_code')}"
        console.print(Text(f"first failure: node {failure['key']} on {failure['host']} {how}", style="red"))
    table = Table("node", "host", "state", "pid", "exit", "reason")
    for key, node in (status or {}).items():
        table.add_row(
            *_row(key, node["host"], node["state"], node["pid"] or "", node["exit_code"], node["reason"])
        )
    console.print(table)
    return 0


def _launcher_alive(rec: RunRecord) -> bool:
    """Whether the run's launcher still runs: its pid, started when the record says (not a reused pid)."""
    if rec.launcher_pid is None or rec.detached or not pid_exists(rec.launcher_pid):
        return False
    return rec.launcher_start is None or process_start(rec.launcher_pid) == rec.launcher_start


def stop(run: str, timeout: float = 60.0) -> int:
    """Stop a run: its launcher tears it down, or (detached) this process does."""
    run_dir, rec = find_run(run)
    if rec.ended or _status(run_dir, rec)[0] == "ended":
        console.print(f"run {rec.run_id} has already ended")
        return 0
    if is_batch(rec):
        return batch_stop(run_dir, rec, timeout)
    if rec.backend == "ssh" and not _launcher_alive(rec):
        return _stop_detached(run_dir, rec)
    client = coordinator_client(run_dir, rec)
    try:
        client.stop(f"`tlaunch stop` from pid {os.getpid()}")
    except RPCError as exc:
        console.print(
            Text(f"cannot reach run {rec.run_id}'s coordinator at {rec.coordinator}: {exc}", style="red")
        )
        return 1
    finally:
        client.close()
    # Its launcher (even an idle one: a notebook) tears the run down and records its end.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, rec = find_run(rec.run_id)
        if rec.ended or not _launcher_alive(rec):
            console.print(Text(f"run {rec.run_id} stopped"))
            return 0
        time.sleep(0.1)
    console.print(
        Text(f"run {rec.run_id} was asked to stop but has not ended after {timeout:.0f} s", style="red")
    )
    return 1


def _stop_detached(run_dir: str, rec: RunRecord) -> int:
    """Tear down an SSH run that no launcher holds: stop, confirm each host, record the end."""
    from tlaunch.backends.ssh import attach_ssh

    backend = attach_ssh(run_dir, rec, read_keys(run_dir))
    coord = backend.coord
    assert coord is not None
    left: StopError | None = None
    try:
        backend.stop(grace=coord.stop_grace())
    except StopError as exc:
        left = exc
    failure = coord.failure
    final = {
        "status": coord.status(),
        "stop_reason": coord.stop_reason,
        "failure": None if failure is None else dataclasses.asdict(failure),
    }
    mark_ended(run_dir, rec, final)
    if left is not None:
        console.print(Text(str(left), style="red"))
        return 1
    console.print(Text(f"run {rec.run_id} stopped on {', '.join(rec.hosts)}"))
    return 0


def attach(run: str, node: str | None) -> int:
    """Open the tmux window of a node (or the run's coordinator) in this terminal."""
    run_dir, rec = find_run(run)
    session = f"tlaunch-{rec.run_id}"
    if rec.backend != "ssh":
        if rec.backend != "local_mp" or shutil.which("tmux") is None:
            raise SystemExit(
                f"tlaunch: run {rec.run_id} has no tmux session; use `tlaunch logs -f {rec.run_id}`"
            )
        os.execvp("tmux", ["tmux", "attach", "-t", f"={session}"])
    state, status = _status(run_dir, rec)
    if state == "ended":
        raise SystemExit(f"tlaunch: run {rec.run_id} has ended; its logs: `tlaunch logs {rec.run_id}`")
    host = rec.head or rec.hosts[0]
    window = "coordinator"
    if node is not None:
        if not status or node not in status:
            raise SystemExit(f"tlaunch: run {rec.run_id} has no node {node!r}; nodes: {sorted(status or {})}")
        host, window = status[node]["host"], node
    argv = ["ssh", "-t"]
    if rec.ssh_config:
        argv += ["-F", rec.ssh_config]
    # Select the window by name inside tmux: names may hold characters tmux targets do not allow.
    remote = (
        f"tmux select-window -t {shlex.quote('=' + session + ':=' + window)} 2>/dev/null || "
        f'tmux select-window -t "$(tmux list-windows -t {shlex.quote("=" + session)} '
        f"-F '#{{window_index}} #{{window_name}}' | awk -v w={shlex.quote(window)} "
        '\'substr($0, index($0, " ") + 1) == w {print $1}\')"; '
        f"exec tmux attach -t {shlex.quote('=' + session)}"
    )
    os.execvp("ssh", [*argv, host, remote])
    return 0  # pragma: no cover - exec does not return


def logs(run: str, node: str | None, follow: bool) -> int:
    """Print (and with ``follow``, keep printing) the logs of a run's nodes."""
    run_dir, rec = find_run(run)
    if is_batch(rec):
        return batch_logs(run_dir, rec, node, follow)
    if rec.backend == "ssh":
        return _ssh_logs(run_dir, rec, node, follow)
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
    from tlaunch.plan import log_name

    return log_name(node)


def _ssh_logs(run_dir: str, rec: RunRecord, node: str | None, follow: bool) -> int:
    from tlaunch.backends.ssh import run_dir_of
    from tlaunch.display import Printer
    from tlaunch.ssh import connect_all
    from tlaunch.ssh.tail import RemoteTail

    log_dir = f"{run_dir_of(rec.run_id)}/logs"
    conns = connect_all(rec.hosts, ssh_config=rec.ssh_config)
    printer = Printer(console)
    tails = []
    try:
        for host, conn in conns.items():
            listing = conn.run(["ls", "-1", log_dir], check=False).stdout.split()
            names = [n for n in listing if n.endswith(".log") and (node is None or n == _log_file(node))]
            if not names:
                continue
            paths = [f"{log_dir}/{n}" for n in names]

            def on_line(path: str, line: str, host: str = host) -> None:
                printer.line(f"{host} {os.path.basename(path)[:-4]}", line)

            tail = RemoteTail(conn, paths, on_line, session=f"tlaunch-{rec.run_id}")
            tail.start()
            tails.append(tail)
        if not tails:
            raise SystemExit(
                f"tlaunch: no log of {node or 'any node'} on {', '.join(rec.hosts)} in ~/{log_dir}"
            )
        while follow and _status(run_dir, rec)[0] == "running":
            time.sleep(0.5)
        for tail in tails:
            tail.stop(drain=1.0)
    finally:
        for conn in conns.values():
            conn.close()
    return 0
