"""Large buffers between processes of one host travel through /dev/shm, leaving nothing there."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

from tlaunch.rpc import RPCClient, RPCServer, RunKeys, shm, wire
from tlaunch.rpc.client import fixed_resolver
from tlaunch.rpc.framing import Connection, connect

pytestmark = pytest.mark.skipif(shm.host_key() is None, reason="no usable /dev/shm on this machine")


def ours() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"tlaunch-{os.getpid()}-")}


class Echo:
    def echo(self, x: object) -> object:
        return x


KEYS = RunKeys.generate()


@pytest.fixture
def pair() -> Iterator[tuple[RPCServer, RPCClient]]:
    server = RPCServer(Echo(), KEYS)
    client = RPCClient("echo/0", KEYS, fixed_resolver(server.address))
    yield server, client
    client.close()
    server.close()


def test_large_buffers_go_through_shared_memory_and_are_removed(pair: tuple[RPCServer, RPCClient]) -> None:
    server, client = pair
    conn = connect(server.address, KEYS.context(server=False), 5.0)
    assert conn.shm  # same host, same user: the greeting agreed
    conn.close()
    arr = np.random.default_rng(0).standard_normal(1 << 20)  # 8 MiB
    blob = os.urandom(3 << 20)
    before = set(os.listdir("/dev/shm"))
    back = client.echo({"arr": arr, "blob": blob})
    assert np.array_equal(back["arr"], arr) and back["arr"].flags.writeable
    back["arr"][:] = 0  # a private mapping: the caller's own, nothing else changes
    assert type(back["blob"]) is bytes and back["blob"] == blob
    futures = [client.futures.echo(arr) for _ in range(4)]
    assert all(np.array_equal(f.result(10), arr) for f in futures)
    assert set(os.listdir("/dev/shm")) <= before  # every receiver removed what it took


def _raw_client(keys: RunKeys, address: str) -> ssl.SSLSocket:
    host, _, port = address.rpartition(":")
    raw = socket.create_connection((host, int(port)))
    return keys.context(server=False).wrap_socket(raw)


def test_a_forged_shared_name_is_refused_and_reads_nothing(pair: tuple[RPCServer, RPCClient]) -> None:
    server, client = pair
    keys = KEYS
    for name in (b"../../etc/passwd", b"tlaunch-1-" + b"0" * 32, b"tlaunch-x-zz"):
        sock = _raw_client(keys, server.address)
        conn = Connection(sock, server.address)
        conn.send(wire.HELLO, 0, [shm.host_key() or b""])
        assert conn.recv()[0] == wire.HELLO
        # A request whose only large buffer claims to be in shared memory under a forged name.
        head = b"TL" + bytes([1, wire.REQUEST]) + (7).to_bytes(8, "big") + (3).to_bytes(4, "big")
        pickle_part = wire.dumps(("echo", (b"",), {}))[0]
        sizes = [len(pickle_part), 4, (1 << 20) | (1 << 63)]
        body = head + b"".join(n.to_bytes(8, "big") for n in sizes) + pickle_part + (1).to_bytes(4, "big")
        sock.sendall(body + name.ljust(shm.NAME_SIZE, b"\0"))
        assert sock.recv(1) == b""  # the server dropped the connection
        sock.close()
    assert client.echo("still serving") == "still serving"


def test_untaken_buffers_are_removed_when_the_connection_closes(pair: tuple[RPCServer, RPCClient]) -> None:
    server, _ = pair
    conn = connect(server.address, KEYS.context(server=False), 5.0)
    assert conn.shm
    conn.send(wire.REQUEST, 1, wire.dumps(("echo", (np.ones(1 << 18),), {})))  # 2 MiB, reply never read
    time.sleep(0.2)
    conn.close()
    deadline = time.monotonic() + 5
    while ours():
        assert time.monotonic() < deadline, ours()
        time.sleep(0.05)


def test_sweep_removes_files_of_dead_senders(tmp_path: object) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    path = f"/dev/shm/tlaunch-{pid}-{'ab' * 16}"
    live = f"/dev/shm/tlaunch-{os.getpid()}-{'cd' * 16}"
    for p in (path, live):
        with open(p, "wb") as f:
            f.write(b"x")
    try:
        assert shm.sweep(min_age=0.0) >= 1
        assert not os.path.exists(path) and os.path.exists(live)
    finally:
        for p in (path, live):
            if os.path.exists(p):
                os.unlink(p)
