"""Security on one machine: what a network peer without keys, a peer with keys and a local user can do.

The threat model is in ``docs/security.md``; SSH runs are in ``test_security_ssh.py``.
"""

from __future__ import annotations

import os
import pickle
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults_helpers import record

from tlaunch.rpc import RPCClient, RunKeys
from tlaunch.rpc.client import fixed_resolver

pytestmark = pytest.mark.faults

SERVER = """
import os, pickle, resource, sys, time
from tlaunch.rpc import RPCServer

class Service:
    def ping(self):
        return "pong"

keys = pickle.load(open(sys.argv[1], "rb"))
open_fds = len(os.listdir("/proc/self/fd"))
limit = open_fds + int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
server = RPCServer(Service(), keys)
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(server.address)
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
time.sleep(600)
"""


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[tuple[str, RunKeys, subprocess.Popen[bytes]]]:
    """An RPC server in a process of its own that can open only a few more descriptors."""
    keys = RunKeys.generate()
    (tmp_path / "keys").write_bytes(pickle.dumps(keys))
    script = tmp_path / "server.py"
    script.write_text(textwrap.dedent(SERVER))
    addr_file = tmp_path / "address"
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "keys"), str(addr_file), "24"])
    try:
        deadline = time.monotonic() + 30
        while not addr_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        yield addr_file.read_text(), keys, proc
    finally:
        proc.kill()
        proc.wait()


def call_ping(address: str, keys: RunKeys, timeout: float = 20.0) -> str:
    client = RPCClient(
        "svc/0", keys, fixed_resolver(address), resolve_timeout=timeout, default_timeout=timeout
    )
    try:
        return str(client.call("ping"))
    finally:
        client.close()


def test_a_keyless_flood_past_the_descriptor_limit_does_not_disable_the_server(server_process) -> None:  # type: ignore[no-untyped-def]
    """Keyless connections that exhaust the server's descriptors: once they go, it serves again.

    Before the fix the accept loop took EMFILE for "closed" and never accepted again.
    """
    address, keys, proc = server_process
    host, port = address.rsplit(":", 1)
    flood = []
    for _ in range(80):  # far past the 24 descriptors the server may still open
        try:
            flood.append(socket.create_connection((host, int(port)), timeout=2))
        except OSError:
            break
    time.sleep(1.0)  # the server hits its limit while these sit in their handshake
    for s in flood:
        s.close()
    assert proc.poll() is None
    t0 = time.monotonic()
    assert call_ping(address, keys) == "pong"
    served_after = time.monotonic() - t0
    assert served_after < 10
    record("keyless flood past the descriptor limit: serves again", None, served_after, {})


def test_a_keyless_flood_from_one_address_does_not_keep_others_out() -> None:
    """Unauthenticated handshakes are bounded per source address: a second address gets in at once."""
    from tlaunch.rpc import RPCServer
    from tlaunch.rpc.server import MAX_HANDSHAKES_PER_PEER

    class Service:
        def ping(self) -> str:
            return "pong"

    keys = RunKeys.generate()
    server = RPCServer(Service(), keys, bind_host="0.0.0.0", advertise_host="127.0.0.1")
    port = int(server.address.rsplit(":", 1)[1])
    flood = [
        socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(3 * MAX_HANDSHAKES_PER_PEER)
    ]
    try:
        time.sleep(0.5)
        assert server.rejected >= MAX_HANDSHAKES_PER_PEER  # the excess was closed at once
        t0 = time.monotonic()
        raw = socket.create_connection(("127.0.0.2", port), timeout=5, source_address=("127.0.0.2", 0))
        with keys.context(server=False).wrap_socket(raw) as tls:
            assert tls.version() == "TLSv1.3"
        admitted = time.monotonic() - t0
        assert admitted < 2
        record("keyless flood from one address: another gets in", None, admitted, {})
    finally:
        for s in flood:
            s.close()
        server.close()


def test_a_peer_without_keys_gets_no_handshake(server_process) -> None:  # type: ignore[no-untyped-def]
    address, keys, _ = server_process
    host, port = address.rsplit(":", 1)
    other = RunKeys.generate().context(server=False)
    with socket.create_connection((host, int(port)), timeout=5) as raw, pytest.raises(ssl.SSLError):
        with other.wrap_socket(raw) as tls:
            tls.recv(1)
    assert call_ping(address, keys) == "pong"


# -- a peer that holds the keys (defence in depth) ---------------------------------------


class Holder:
    def echo(self, x: object) -> object:
        return x

    def hold(self, a: object, seconds: float) -> float:
        time.sleep(seconds)
        return float(a.sum())  # type: ignore[attr-defined]


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


def _crafted(
    server_address: str, keys: RunKeys, sizes: list[int], body: bytes, hello: bool = True
) -> ssl.SSLSocket:
    """Send a request whose header announces buffers of ``sizes``, followed by ``body`` only."""
    from tlaunch.rpc import shm, wire

    host, _, port = server_address.rpartition(":")
    sock = keys.context(server=False).wrap_socket(socket.create_connection((host, int(port))))
    if hello:
        from tlaunch.rpc.framing import Connection

        conn = Connection(sock, server_address)
        conn.send(wire.HELLO, 0, [shm.host_key() or b""])
        assert conn.recv()[0] == wire.HELLO
    head = b"TL" + bytes([1, wire.REQUEST]) + (7).to_bytes(8, "big") + len(sizes).to_bytes(4, "big")
    sock.sendall(head + b"".join(n.to_bytes(8, "big") for n in sizes) + body)
    return sock


@pytest.fixture
def holder() -> Iterator[tuple[str, RPCClient]]:
    from tlaunch.rpc import RPCServer

    keys = RunKeys.generate()
    server = RPCServer(Holder(), keys)
    client = RPCClient("holder/0", keys, fixed_resolver(server.address))
    client.keys = keys  # type: ignore[attr-defined]
    yield server.address, client
    client.close()
    server.close()


def test_memory_is_committed_as_data_arrives_not_as_claimed(holder) -> None:  # type: ignore[no-untyped-def]
    from tlaunch.rpc import wire

    address, client = holder
    pickle_part = wire.dumps(("echo", (b"",), {}))[0]
    before = _rss()
    sock = _crafted(
        address, client.keys, [len(pickle_part), 4, 3 << 29], pickle_part + (1).to_bytes(4, "big") + bytes(20)
    )
    try:
        time.sleep(0.5)
        assert _rss() - before < 128 << 20  # a 1.5 GiB claim and 20 bytes: nowhere near 1.5 GiB
    finally:
        sock.close()
    assert client.echo("still serving") == "still serving"


@pytest.mark.parametrize("as_bytes", [False, True])
def test_a_claim_beyond_this_hosts_memory_is_refused(holder, as_bytes: bool) -> None:  # type: ignore[no-untyped-def]
    from tlaunch.rpc import wire

    address, client = holder
    pickle_part = wire.dumps(("echo", (b"",), {}))[0]
    counts = (0 if as_bytes else 1).to_bytes(4, "big")
    sock = _crafted(address, client.keys, [len(pickle_part), 4, 1 << 60], pickle_part + counts)
    try:
        sock.settimeout(5)
        assert sock.recv(1) == b""  # refused: the connection is closed, no thread died
    finally:
        sock.close()
    assert client.echo("still serving") == "still serving"


def _crafted_with_file(server_address: str, keys: RunKeys, fd: int, size: int) -> ssl.SSLSocket:
    """Send a request whose one large buffer is the descriptor ``fd`` (passed as a sealed file would be)."""
    from tlaunch.rpc import wire
    from tlaunch.rpc.opening import connect

    conn = connect(server_address, keys.context(server=False), 5.0)
    assert conn.fds is not None  # same host, same user: the Unix socket is joined
    pickle_part = wire.dumps(("echo", (b"",), {}))[0]
    head = b"TL" + bytes([1, wire.REQUEST]) + (7).to_bytes(8, "big") + (3).to_bytes(4, "big")
    sizes = [len(pickle_part), 4, size | (1 << 63)]
    socket.send_fds(conn.fds, [(7).to_bytes(8, "big") + (1).to_bytes(4, "big")], [fd])
    conn.sock.sendall(
        head + b"".join(n.to_bytes(8, "big") for n in sizes) + pickle_part + (1).to_bytes(4, "big")
    )
    conn.fds.close()
    return conn.sock


def _refused(sock: ssl.SSLSocket) -> bool:
    """Whether the server closed ``sock`` without a reply (a reset if it left bytes unread)."""
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_fifo_passed_as_a_shared_buffer_does_not_block_the_server(holder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    address, client = holder
    path = tmp_path / "fifo"
    os.mkfifo(path, 0o600)
    fd = os.open(path, os.O_RDWR)  # a read from it would block for ever
    try:
        sock = _crafted_with_file(address, client.keys, fd, 1 << 20)
        try:
            assert _refused(sock)  # at once, never read
        finally:
            sock.close()
    finally:
        os.close(fd)
    assert client.echo("still serving") == "still serving"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file of another user")
def test_another_users_file_passed_as_a_shared_buffer_is_refused_and_left_alone(
    holder, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    address, client = holder
    path = tmp_path / "theirs"
    path.write_bytes(bytes(1 << 20))
    os.chown(path, 65534, 65534)
    fd = os.open(path, os.O_RDONLY)
    try:
        sock = _crafted_with_file(address, client.keys, fd, 1 << 20)
        try:
            assert _refused(sock)  # not a sealed memory file
        finally:
            sock.close()
    finally:
        os.close(fd)
    assert path.exists() and path.read_bytes() == bytes(1 << 20)
    assert client.echo("still serving") == "still serving"


SHRINKER = """
import errno, os, pickle, sys, time
import numpy as np
from tlaunch.rpc import RPCClient, shm
from tlaunch.rpc.client import fixed_resolver

keys = pickle.load(open(sys.argv[1], "rb"))
held = []
seal = shm.seal
def keep_open(view):
    fds = seal(view)
    if fds is not None:
        held.extend(os.dup(fd) for fd in fds)
    return fds
shm.seal = keep_open
client = RPCClient("holder/0", keys, fixed_resolver(sys.argv[2]))
future = client.futures.hold(np.ones(16 << 20), 1.0)   # 128 MiB as sealed memory files
deadline = time.monotonic() + 30
while not held and time.monotonic() < deadline:        # sent (the receiver holds it for 1 s)
    time.sleep(0.01)
refused = []
for fd in held:                                      # change it under the receiver, if it can
    for change in (lambda: os.ftruncate(fd, 0), lambda: os.pwrite(fd, bytes(4096), 0)):
        try:
            change()
        except PermissionError:
            refused.append(True)
print(len(held), len(refused), future.result(30), flush=True)
"""


def test_a_sender_shrinking_its_shared_file_cannot_crash_the_receiver(tmp_path: Path) -> None:
    """The receiver maps a sealed file: its sender can neither shrink it (SIGBUS) nor write to it."""
    keys = RunKeys.generate()
    (tmp_path / "keys").write_bytes(pickle.dumps(keys))
    (tmp_path / "server.py").write_text(
        "import pickle, sys, time\nfrom tlaunch.rpc import RPCServer\nfrom test_security import Holder\n"
        "keys = pickle.load(open(sys.argv[1], 'rb'))\nserver = RPCServer(Holder(), keys)\n"
        "print(server.address, flush=True)\ntime.sleep(600)\n"
    )
    (tmp_path / "shrinker.py").write_text(SHRINKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.path.dirname(__file__)])}
    server = subprocess.Popen(
        [sys.executable, str(tmp_path / "server.py"), str(tmp_path / "keys")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None
        address = server.stdout.readline().strip()
        out = subprocess.run(
            [sys.executable, str(tmp_path / "shrinker.py"), str(tmp_path / "keys"), address],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert server.poll() is None, f"the receiver died (exit {server.returncode})"
        held, refused, total = out.stdout.split()
        assert int(held) >= 1 and int(refused) == 2 * int(held) and total == str(float(16 << 20)), out.stderr
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()


@pytest.mark.parametrize("from_memory", [True, False])
def test_the_run_key_is_loaded_without_a_file_left(
    from_memory: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Linux the key goes to OpenSSL through a memory file; elsewhere a 0600 file, removed at once."""
    import tempfile

    from tlaunch.rpc import security

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    if from_memory:
        monkeypatch.setattr(tempfile, "mkdtemp", lambda **_: pytest.fail("a key file was written"))
    else:
        monkeypatch.setattr(security, "_load_from_memory", lambda ctx, pem: False)
    keys = RunKeys.generate()
    server, client = keys._make_context(True), keys._make_context(False)
    a, b = socket.socketpair()
    with a, b:
        done: list[ssl.SSLSocket] = []
        t = threading.Thread(target=lambda: done.append(server.wrap_socket(a, server_side=True)))
        t.start()
        c = client.wrap_socket(b)
        t.join(10)
        try:
            assert done and c.version() == "TLSv1.3"  # each side proved it holds the run's key
        finally:
            c.close()
            for s in done:
                s.close()
    assert list(tmp_path.iterdir()) == []
