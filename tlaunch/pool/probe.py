"""Asking SSH hosts what they have: CPUs, memory, GPUs and who uses them; and what of a run is left.

One shell command per host and probe, over a connection kept open between
probes (one per host: :class:`Prober`)::

    nproc; Cpus_allowed_list of /proc/self/status; MemTotal of /proc/meminfo
    nvidia-smi --query-gpu=index,name,memory.total,uuid --format=csv,noheader,nounits
    nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits

A host without ``nvidia-smi`` has no GPUs; one whose ``nvidia-smi`` fails
(a driver mismatch) is reported as failing, with its words, rather than as a
host without GPUs. :func:`parse_probe` reads the answer (pure); a host that
does not answer (refused, timed out, its key changed) gives its error's text,
which the pool shows as the reason it is down.
"""

from __future__ import annotations

import csv
import shlex
import threading
from collections.abc import Sequence

from tlaunch.errors import SSHError
from tlaunch.pool.resources import Gpu, GpuProcess, HostFacts, parse_cpu_list
from tlaunch.procs import MARKER
from tlaunch.ssh.config import ConfigFile
from tlaunch.ssh.connection import Connection
from tlaunch.ssh.fanout import pmap

__all__ = ["PROBE", "Prober", "left_script", "parse_apps", "parse_probe"]

PROBE = """\
echo @nproc; nproc
echo @cpus; grep -m1 '^Cpus_allowed_list' /proc/self/status
echo @memory; grep -m1 '^MemTotal' /proc/meminfo
if command -v nvidia-smi >/dev/null 2>&1; then
  echo @gpus
  nvidia-smi --query-gpu=index,name,memory.total,uuid --format=csv,noheader,nounits 2>&1 || echo "@failed $?"
  echo @apps
  nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits 2>&1 \\
    || echo "@failed $?"
fi
"""
"""The probe's shell command (``sh -c``)."""

_NO_DEVICES = "No devices were found"  # nvidia-smi's words (exit status 6) on a host without GPUs


def parse_probe(text: str) -> HostFacts:
    """A host's facts from the output of :data:`PROBE`.

    Raises:
        ValueError: the output is not a probe's, or ``nvidia-smi`` failed (its words).
    """
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("@") and line[1:].isalpha():
            current = sections.setdefault(line[1:], [])
        elif current is not None and line.strip():
            current.append(line.strip())
    try:
        nproc = int(sections["nproc"][0])
        memory = int(sections["memory"][0].split()[1]) * 1024  # MemTotal: N kB
    except (KeyError, IndexError, ValueError):
        raise ValueError(f"the probe's answer is not understood: {text[-500:]!r}") from None
    allowed = sections.get("cpus") or []
    cpus = parse_cpu_list(allowed[0].split(":", 1)[1]) if allowed else tuple(range(nproc))
    gpus = _table(sections.get("gpus", []), 4, "nvidia-smi --query-gpu")
    apps = _table(sections.get("apps", []), 4, "nvidia-smi --query-compute-apps")
    try:
        devices = tuple(Gpu(int(i), uuid, name, int(float(mib))) for i, name, mib, uuid in gpus)
        procs = tuple(GpuProcess(uuid, int(pid), name, _mib(mib)) for uuid, pid, name, mib in apps)
    except ValueError:
        raise ValueError(f"nvidia-smi's answer is not understood: {text[-500:]!r}") from None
    return HostFacts(cpus, memory, tuple(sorted(devices, key=lambda g: g.index)), procs)


def _table(lines: list[str], width: int, what: str) -> list[list[str]]:
    failed = [line for line in lines if line.startswith("@failed")]
    if failed:
        said = " ".join(line for line in lines if not line.startswith("@failed"))
        if _NO_DEVICES in said:
            return []
        raise ValueError(f"{what} failed (exit status {failed[0].split()[-1]}): {said or 'no output'}")
    rows = [[cell.strip() for cell in row] for row in csv.reader(lines, skipinitialspace=True)]
    bad = [row for row in rows if len(row) != width]
    if bad:
        raise ValueError(f"{what} answered {', '.join(bad[0])!r}, not {width} fields")
    return rows


def _mib(text: str) -> int:
    return int(float(text)) if text.replace(".", "", 1).isdigit() else 0  # "[N/A]" on some drivers


def left_script(run_id: str) -> str:
    """Shell: the processes of run ``run_id`` alive on this host, one ``PID COMMAND`` a line.

    A process of a run carries its marker (``TLAUNCH_RUN_ID=<run id>`` in its
    environment, which everything it starts inherits, whatever its command
    line); only those in this host's network namespace count (test hosts share
    a process table), and zombies do not. Reading other users' environments
    needs root, or the jobs' own user.
    """
    marker = shlex.quote(f"{MARKER}={run_id}")
    return (
        f"M={marker}; me=$(readlink /proc/$$/ns/net); "
        'for f in $(grep -lzxF "$M" /proc/[0-9]*/environ 2>/dev/null); do '
        'd=${f%/environ}; p=${d#/proc/}; [ "$p" = "$$" ] && continue; '
        '[ "$(readlink "$d/ns/net" 2>/dev/null)" = "$me" ] || continue; '
        "grep -q '^State:[[:space:]]*Z' \"$d/status\" 2>/dev/null && continue; "
        "echo \"$p $(tr '\\000' ' ' < \"$d/cmdline\" 2>/dev/null | cut -c1-200)\"; done; true"
    )


def parse_apps(text: str) -> tuple[GpuProcess, ...] | None:
    """The GPU processes of an ``nvidia-smi --query-compute-apps`` section (None: no ``nvidia-smi``).

    Raises:
        ValueError: ``nvidia-smi`` failed, or answered something else.
    """
    if "@apps" not in text.splitlines():
        return None
    lines = [line.strip() for line in text.split("@apps", 1)[1].splitlines() if line.strip()]
    rows = _table(lines, 4, "nvidia-smi --query-compute-apps")
    try:
        return tuple(GpuProcess(uuid, int(pid), name, _mib(mib)) for uuid, pid, name, mib in rows)
    except ValueError:
        raise ValueError(f"nvidia-smi's answer is not understood: {text[-500:]!r}") from None


_APPS = """\
if command -v nvidia-smi >/dev/null 2>&1; then
  echo @apps
  nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits 2>&1 \\
    || echo "@failed $?"
fi
"""


class Prober:
    """Probes hosts over SSH, a connection per host kept open between probes; thread-safe.

    Args:
        ssh_config: the ssh config that names the hosts (None: ``~/.ssh/config``).
        timeout: seconds to connect to a host, and for its probe to answer.
    """

    def __init__(self, ssh_config: str | None = None, timeout: float = 10.0) -> None:
        self.ssh_config = ssh_config
        self.timeout = timeout
        self._conns: dict[str, Connection] = {}
        self._connecting: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _conn(self, host: str) -> Connection:
        with self._lock:
            if self._closed:
                raise SSHError(host, "the prober is closed")
            conn = self._conns.get(host)
            connecting = self._connecting.setdefault(host, threading.Lock())
        if conn is not None:
            return conn
        with connecting:  # one connection per host, however many ask at once
            with self._lock:
                conn = self._conns.get(host)
            if conn is not None:
                return conn
            conn = Connection(ConfigFile(self.ssh_config).target(host), timeout=self.timeout)
            with self._lock:
                if self._closed:
                    conn.close()
                    raise SSHError(host, "the prober is closed")
                self._conns[host] = conn
            return conn

    def _forget(self, host: str, conn: Connection) -> None:
        with self._lock:
            if self._conns.get(host) is conn:
                del self._conns[host]
        conn.close()

    def run(self, host: str, command: str, timeout: float | None = None, what: str | None = None) -> str:
        """Run ``command`` (a shell line) on ``host``; its stdout.

        Args:
            what: the command's name in errors (default: the command).

        Raises:
            SSHError: the host did not answer, or the command failed (a broken
                connection is dropped: the next call connects again).
        """
        conn = self._conn(host)
        argv = ["sh", "-c", command]
        try:
            return conn.run(argv, timeout=timeout or self.timeout).stdout
        except SSHError as exc:
            self._forget(host, conn)
            if what is None:
                raise
            said = str(exc).removeprefix(f"{host}: ").replace(repr(argv), what)
            raise SSHError(host, said) from exc

    def probe(self, hosts: Sequence[str]) -> dict[str, HostFacts | str]:
        """Every host's facts, or the reason it gave none (in parallel)."""

        def one(host: str) -> HostFacts | str:
            try:
                return parse_probe(self.run(host, PROBE, what="the probe"))
            except SSHError as exc:
                return str(exc).removeprefix(f"{host}: ")
            except ValueError as exc:
                return str(exc)

        found = pmap(one, list(hosts))
        return {h: f"probe failed: {r!r}" if isinstance(r, BaseException) else r for h, r in found.items()}

    def left_of(self, host: str, run_id: str) -> list[str]:
        """The processes of run ``run_id`` alive on ``host`` (``PID COMMAND`` each; :func:`left_script`).

        Raises:
            SSHError: the host did not answer.
        """
        said = self.run(host, left_script(run_id), what="the check for the run's processes")
        return [line.strip() for line in said.splitlines() if line.strip()]

    def after(self, host: str, run_id: str) -> tuple[list[str], tuple[GpuProcess, ...] | None]:
        """What of run ``run_id`` is left on ``host``; once nothing is, the processes on its GPUs
        (None while something is left, or on a host without ``nvidia-smi``). One command.

        Raises:
            SSHError: the host did not answer.
            ValueError: ``nvidia-smi`` failed.
        """
        script = f'L=$({left_script(run_id)}); if [ -n "$L" ]; then echo "$L"; exit 0; fi\n{_APPS}'
        said = self.run(host, script, what="the check for the run's processes")
        if "@apps" in said.splitlines():
            return [], parse_apps(said)
        return [line.strip() for line in said.splitlines() if line.strip()], None

    def close(self) -> None:
        """Close every connection; later calls fail."""
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.close()
