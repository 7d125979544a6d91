"""A real SLURM cluster on this machine, for tests: one slurmctld, a slurmd per SSH test host.

::

    with SlurmTestCluster(2) as cluster:
        subprocess.run(["srun", "-N2", "hostname"], env=cluster.env)   # th1, th2

Debian's SLURM 22.05 (``slurmctld``, ``slurmd``, ``slurm-client``, ``munge``):
the nodes are :class:`~tlaunch.testing.hosts.SSHTestHosts` (network and UTS
namespaces, their own sshd, home and /tmp); each runs a ``slurmd`` entered
with ``nsenter --net`` plus ``unshare --uts --mount`` (``ip netns exec``
remounts ``/sys`` and slurmd then dies on cgroups). The controller runs here,
on the bridge's address; a ``munged`` with a key made for this cluster, and
its own socket, authenticates them. Each node has ``gpus_per_node`` fake GPUs
(character devices made with ``mknod``) as GRES, so ``--gpus-per-node`` sets
``CUDA_VISIBLE_DEVICES``. Clients (``srun``, ``sbatch``, ``sinfo``...) use
:attr:`SlurmTestCluster.env` (``SLURM_CONF``). Everything it started is
stopped by pid on exit; the state folder goes.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

from tlaunch.testing.hosts import SSHTestHosts, down_on_failure, hosts_unavailable, shm_dir

__all__ = ["SlurmTestCluster", "slurm_unavailable"]

_DAEMONS = ("slurmctld", "slurmd", "munged", "srun", "sinfo", "scontrol")


def slurm_unavailable() -> str | None:
    """Why a test cluster cannot be made here (None: it can)."""
    reason = hosts_unavailable()
    if reason:
        return reason
    missing = [d for d in _DAEMONS if shutil.which(d) is None and not os.path.exists(f"/usr/sbin/{d}")]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurmctld slurmd slurm-client munge)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class SlurmTestCluster:
    """``n`` SLURM nodes (``th1``...) in partition ``debug``; a context manager.

    Attributes:
        env: the environment for SLURM's commands (``SLURM_CONF``).
        hosts: the nodes as SSH test hosts (``hosts.ssh_config`` reaches them).
        state_dir: its configuration, logs and spool.
        shared_dir: a folder every node sees at the same path, as a cluster's shared
            home is (each node's ``/tmp`` is its own).
    """

    def __init__(
        self, n: int, gpus_per_node: int = 1, cpus_per_node: int = 2, also_expose: list[str] | None = None
    ) -> None:
        reason = slurm_unavailable()
        if reason:
            raise RuntimeError(reason)
        self.n = n
        self.gpus_per_node = gpus_per_node
        self.cpus_per_node = cpus_per_node
        self.hosts = SSHTestHosts(n, also_expose=also_expose)  # their sshd sees what slurmd sees
        # Seen by the nodes although under this machine's /tmp: the hosts' (this Python),
        # the current directory (a checkout the tests run from), and ``also_expose``.
        paths = [*self.hosts.expose, os.getcwd(), *(also_expose or [])]
        self.expose = sorted({os.path.realpath(p) for p in paths})
        self.state_dir = tempfile.mkdtemp(prefix="tlaunch-slurm-", dir="/var/tmp")
        self.conf = os.path.join(self.state_dir, "slurm.conf")
        self.shared_dir = os.path.join(self.state_dir, "shared")
        os.makedirs(self.shared_dir, mode=0o700)
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> SlurmTestCluster:
        self.hosts.__enter__()
        with down_on_failure(self.down):
            self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    @property
    def nodes(self) -> list[str]:
        """The node names."""
        return [h.name for h in self.hosts.hosts]

    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        with open(os.path.join(self.state_dir, log), "wb") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self._procs.append(proc)
        return proc

    def up(self, timeout: float = 30.0) -> None:
        """Start munged, slurmctld and every slurmd; return once every node is idle."""
        s = self.state_dir
        key = os.path.join(s, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        sock = os.path.join(s, "munge.sock")
        self._spawn(
            ["munged", "-F", "--force", f"--key-file={key}", f"--socket={sock}", f"--pid-file={s}/munged.pid",
             f"--log-file={s}/munged.log", f"--seed-file={s}/munged.seed"],
            "munged.out",
        )  # fmt: skip
        self._wait(lambda: os.path.exists(sock), timeout, "munged did not make its socket")
        self._write_config(sock)
        self._spawn(["slurmctld", "-D", "-i", "-f", self.conf], "slurmctld.out")
        for host in self.hosts.hosts:
            # The node's own /tmp and /dev/shm (the test host's), as on a cluster; home and /work stay shared,
            # and what lives under this machine's /tmp but must be seen (this Python, a checkout
            # there) is mounted back, as a cluster's shared filesystem would show it.
            tmp = os.path.join(os.path.dirname(host.home), "tmp")
            hidden = [p for p in self.expose if p.startswith("/tmp/")]
            stash = [os.path.join(self.state_dir, "expose", host.name, str(k)) for k in range(len(hidden))]
            steps = [f"hostname {host.name}"]
            for path, aside in zip(hidden, stash, strict=True):
                os.makedirs(aside)
                steps.append(f"mount --bind {shlex.quote(path)} {shlex.quote(aside)}")
            steps.append(f"mount --bind {shlex.quote(tmp)} /tmp")
            steps.append(f"mount --bind {shlex.quote(shm_dir(host))} /dev/shm")  # the host's own
            for path, aside in zip(hidden, stash, strict=True):
                steps += [
                    f"mkdir -p {shlex.quote(path)}",
                    f"mount --bind {shlex.quote(aside)} {shlex.quote(path)}",
                ]
            script = " && ".join([*steps, f"exec slurmd -D -N {host.name} -f {self.conf}"])
            argv = [
                "nsenter",
                f"--net=/run/netns/{host.netns}",
                "unshare",
                "--uts",
                "--mount",
                "sh",
                "-c",
                script,
            ]
            self._spawn(argv, f"slurmd-{host.name}.out")
        self._wait(self._all_idle, timeout, "the SLURM nodes did not become idle")

    def _write_config(self, sock: str) -> None:
        s = self.state_dir
        bridge = (self.hosts._bridge_addr or "").split("/")[0]
        short = socket.gethostname().split(".")[0]
        os.makedirs(os.path.join(s, "state"))
        lines = [
            "ClusterName=tlaunchtest",
            f"SlurmctldHost={short}({bridge})",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={sock}",
            "CredType=cred/munge",
            f"StateSaveLocation={s}/state",
            f"SlurmdSpoolDir={s}/spool/%n",
            f"SlurmctldPidFile={s}/slurmctld.pid",
            f"SlurmdPidFile={s}/slurmd-%n.pid",
            f"SlurmctldLogFile={s}/slurmctld.log",
            f"SlurmdLogFile={s}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SelectType=select/cons_tres",
            "GresTypes=gpu",
            "MinJobAge=300",
        ]
        gres = []
        for host in self.hosts.hosts:
            os.makedirs(os.path.join(s, "spool", host.name))
            files = []
            for g in range(self.gpus_per_node):
                dev = os.path.join(s, f"nvidia-{host.name}-{g}")
                subprocess.run(["mknod", dev, "c", "195", str(g)], check=True, capture_output=True)
                files.append(dev)
            gpus = f" Gres=gpu:{self.gpus_per_node}" if self.gpus_per_node else ""
            lines.append(
                f"NodeName={host.name} NodeAddr={host.address} CPUs={self.cpus_per_node} RealMemory=1000"
                f"{gpus} State=UNKNOWN"
            )
            gres += [f"NodeName={host.name} Name=gpu File={f}" for f in files]
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(s, "gres.conf"), "w") as f:
            f.write("\n".join(gres) + "\n")

    def open_to_users(self) -> str:
        """Let every local account submit to the cluster and use its shared folder (as on a cluster
        whose users are accounts of its login node): its state folder may be passed through, its
        configuration read (``munge.key`` stays root's); a folder in ``shared_dir`` every account can
        pass through (not list), which this returns."""
        os.chmod(self.state_dir, 0o711)
        for conf in ("slurm.conf", "gres.conf"):
            os.chmod(os.path.join(self.state_dir, conf), 0o644)
        os.chmod(self.shared_dir, 0o711)
        folder = tempfile.mkdtemp(prefix="users-", dir=self.shared_dir)
        os.chmod(folder, 0o711)
        return folder

    def _all_idle(self) -> bool:
        argv = ["sinfo", "-h", "-o", "%T %D"]
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True, check=False)
        return out.stdout.split() == ["idle", str(self.n)]

    def _wait(self, ok: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            dead = [p.args for p in self._procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = ""
                for name in sorted(os.listdir(self.state_dir)):
                    if name.endswith((".log", ".out")):
                        with open(os.path.join(self.state_dir, name), errors="replace") as f:
                            logs += f"\n== {name}\n{f.read()[-1500:]}"
                raise RuntimeError(f"{what} (exited: {dead}); the logs:{logs}")
            time.sleep(0.1)

    def down(self) -> None:
        """End the cluster's jobs, stop every daemon it started (by pid), take the nodes down."""
        if any(p.poll() is None for p in self._procs):
            subprocess.run(
                ["scancel", "--full", "--user", "root"],
                env=self.env,
                capture_output=True,
                timeout=30,
                check=False,
            )
        for proc in reversed(self._procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._procs.clear()
        self.hosts.__exit__(None, None, None)
        shutil.rmtree(self.state_dir, ignore_errors=True)
