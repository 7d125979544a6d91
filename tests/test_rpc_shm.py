"""Large buffers between processes of one host travel as sealed memory files, leaving nothing behind.

A peer holding the run's keys may send any descriptor in place of a sealed
file: the receiver refuses everything but a memory file of the announced size
sealed against writing and resizing, before anything of the message is
unpickled, and keeps serving.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from forking import in_forked_child

from tlaunch.rpc import RPCClient, RPCServer, RunKeys, fdpass, shm, wire
from tlaunch.rpc.client import fixed_resolver
from tlaunch.rpc.framing import Connection
from tlaunch.rpc.opening import connect

pytestmark = pytest.mark.skipif(shm.host_key() is None, reason="no memfd, sealing or /dev/shm here")

_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


class Echo:
    def __init__(self) -> None:
        self.calls = 0

    def echo(self, x: object) -> object:
        self.calls += 1
        return x

    def total(self, a: np.ndarray) -> float:
        return float(a.sum())


KEYS = RunKeys.generate()
UNPICKLED: list[str] = []


def _record(what: str) -> str:
    UNPICKLED.append(what)
    return what


class Marker:
    """Unpickling it leaves a trace: a refused message must never get that far."""

    def __reduce__(self) -> tuple[Callable[[str], str], tuple[str]]:
        return (_record, ("unpickled",))


@pytest.fixture
def pair() -> Iterator[tuple[RPCServer, RPCClient, Echo]]:
    target = Echo()
    server = RPCServer(target, KEYS)
    client = RPCClient("echo/0", KEYS, fixed_resolver(server.address))
    yield server, client, target
    client.close()
    server.close()


def _names() -> set[str]:
    """This process's names in /dev/shm (``tlaunch-<pid>-...``): other processes here make theirs."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"tlaunch-{os.getpid()}-")}


def test_large_buffers_go_as_sealed_files_and_leave_nothing(pair: tuple[RPCServer, RPCClient, Echo]) -> None:
    server, client, _ = pair
    conn = connect(server.address, KEYS.context(server=False), 5.0)
    assert conn.shm  # same host, same user: the greeting agreed, the Unix socket is joined
    conn.close()
    arr = np.random.default_rng(0).standard_normal(1 << 20)  # 8 MiB
    blob = os.urandom(3 << 20)
    before = _names()
    back = client.echo({"arr": arr, "blob": blob})
    assert np.array_equal(back["arr"], arr) and back["arr"].flags.writeable
    back["arr"][:] = 0  # a private mapping: the caller's own copy on write
    assert type(back["blob"]) is bytes and back["blob"] == blob
    futures = [client.futures.echo(arr) for _ in range(4)]
    assert all(np.array_equal(f.result(10), arr) for f in futures)
    assert _names() <= before  # no file by any name: the memory files have none


def test_the_rendezvous_is_private_and_goes_once_joined() -> None:
    rendezvous = fdpass.offer()
    assert rendezvous is not None
    try:
        st = os.stat(rendezvous.path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        joined = fdpass.join(rendezvous.name)
        assert joined is not None
        a, b = socket.socketpair()
        try:
            accepted = rendezvous.accept(a, buffered=False, timeout=5.0)
            assert accepted is not None
            accepted.close()
        finally:
            a.close()
            b.close()
        joined.close()
        assert not os.path.exists(rendezvous.path)
    finally:
        rendezvous.close()
    assert fdpass.join(b"../../etc/passwd") is None and fdpass.join(b"tlaunch-1-" + b"0" * 32) is None


def _crafted_request(conn: Connection, fds: list[int], size: int, files: int = 1) -> None:
    """Send ``echo(Marker(), <one shared buffer of size bytes in files files>)`` with ``fds``."""
    req_id = 7
    pickle_part, counts = wire.dumps(("echo", (Marker(), pickle.PickleBuffer(bytearray(size))), {}))[:2]
    head = b"TL" + bytes([1, wire.REQUEST]) + req_id.to_bytes(8, "big") + (3).to_bytes(4, "big")
    sizes = [len(pickle_part), len(counts), size | (1 << 63) | (files - 1) << 56]
    if conn.fds is not None and fds:
        socket.send_fds(conn.fds, [req_id.to_bytes(8, "big") + len(fds).to_bytes(4, "big")], fds)
    conn.sock.sendall(head + b"".join(n.to_bytes(8, "big") for n in sizes) + pickle_part + counts)


def _dropped(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` without a reply (a reset if it left bytes unread)."""
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _memfd(size: int, seals: int) -> int:
    fd = os.memfd_create("forged", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


SIZE = 1 << 20


def _forgeries(tmp: str) -> dict[str, Callable[[], list[int]]]:
    def regular_file() -> list[int]:
        path = os.path.join(tmp, "plain")
        with open(path, "wb") as f:
            f.write(bytes(SIZE))
        return [os.open(path, os.O_RDONLY)]

    def fifo() -> list[int]:
        path = os.path.join(tmp, "fifo")
        os.mkfifo(path)
        return [os.open(path, os.O_RDWR)]  # a read from it would block the server for ever

    return {
        "unsealed memfd": lambda: [_memfd(SIZE, 0)],
        "memfd sealed against resizing only": lambda: [_memfd(SIZE, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)],
        "memfd sealed against writing only": lambda: [_memfd(SIZE, fcntl.F_SEAL_WRITE)],
        "sealed memfd of another size": lambda: [_memfd(SIZE // 2, _SEALS)],
        "regular file": regular_file,
        "fifo": fifo,
        "a socket": lambda: [socket.socket().detach()],
        "two files for one buffer": lambda: [_memfd(SIZE, _SEALS), _memfd(SIZE, _SEALS)],
    }


def _pieces_forgeries() -> dict[str, Callable[[], list[int]]]:
    """Buffers announced as two files (SIZE bytes in all), whose files are wrong together."""
    return {
        "pieces adding up to less": lambda: [_memfd(SIZE // 2, _SEALS), _memfd(SIZE // 4, _SEALS)],
        "pieces adding up to more": lambda: [_memfd(SIZE, _SEALS), _memfd(SIZE, _SEALS)],
        "a first piece not whole pages": lambda: [
            _memfd(SIZE // 2 - 1, _SEALS),
            _memfd(SIZE // 2 + 1, _SEALS),
        ],
        "an empty first piece": lambda: [_memfd(0, _SEALS), _memfd(SIZE, _SEALS)],
        "a second piece unsealed": lambda: [_memfd(SIZE // 2, _SEALS), _memfd(SIZE // 2, 0)],
        "three files where two are announced": lambda: (
            [_memfd(SIZE // 2, _SEALS), _memfd(SIZE // 4, _SEALS), _memfd(SIZE // 4, _SEALS)]
        ),
    }


@pytest.mark.parametrize("forgery", list(_forgeries("/nonexistent")))
def test_a_forged_shared_buffer_is_refused_before_anything_is_unpickled(
    pair: tuple[RPCServer, RPCClient, Echo], tmp_path: object, forgery: str
) -> None:
    server, client, target = pair
    conn = connect(server.address, KEYS.context(server=False), 5.0)
    try:
        assert conn.fds is not None
        fds = _forgeries(str(tmp_path))[forgery]()
        try:
            _crafted_request(conn, fds, SIZE)
        finally:
            for fd in fds:
                os.close(fd)
        assert _dropped(conn.sock)  # the server dropped the connection, without a reply
    finally:
        conn.close()
    assert UNPICKLED == [] and target.calls == 0
    assert client.echo("still serving") == "still serving"


@pytest.mark.parametrize("forgery", list(_pieces_forgeries()))
def test_a_buffer_in_forged_pieces_is_refused_before_anything_is_unpickled(
    pair: tuple[RPCServer, RPCClient, Echo], forgery: str
) -> None:
    server, client, target = pair
    conn = connect(server.address, KEYS.context(server=False), 5.0)
    try:
        fds = _pieces_forgeries()[forgery]()
        try:
            _crafted_request(conn, fds, SIZE, files=2)
        finally:
            for fd in fds:
                os.close(fd)
        assert _dropped(conn.sock)
    finally:
        conn.close()
    assert UNPICKLED == [] and target.calls == 0
    assert client.echo("still serving") == "still serving"


def test_a_large_buffer_goes_in_pieces_mapped_side_by_side(
    pair: tuple[RPCServer, RPCClient, Echo], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A buffer cut into files (one per core) arrives as one writable array, forwarded whole."""
    _, client, _ = pair
    monkeypatch.setattr(shm, "_cores", lambda: 3)
    arr = np.arange(3 * shm.PIECE // 8 + 1000, dtype=np.float64)  # 3 pieces, the last not whole pages
    view = memoryview(arr).cast("B")
    fds = shm.seal(view)
    assert fds is not None and len(fds) == 3
    sizes = [os.fstat(fd).st_size for fd in fds]
    inodes = [os.fstat(fd).st_ino for fd in fds]
    assert sum(sizes) == arr.nbytes and all(s % os.sysconf("SC_PAGE_SIZE") == 0 for s in sizes[:2])
    got = np.frombuffer(shm.take(fds, arr.nbytes), dtype=np.float64)
    assert np.array_equal(got, arr)
    again = shm.seal(memoryview(got).cast("B"))  # unchanged: the same three files, passed on
    assert again is not None and len(again) == 3
    assert [os.fstat(fd).st_ino for fd in again] == inodes
    for fd in again:
        os.close(fd)
    got[len(got) // 2] = -1.0  # the caller's own, copy on write
    assert arr[len(arr) // 2] != -1.0
    back = client.echo(arr)  # through the connection: pieces there and back
    assert np.array_equal(back, arr) and back.flags.writeable


def test_a_shared_buffer_without_the_unix_socket_is_refused(pair: tuple[RPCServer, RPCClient, Echo]) -> None:
    """A client that greets but does not join the rendezvous gets no shared buffers."""
    server, client, target = pair
    host, _, port = server.address.rpartition(":")
    sock = KEYS.context(server=False).wrap_socket(socket.create_connection((host, int(port))))
    conn = Connection(sock, server.address)
    try:
        conn.send(wire.HELLO, 0, [shm.host_key() or b""])
        kind, _, answer = conn.recv()
        assert kind == wire.HELLO and len(answer) == 2  # offered, never joined
        conn.send(wire.REQUEST, 1, wire.dumps(("echo", ("plain",), {})))
        assert conn.recv()[2] and target.calls == 1  # the connection serves on, over TLS alone
        _crafted_request(conn, [], SIZE)
        assert _dropped(conn.sock)
    finally:
        conn.close()
    assert UNPICKLED == [] and target.calls == 1
    assert client.echo("still serving") == "still serving"


def test_a_sealed_buffer_cannot_be_changed_by_its_sender(pair: tuple[RPCServer, RPCClient, Echo]) -> None:
    arr = np.arange(1 << 18, dtype=np.float64)  # 2 MiB
    fds = shm.seal(memoryview(arr).cast("B"))
    assert fds is not None and len(fds) == 1
    (fd,) = fds
    try:
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"x", 0)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
        with pytest.raises(PermissionError):
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, 0)  # sealed against new seals too (F_SEAL_SEAL)
        view = shm.take([os.dup(fd)], arr.nbytes)
        assert np.array_equal(np.frombuffer(view, dtype=np.float64), arr)
    finally:
        os.close(fd)
    _, client, _ = pair
    assert client.total(arr) == float(arr.sum())


def test_sweep_removes_rendezvous_of_dead_servers() -> None:
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


def test_received_buffers_hold_a_bounded_number_of_descriptors(
    pair: tuple[RPCServer, RPCClient, Echo],
) -> None:
    """A program may keep many received arrays: they are mappings; only a few keep their file open."""
    _, client, _ = pair
    arr = np.ones(shm.MIN_SIZE // 8)  # 512 KiB
    client.echo(arr)  # the connection is open
    before = len(os.listdir("/proc/self/fd"))
    kept = [client.echo(arr) for _ in range(3 * shm._KEEP)]
    assert len(os.listdir("/proc/self/fd")) - before <= shm._KEEP + 4
    kept[0][:] = 2  # each its own
    assert kept[1][0] == 1 and all(np.array_equal(k, arr) for k in kept[1:])
    del kept
    assert len(os.listdir("/proc/self/fd")) - before <= 4  # closed with their mappings


class Relay:
    """Passes on what it receives, unchanged or changed, to the next server."""

    def __init__(self, nxt: RPCClient) -> None:
        self.nxt = nxt

    def unchanged(self, a: np.ndarray) -> np.ndarray:
        return self.nxt.echo(a)  # type: ignore[no-any-return]

    def changed(self, a: np.ndarray, at: int) -> np.ndarray:
        a[at] = -1.0  # one page of the received mapping is now the relay's own
        return self.nxt.echo(a)  # type: ignore[no-any-return]

    def prefix(self, a: np.ndarray) -> np.ndarray:
        return self.nxt.echo(a[: len(a) // 2])  # type: ignore[no-any-return]


def test_a_received_buffer_passed_on_unchanged_is_forwarded_changed_is_copied(
    pair: tuple[RPCServer, RPCClient, Echo],
) -> None:
    server, _, _ = pair
    nxt = RPCClient("echo/0", KEYS, fixed_resolver(server.address))
    relay = RPCServer(Relay(nxt), KEYS)
    client = RPCClient("relay/0", KEYS, fixed_resolver(relay.address))
    try:
        arr = np.arange(1 << 20, dtype=np.float64)  # 8 MiB
        assert np.array_equal(client.unchanged(arr), arr)
        for at in (0, 4096, len(arr) - 1):  # first, a middle and the last page written
            expected = arr.copy()
            expected[at] = -1.0
            assert np.array_equal(client.changed(arr, at), expected)
        assert np.array_equal(client.prefix(arr), arr[: len(arr) // 2])
        assert np.array_equal(arr, np.arange(1 << 20, dtype=np.float64))  # the caller's own, untouched
    finally:
        client.close()
        relay.close()
        nxt.close()


def test_a_forked_child_reads_its_own_pagemap(pair: tuple[RPCServer, RPCClient, Echo]) -> None:
    """After a fork, a changed page is the child's own: it must not pass the parent's file on."""
    _, client, _ = pair
    got = client.echo(np.zeros(1 << 18))  # 2 MiB, a kept sealed file
    fds = shm.seal(memoryview(got).cast("B"))  # unchanged: forwarded (the parent's pagemap is open now)
    assert fds is not None
    for fd in fds:
        os.close(fd)

    def child() -> bool:  # changes one page, then seals the buffer: a copy, with the change
        got[100] = 7.0
        sealed = shm.seal(memoryview(got).cast("B"))
        view = shm.take(sealed, got.nbytes) if sealed is not None else None
        return view is not None and np.frombuffer(view, dtype=np.float64)[100] == 7.0

    assert in_forked_child(child)


def test_a_forked_child_that_closes_what_it_inherited_keeps_its_own_descriptors(
    pair: tuple[RPCServer, RPCClient, Echo],
) -> None:
    """A child that closes its inherited descriptors and opens others under the same numbers
    (as a forked node does) has none of them closed, or passed on as a buffer's files, by the
    parent's kept files and pagemap."""
    _, client, _ = pair
    got = client.echo(np.zeros(1 << 18))  # 2 MiB: a kept sealed file
    fds = shm.seal(memoryview(got).cast("B"))  # forwarded: the pagemap is open
    assert fds is not None
    for fd in fds:
        os.close(fd)
    inherited = sorted({fd for kept, _ in shm._kept.values() for fd in kept} | {shm._pagemap_fd or -1} - {-1})
    assert inherited

    def child() -> bool:
        null = os.open(os.devnull, os.O_RDONLY)
        for fd in inherited:  # closed and taken again by files of the child's own
            os.dup2(null, fd)
        mine = os.fstat(null).st_ino
        sealed = shm.seal(memoryview(got).cast("B"))  # looks at the pagemap and the kept files
        view = shm.take(sealed, got.nbytes) if sealed is not None else None
        return (
            view is not None
            and np.array_equal(np.frombuffer(view, dtype=np.float64), got)
            and all(os.fstat(fd).st_ino == mine for fd in inherited)
        )

    assert in_forked_child(child)
