"""SSH test hosts on one machine: network namespaces, each with its own sshd.

Each host ``thN`` is a network namespace (address ``198.18.X.(10+N)`` on a
bridge of its instance's own; each instance takes a /24 of 198.18.0.0/16, chosen
under a lock, so several instances, in several processes, run side by side;
more than 240 hosts take a /22, four /24s, 240 hosts in each)
whose sshd runs in its own
UTS and mount namespaces: its own hostname,
its own host key, key-only auth, and a private home (so ``~/.tlaunch`` written on
one host is invisible on another), ``/tmp`` (so each has its own tmux
server) and ``/dev/shm`` (so, as between real machines, processes of two hosts
cannot pass each other sealed memory files: their buffers travel over TLS).
An ssh config with the aliases ``th1..thN`` and a known_hosts file with
the real host keys are written to the state directory. Needs root; everything
it starts is stopped by pid, and only what it created is removed.

    with SSHTestHosts(3) as hosts:
        print(hosts.ssh_config)    # ssh -F <that> th1 hostname  ->  th1
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tlaunch.testing.leftovers import kill_in_namespace, leftovers_on, namespace_processes

__all__ = ["SSHTestHost", "SSHTestHosts", "hosts_unavailable"]

NETWORK = "198.18"  # 198.18.0.0/15 is set aside for benchmarking; each instance takes a /24 (or a /22)
_PER_24 = 240  # hosts .10 to .249 of each /24
MAX_HOSTS = 4 * _PER_24
_LOCK = "/run/tlaunch-testhosts.lock"  # held while an instance picks its /24


def _python_paths() -> list[str]:
    paths = {sys.prefix, sys.base_prefix}
    paths.update(p for p in sys.path if p and os.path.isdir(p) and not p.startswith(tuple(paths)))
    # Exposing a whole /tmp or home would undo the hosts' isolation (a script run from /tmp).
    private = {"/", "/tmp", "/root", os.path.expanduser("~")}
    return [p for p in paths if os.path.abspath(p) not in private]


def _raise_terminated(signum: int, frame: object) -> None:
    raise SystemExit(f"terminated by signal {signum}")


@contextlib.contextmanager
def down_on_failure(down: Callable[[], None]) -> Iterator[None]:
    """Bring something up in the block; if anything fails (a Ctrl-C too), take down what was made."""
    try:
        yield
    except BaseException:
        down()
        raise


def hosts_unavailable() -> str | None:
    """Why test hosts cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces, a bridge, sshd)"
    for tool in ("ip", "unshare", "nsenter", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"test hosts need {tool!r} (apt-get install iproute2 util-linux openssh-client)"
    if not os.path.exists("/usr/sbin/sshd"):
        return "test hosts need sshd (apt-get install openssh-server)"
    return None


@dataclass(frozen=True)
class SSHTestHost:
    """One test host."""

    name: str
    address: str
    netns: str
    home: str
    sshd_pid: int


_LIVE_SHM: list[str] = []  # the /dev/shm of each test host up in this process


def shm_dir(host: SSHTestHost) -> str:
    """Where ``host``'s private ``/dev/shm`` lives on this machine."""
    return os.path.join(os.path.dirname(host.home), "shm")


def live_shm_dirs() -> list[str]:
    """The private ``/dev/shm`` folders of the test hosts up in this process (a test's
    check that no buffer outlives it looks there too)."""
    return list(_LIVE_SHM)


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


class SSHTestHosts:
    """``n`` SSH test hosts; a context manager that takes down only what it made."""

    def __init__(
        self,
        n: int,
        state_dir: str | None = None,
        expose: list[str] | None = None,
        also_expose: list[str] | None = None,
    ) -> None:
        if not 1 <= n <= MAX_HOSTS:
            raise ValueError(f"n={n}: between 1 and {MAX_HOSTS} test hosts can be made")
        reason = hosts_unavailable()
        if reason:
            raise RuntimeError(reason)
        self.n = n
        # Paths every host sees as on this machine although they live under the
        # private /root or /tmp: by default this Python (the hosts "have it installed").
        # ``also_expose`` adds to them (another interpreter, a checkout under /tmp).
        paths = [*(expose if expose is not None else _python_paths()), *(also_expose or [])]
        self.expose = sorted({os.path.realpath(p) for p in paths})
        # Not under /tmp: every host mounts a private /tmp over it.
        self.state_dir = state_dir or tempfile.mkdtemp(prefix="tlaunch-testhosts-", dir="/var/tmp")
        self.hosts: list[SSHTestHost] = []
        self._made_bridge = False
        self._bridge_addr: str | None = None
        self._markers: list[str] = []  # the bridge's addresses in the other /24s of a /22
        self.subnet = ""  # the first /24's first three octets
        self._prefix = 24 if n <= _PER_24 else 22
        self._token = secrets.token_hex(3)
        self.bridge = ""
        self._previous_term: Any = None
        self._netns: list[str] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self.ssh_config = os.path.join(self.state_dir, "ssh_config")
        self.known_hosts = os.path.join(self.state_dir, "known_hosts")
        self.client_key = os.path.join(self.state_dir, "id_ed25519")

    # -- up -------------------------------------------------------------
    def __enter__(self) -> SSHTestHosts:
        # A SIGTERM to the owner (a `timeout`, a CI cancel) must still take the hosts down.
        self._previous_term = None
        if threading.current_thread() is threading.main_thread():
            self._previous_term = signal.signal(signal.SIGTERM, _raise_terminated)
        with down_on_failure(self.down):
            self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.down()
        finally:
            if self._previous_term is not None:
                signal.signal(signal.SIGTERM, self._previous_term)

    def up(self) -> None:
        """Bring every host up; returns once each sshd accepts connections."""
        os.chmod(self.state_dir, 0o700)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tlaunch-tests", "-f", self.client_key)
        # A bridge per instance: one instance's teardown never touches another's hosts.
        self.bridge = f"tlbr{self._token}"
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._made_bridge = True
        _run("ip", "link", "set", self.bridge, "up")
        with open(_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed: after the address is on the bridge
            used = subprocess.run(
                ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
            ).stdout
            taken = {int(x) for x in re.findall(rf"inet {re.escape(NETWORK)}\.(\d+)\.", used)}
            width = 1 << (24 - self._prefix)  # /24s: 1, or 4 (aligned) for a /22
            free = [x for x in range(0, 256, width) if not taken & set(range(x, x + width))]
            if not free:
                raise RuntimeError(f"no free /{self._prefix} of {NETWORK}.0.0/16 on this machine")
            self.subnet = f"{NETWORK}.{free[0]}"
            self._bridge_addr = f"{self.subnet}.1/{self._prefix}"
            _run("ip", "addr", "add", self._bridge_addr, "dev", self.bridge)
            # Each /24 of a /22 shows as taken to other instances (which read the bridges' addresses).
            for k in range(1, width):
                marker = f"{NETWORK}.{free[0] + k}.1/32"
                _run("ip", "addr", "add", marker, "dev", self.bridge)
                self._markers.append(marker)
        # Hosts made here before (another instance, taken down) left neighbour entries for
        # these addresses: the kernel would keep sending to their old MACs, without asking
        # again, for as long as an entry stays REACHABLE (up to ~45 s): forget them.
        self._flush_neighbours()
        known, config = [], []
        for i in range(1, self.n + 1):
            host = self._make_host(i)
            self.hosts.append(host)
            _LIVE_SHM.append(shm_dir(host))
            with open(os.path.join(self.state_dir, host.name, "ssh_host_ed25519_key.pub")) as f:
                kind, key = f.read().split()[:2]
            known.append(f"{host.name},{host.address} {kind} {key}")
            config.append(
                f"Host {host.name}\n  HostName {host.address}\n  User root\n"
                f"  IdentityFile {self.client_key}\n  IdentitiesOnly yes\n"
                f"  UserKnownHostsFile {self.known_hosts}\n  StrictHostKeyChecking yes\n"
            )
        with open(self.known_hosts, "w") as f:
            f.write("\n".join(known) + "\n")
        with open(self.ssh_config, "w") as f:
            f.write("\n".join(config))
        for host in self.hosts:
            self._wait_ssh(host)

    def _make_host(self, i: int) -> SSHTestHost:
        name = f"th{i}"
        netns = f"tlaunch-{self._token}-{name}"
        address = self.address_of(i)
        veth = f"tlv{self._token}x{i}"
        _run("ip", "netns", "add", netns)
        self._netns.append(netns)
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _run("ip", "link", "set", veth, "master", self.bridge, "up")
        _run("ip", "-n", netns, "addr", "add", f"{address}/{self._prefix}", "dev", "eth0")
        _run("ip", "-n", netns, "link", "set", "eth0", "up")
        _run("ip", "-n", netns, "link", "set", "lo", "up")
        d = os.path.join(self.state_dir, name)
        home = os.path.join(d, "home")
        os.makedirs(os.path.join(home, ".ssh"), mode=0o700)
        for private in ("tmp", "shm"):
            os.makedirs(os.path.join(d, private))
            os.chmod(os.path.join(d, private), 0o1777)
        shutil.copy(self.client_key + ".pub", os.path.join(home, ".ssh", "authorized_keys"))
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(d, "ssh_host_ed25519_key"))
        cfg = os.path.join(d, "sshd_config")
        with open(cfg, "w") as f:
            f.write(
                f"ListenAddress {address}\nPort 22\nHostKey {d}/ssh_host_ed25519_key\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                "PermitRootLogin prohibit-password\nPubkeyAuthentication yes\n"
                "AuthorizedKeysFile .ssh/authorized_keys\nUsePAM no\nStrictModes no\n"
                "PidFile none\nMaxStartups 1000\nMaxSessions 200\nLogLevel ERROR\n"
                "AcceptEnv TLAUNCH_*\nSubsystem sftp internal-sftp\n"
            )
        os.makedirs("/run/sshd", exist_ok=True)
        hidden = [p for p in self.expose if p.startswith(("/root/", "/tmp/")) or p in ("/root", "/tmp")]
        stash = [os.path.join(d, "expose", str(k)) for k in range(len(hidden))]
        for s in stash:
            os.makedirs(s)
        steps = [
            f"mount --bind {shlex.quote(p)} {shlex.quote(s)}" for p, s in zip(hidden, stash, strict=True)
        ]
        steps += [f"mount --bind {home} /root", f"mount --bind {d}/tmp /tmp"]
        steps += [f"mount --bind {d}/shm /dev/shm"]
        for p, s in zip(hidden, stash, strict=True):
            steps += [f"mkdir -p {shlex.quote(p)}", f"mount --bind {shlex.quote(s)} {shlex.quote(p)}"]
        steps += [f"hostname {name}", f"exec /usr/sbin/sshd -D -e -f {cfg}"]
        script = " && ".join(steps)
        with open(os.path.join(d, "sshd.log"), "wb") as log:
            argv = ["nsenter", f"--net=/run/netns/{netns}", "unshare", "--uts", "--mount", "--propagation",
                    "private", "sh", "-c", script]  # fmt: skip
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True
            )
        self._procs.append(proc)
        return SSHTestHost(name, address, netns, home, proc.pid)

    @property
    def bridge_address(self) -> str:
        """This machine's address on the hosts' network: where a host reaches it."""
        if self._bridge_addr is None:
            raise RuntimeError("the test hosts are not up")
        return self._bridge_addr.split("/")[0]

    def address_of(self, i: int) -> str:
        """Host ``thi``'s address: ``.10`` to ``.249`` of the instance's first /24, then of the next."""
        block, offset = divmod(i - 1, _PER_24)
        first = int(self.subnet.rsplit(".", 1)[1])
        return f"{NETWORK}.{first + block}.{10 + offset}"

    def _wait_ssh(self, host: SSHTestHost, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        proc = self._procs[self.hosts.index(host)]
        while True:
            try:
                with socket.create_connection((host.address, 22), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                pass
            code = proc.poll()
            if code is not None or time.monotonic() > deadline:
                log = os.path.join(self.state_dir, host.name, "sshd.log")
                with open(log, errors="replace") as f:
                    said = f.read()[-2000:].strip() or "(nothing)"
                why = f"exited with code {code}" if code is not None else f"not up after {timeout:.0f} s"
                raise RuntimeError(f"sshd of {host.name} at {host.address} {why}; {log} says: {said}")
            time.sleep(0.05)

    def _flush_neighbours(self) -> None:
        """Forget this machine's neighbour (ARP) entries for this instance's /24."""
        subprocess.run(
            ["ip", "neigh", "flush", "to", f"{self.subnet}.0/{self._prefix}", "dev", self.bridge],
            capture_output=True,
            check=False,
        )

    # -- faults ---------------------------------------------------------
    def set_link(self, name: str, up: bool) -> None:
        """Take host ``name``'s network link down (as if unplugged) or bring it back up."""
        index = [h.name for h in self.hosts].index(name) + 1
        _run("ip", "link", "set", f"tlv{self._token}x{index}", "up" if up else "down")

    def processes(self, name: str) -> dict[int, str]:
        """Host ``name``'s own processes (its network namespace's): pid -> command line. A check of
        what a test left looks here: ``ps`` on a host lists every process of this machine."""
        return namespace_processes(self._host(name).netns)

    def crash(self, name: str, needle: str) -> list[int]:
        """SIGKILL host ``name``'s processes whose command line holds ``needle`` (a run id); their pids."""
        return kill_in_namespace(self._host(name).netns, needle)

    def _host(self, name: str) -> SSHTestHost:
        return next(h for h in self.hosts if h.name == name)

    # -- checks ---------------------------------------------------------
    def leftovers(self, run_id: str) -> dict[str, list[str]]:
        """What of run ``run_id`` is left on each host: processes, tmux sessions, secret files.

        Logs, ``final.json`` and the run directory itself are expected to stay.
        """
        return leftovers_on([h.name for h in self.hosts], self.ssh_config, run_id)

    def wait_no_leftovers(self, run_id: str, timeout: float) -> dict[str, list[str]]:
        """Poll :meth:`leftovers` until empty or ``timeout``; returns the last answer."""
        deadline = time.monotonic() + timeout
        while (left := self.leftovers(run_id)) and time.monotonic() < deadline:
            time.sleep(0.25)
        return left

    # -- down -----------------------------------------------------------
    def down(self) -> None:
        """Stop every sshd (by pid) and remove what was made; idempotent."""
        _LIVE_SHM[:] = [d for d in _LIVE_SHM if d not in {shm_dir(h) for h in self.hosts}]
        for proc in self._procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self._procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        self._procs.clear()
        for netns in self._netns:
            # Whatever sessions started inside the host (tmux servers, nodes) dies with it.
            pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=False)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
        self._netns.clear()
        for marker in self._markers:
            argv = ["ip", "addr", "del", marker, "dev", self.bridge]
            subprocess.run(argv, capture_output=True, check=False)
        self._markers.clear()
        if self._bridge_addr is not None:
            subprocess.run(
                ["ip", "addr", "del", self._bridge_addr, "dev", self.bridge], capture_output=True, check=False
            )
            self._flush_neighbours()
            self._bridge_addr = None
        if self._made_bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
            self._made_bridge = False
        shutil.rmtree(self.state_dir, ignore_errors=True)
