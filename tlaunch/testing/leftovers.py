"""What a test looks for on its test hosts, and kills there: a run's leftovers, a host's processes.

:class:`~tlaunch.testing.hosts.SSHTestHosts` answers with these (``leftovers``,
``crash``): every host is asked over SSH, as a user would look (``ps``,
``tmux ls``, the run's secret files); a host's processes are those in its own
network namespace (the hosts share this machine's process table).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence

__all__ = ["kill_in_namespace", "leftovers_on", "namespace_processes"]


def namespace_processes(netns: str) -> dict[int, str]:
    """The processes of network namespace ``netns`` (a test host's own): pid -> command line."""
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=False)
    found = {}
    for pid in (int(p) for p in out.stdout.split()):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            found[pid] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def kill_in_namespace(netns: str, needle: str) -> list[int]:
    """SIGKILL every process of network namespace ``netns`` whose command line contains ``needle``; their
    pids."""
    killed = []
    for pid, cmdline in namespace_processes(netns).items():
        if needle in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def leftovers_on(hosts: Sequence[str], ssh_config: str, run_id: str) -> dict[str, list[str]]:
    """What of run ``run_id`` is left on each of ``hosts``: processes, tmux sessions, secret files (logs,
    ``final.json`` and the run directory itself are expected to stay)."""
    from tlaunch.ssh import connect_all

    conns = connect_all(list(hosts), ssh_config=ssh_config)
    left: dict[str, list[str]] = {}
    try:
        for name, conn in conns.items():
            procs = conn.run(["ps", "-ww", "-eo", "pid,args"]).stdout.splitlines()
            sessions = conn.run(["tmux", "ls", "-F", "#{session_name}"], check=False).stdout.split()
            d = f".tlaunch/runs/{run_id}"
            ls = f"ls -d {d}/*.node {d}/head.pkl {d}/work {d}/modules {d}/blobs 2>/dev/null"
            files = conn.run(["sh", "-c", ls], check=False).stdout.split()
            found = [p.strip() for p in procs if run_id in p and "ps -eo" not in p]
            found += [f"tmux session {s}" for s in sessions if run_id in s] + files
            if found:
                left[name] = found
    finally:
        for conn in conns.values():
            conn.close()
    return left
