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
from tlaunch.ssh.config import ConfigFile
from tlaunch.ssh.connection import Connection
from tlaunch.ssh.fanout import pmap

__all__ = ["PROBE", "Prober", "parse_probe", "processes_with"]

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


def processes_with(ps_output: str, needle: str) -> list[str]:
    """The lines of ``ps -eo pid,args`` whose command holds ``needle`` (a run id), the ``ps`` itself aside."""
    return [
        line.strip()
        for line in ps_output.splitlines()[1:]
        if needle in line and "ps -eo" not in line and "ps -ww" not in line
    ]


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

    def left_of(self, host: str, needle: str) -> list[str]:
        """The processes of ``host`` whose command line holds ``needle`` (a run id).

        Raises:
            SSHError: the host did not answer.
        """
        ps = shlex.join(["ps", "-ww", "-eo", "pid,args"])
        return processes_with(self.run(host, ps, what="ps"), needle)

    def close(self) -> None:
        """Close every connection; later calls fail."""
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.close()
