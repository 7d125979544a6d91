"""RPC: calls, futures, errors, bulk payloads, restarts and authentication."""

from __future__ import annotations

import os
import pickle
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from tlaunch.errors import RemoteError, ResolveTimeoutError, RPCError, ServerRestartedError
from tlaunch.rpc import RPCClient, RPCServer, RunKeys
from tlaunch.rpc.client import fixed_resolver


class Service:
    def __init__(self) -> None:
        self.calls = 0

    def add(self, a: int, b: int = 0) -> int:
        self.calls += 1
        return a + b

    def echo(self, x: object) -> object:
        return x

    def get(self, timeout: float | None = None) -> float | None:  # a user kwarg named timeout
        return timeout

    def boom(self) -> None:
        raise ValueError("bad input 42")

    def _private(self) -> int:
        return 1


def movable(box: dict[str, str]) -> Callable[[str | None, float], str]:
    def resolve(previous: str | None, timeout: float) -> str:
        if box["address"] == previous:
            raise ResolveTimeoutError("same")
        return box["address"]

    return resolve


@pytest.fixture
def pair() -> Iterator[tuple[RPCServer, RPCClient]]:
    keys = RunKeys.generate()
    server = RPCServer(Service(), keys)
    client = RPCClient("svc/0", keys, fixed_resolver(server.address))
    yield server, client
    client.close()
    server.close()


def test_calls_and_futures(pair: tuple[RPCServer, RPCClient]) -> None:
    _server, client = pair
    assert client.add(2, b=3) == 5
    futures = [client.futures.add(i, i) for i in range(50)]
    assert [f.result(10) for f in futures] == [2 * i for i in range(50)]
    assert client.get(timeout=7.5) == 7.5
    assert client.futures.get(timeout=1.5).result(10) == 1.5


def test_remote_exception_carries_traceback(pair: tuple[RPCServer, RPCClient]) -> None:
    _server, client = pair
    for call in (client.boom, lambda: client.futures.boom().result(10)):
        with pytest.raises(RemoteError) as info:
            call()
        err = info.value
        assert err.type_name == "ValueError"
        assert err.remote_message == "bad input 42"
        assert "in boom" in err.remote_traceback
        assert err.node == "svc/0"
    with pytest.raises(RemoteError, match="not a public method"):
        client.call("_private")
    with pytest.raises(RemoteError, match="no public method 'nope'"):
        client.nope()
    assert client.add(1, 1) == 2  # the connection survived the errors


def test_numpy_round_trip_by_value(pair: tuple[RPCServer, RPCClient]) -> None:
    _server, client = pair
    a = np.random.default_rng(0).standard_normal((300, 1000)).astype(np.float32)
    b = client.echo({"w": a, "tail": b"x" * 100_000, "small": np.arange(3)})
    assert b["w"].dtype == a.dtype and b["w"].shape == a.shape
    assert np.array_equal(a, b["w"]) and b["w"] is not a
    assert b["w"].flags.writeable
    b["w"][0, 0] = 1.0  # received arrays are the caller's own
    assert b["tail"] == b"x" * 100_000 and list(b["small"]) == [0, 1, 2]


def test_client_is_not_picklable(pair: tuple[RPCServer, RPCClient]) -> None:
    _server, client = pair
    with pytest.raises(TypeError, match="pass the node's handle"):
        pickle.dumps(client)


def test_wrong_key_is_refused_and_server_keeps_serving() -> None:
    keys = RunKeys.generate()
    with RPCServer(Service(), keys) as server:
        intruder = RPCClient("svc/0", RunKeys.generate(), fixed_resolver(server.address))
        with pytest.raises(RPCError, match=r"TLS handshake .* failed"):
            intruder.add(1, 2)
        intruder.close()
        good = RPCClient("svc/0", keys, fixed_resolver(server.address))
        assert good.add(1, 2) == 3
        good.close()
        assert server.rejected >= 1


def test_crafted_pickle_is_never_unpickled(tmp_path: object) -> None:
    marker = os.path.join(str(tmp_path), "pwned")

    class Evil:
        def __reduce__(self) -> tuple[object, ...]:
            return (os.system, (f"touch {marker}",))

    payload = pickle.dumps(("add", (Evil(),), {}))
    keys = RunKeys.generate()
    service = Service()
    with RPCServer(service, keys) as server:
        host, port = server.address.rsplit(":", 1)
        # A peer without keys: a bare pickle, then one behind a tlaunch header.
        for data in (payload, b"TL\x01\x01" + bytes(12) + payload):
            with socket.create_connection((host, int(port)), timeout=5) as raw:
                raw.sendall(data)
                try:
                    answer = raw.recv(100)
                except ConnectionResetError:
                    answer = b""
                assert not answer.startswith(b"TL")  # a TLS alert or nothing, never a reply
        # A peer holding the certificate of another run.
        other = RunKeys.generate().context(server=False)
        with socket.create_connection((host, int(port)), timeout=5) as raw, pytest.raises(ssl.SSLError):
            tls = other.wrap_socket(raw)
            tls.sendall(payload)
            tls.recv(100)
        client = RPCClient("svc/0", keys, fixed_resolver(server.address))
        assert client.add(1, 1) == 2
        client.close()
        deadline = time.monotonic() + 5
        while server.rejected < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.rejected == 3
    assert not os.path.exists(marker)
    assert service.calls == 1


def test_client_follows_a_restarted_server() -> None:
    keys = RunKeys.generate()
    first = RPCServer(Service(), keys)
    box = {"address": first.address}
    client = RPCClient("svc/0", keys, movable(box))
    assert client.add(1, 1) == 2
    assert client.futures.add(1, 2).result(10) == 3
    first.close()
    # The next call comes 50 ms after the last (a restart takes longer than that): its pooled
    # connection, to a server gone meanwhile, is checked and not used (it was not, within 0.2 s,
    # and a call failed "may or may not have run": test_transmit_ssh's restarted server).
    time.sleep(0.05)
    second = RPCServer(Service(), keys)
    box["address"] = second.address
    assert client.add(2, 2) == 4  # re-resolved: the new port
    assert client.futures.add(3, 3).result(10) == 6
    client.close()
    second.close()


def test_in_flight_call_to_a_replaced_server() -> None:
    keys = RunKeys.generate()
    release = threading.Event()
    started = threading.Event()

    class Slow:
        def wait(self) -> None:
            started.set()
            release.wait(10)

    first = RPCServer(Slow(), keys)
    box = {"address": first.address}
    client = RPCClient("slow/0", keys, movable(box))
    fut = client.futures.wait()
    assert started.wait(10)
    second = RPCServer(Slow(), keys)
    box["address"] = second.address
    with pytest.raises(ServerRestartedError, match="may or may not have run"):
        fut.result(10)
    release.set()
    client.close()
    first.close()
    second.close()


def test_connection_lost_during_a_call() -> None:
    keys = RunKeys.generate()
    started = threading.Event()

    class Slow:
        def wait(self) -> None:
            started.set()
            time.sleep(5)

    server = RPCServer(Slow(), keys)
    client = RPCClient("slow/0", keys, fixed_resolver(server.address))
    fut = client.futures.wait()
    assert started.wait(10)
    server.close()
    with pytest.raises(RPCError, match="was lost during wait"):
        fut.result(10)
    client.close()


def test_a_server_closing_before_its_greeting_is_an_rpc_error_not_eof() -> None:
    """A server shutting down may finish the TLS handshake and close: the caller sees an RPCError."""
    keys = RunKeys.generate()
    context = keys.context(server=True)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    done = threading.Event()

    def accept_and_close() -> None:
        try:
            for _ in range(2):
                raw, _ = listener.accept()
                if done.is_set():  # the test's own connection: the client gave up before a second try
                    raw.close()
                    return
                with context.wrap_socket(raw, server_side=True):
                    pass  # handshake done; closed before the greeting
        finally:
            listener.close()  # then it is gone: the next attempt is refused

    server = threading.Thread(target=accept_and_close, daemon=True)
    server.start()
    client = RPCClient(
        "coordinator", keys, fixed_resolver(f"127.0.0.1:{port}"), resolve_timeout=3.0, retry_refused=False
    )
    try:
        with pytest.raises(RPCError):
            client.add(1, 1)
    finally:
        client.close()
        done.set()
        try:  # wakes an accept() still waiting (the listener is closed only by its thread, after it)
            socket.create_connection(("127.0.0.1", port), timeout=10).close()
        except ConnectionRefusedError:  # its thread has closed the listener: it has ended
            pass
        server.join(10)
    assert not server.is_alive(), "the accept loop did not end"


def test_calls_work_with_descriptors_past_1024() -> None:
    """A launcher or head of hundreds of hosts holds over 1024 descriptors: select(2) would refuse them."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the hard limit of open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        keys = RunKeys.generate()
        with RPCServer(Service(), keys) as server:
            client = RPCClient("svc/0", keys, fixed_resolver(server.address))
            assert client.add(1, 2) == 3 and client.futures.add(2, 2).result(10) == 4
            assert max(c.sock.fileno() for c in client._pool.idle) > 1024
            client.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_call_timeout_and_stop_event() -> None:
    keys = RunKeys.generate()
    stop = threading.Event()

    class Slow:
        def wait(self) -> None:
            time.sleep(3)

    with RPCServer(Slow(), keys) as server:
        client = RPCClient("slow/0", keys, fixed_resolver(server.address), stop_event=stop)
        with pytest.raises(RPCError, match="no reply in time"):
            client.call("wait", timeout=0.6)
        fut = client.futures.wait()
        stop.set()
        with pytest.raises(RPCError, match="program stopped"):
            fut.result(10)
        client.close()


def test_large_bytes_and_arrays_travel_out_of_band() -> None:
    from tlaunch.rpc import wire

    blob = bytes(range(256)) * 1024  # 256 KiB
    arr = np.arange(50_000, dtype=np.int64)
    frames = wire.dumps({"blob": blob, "again": blob, "arr": arr, "fn": lambda x: x + 1})
    sizes = sorted(len(f) if isinstance(f, bytes) else f.nbytes for f in frames)
    assert sizes[-2:] == [blob.__len__(), arr.nbytes][:: 1 if len(blob) < arr.nbytes else -1]
    assert sizes[0] < 4096  # the pickle itself stays small: nothing big was copied into it
    back = wire.loads([memoryview(f) for f in frames])
    assert type(back["blob"]) is bytes and back["blob"] == blob and back["again"] == blob
    assert np.array_equal(back["arr"], arr) and back["fn"](1) == 2


def test_bad_buffer_reference_is_an_unpickling_error() -> None:
    from tlaunch.rpc import wire

    frames = wire.dumps(bytes(100_000))
    with pytest.raises(pickle.UnpicklingError):
        wire.loads([memoryview(frames[0]), memoryview(frames[1])])  # the referenced buffer is missing


def test_large_payloads_arrive_whole_and_owned(pair: tuple[RPCServer, RPCClient]) -> None:
    """Buffers past 1 MiB are received into mapped memory, large bytes straight into bytes."""
    _server, client = pair
    rng = np.random.default_rng(1)
    blob = rng.integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()  # 3 MiB of bytes
    arr = rng.standard_normal(1 << 20)  # 8 MiB of float64
    back = client.echo({"blob": blob, "blob2": blob[1:], "arr": arr, "n": 7})
    assert type(back["blob"]) is bytes and back["blob"] == blob and back["blob2"] == blob[1:]
    assert hash(back["blob"]) == hash(blob)  # a genuine, hashable bytes object
    assert back["blob"] is not blob and back["n"] == 7
    assert np.array_equal(back["arr"], arr) and back["arr"].flags.writeable
    back["arr"][:] = 0  # the caller owns it: writing does not touch anything else
    assert np.array_equal(client.echo(arr), arr)


class Slow:
    def __init__(self) -> None:
        self.started = threading.Event()

    def slow(self, seconds: float) -> str:
        self.started.set()
        time.sleep(seconds)
        return "done"


@pytest.mark.parametrize("futures", [False, True])
def test_close_with_drain_lets_running_calls_reply(futures: bool) -> None:
    """close(drain=s): no new connections, but a call already running still gets its reply."""
    keys = RunKeys.generate()
    target = Slow()
    server = RPCServer(target, keys)
    client = RPCClient("slow/0", keys, fixed_resolver(server.address), retry_refused=False)
    try:
        box: dict[str, object] = {}

        def call() -> None:
            try:
                box["reply"] = client.futures.slow(0.3).result() if futures else client.slow(0.3)
            except RPCError as exc:
                box["reply"] = exc

        caller = threading.Thread(target=call)
        caller.start()
        assert target.started.wait(10)
        server.close(drain=5)
        caller.join(10)
        assert box["reply"] == "done"
        with pytest.raises(RPCError):
            client.slow(0)  # closed now
    finally:
        client.close()
        server.close()


def test_close_without_drain_drops_running_calls() -> None:
    keys = RunKeys.generate()
    target = Slow()
    server = RPCServer(target, keys)
    client = RPCClient("slow/0", keys, fixed_resolver(server.address), retry_refused=False)
    try:
        future = client.futures.slow(1.0)
        assert target.started.wait(10)
        t0 = time.monotonic()
        server.close()
        with pytest.raises(RPCError):
            future.result(10)
        assert time.monotonic() - t0 < 0.9  # did not wait for the call
    finally:
        client.close()


def test_a_dropped_client_closes_its_connections() -> None:
    """Clients of handles are rarely closed by hand: dropping one closes its sockets (no ResourceWarning)."""
    import gc

    keys = RunKeys.generate()
    with RPCServer(Service(), keys) as server:
        client = RPCClient("svc/0", keys, fixed_resolver(server.address))
        assert client.add(1, 2) == 3 and client.futures.add(2, 2).result() == 4
        conns = list(client._pool.idle)
        channel = client._channel
        assert conns and channel is not None
        del client
        gc.collect()
        assert all(c.sock.fileno() == -1 for c in conns)
        deadline = time.monotonic() + 5
        # The reactor's next sweep closes it: it marks the channel done, then closes its
        # sockets, so wait for the socket (done alone is seen a moment earlier).
        while channel.replies.sock.fileno() != -1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert channel.done and channel.replies.sock.fileno() == -1


def test_an_ip_address_is_connected_to_without_the_resolver(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node's first call (to its coordinator, at an IP address) skips ``getaddrinfo``: a
    process's first one loads its name services (1-4 ms); a host name is still resolved."""
    keys = RunKeys.generate()
    with RPCServer(Service(), keys) as server:
        port = server.address.rpartition(":")[2]
        asked: list[object] = []
        real = socket.getaddrinfo

        def getaddrinfo(host: object, *args: object, **kwargs: object) -> object:
            asked.append(host)
            return real(host, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        by_address = RPCClient("svc/0", keys, fixed_resolver(f"127.0.0.1:{port}"))
        assert by_address.add(1, 2) == 3
        by_address.close()
        assert asked == []
        by_name = RPCClient("svc/0", keys, fixed_resolver(f"localhost:{port}"))
        assert by_name.add(2, 3) == 5
        by_name.close()
        assert asked == ["localhost"]


def test_a_client_of_small_messages_does_not_greet(monkeypatch: pytest.MonkeyPatch) -> None:
    """``shared_memory=False`` (the coordinator's clients): no greeting round trip, so no Unix
    socket for sealed memory files; large buffers still arrive whole, over TLS."""
    from tlaunch.rpc import opening

    keys = RunKeys.generate()
    greeted: list[object] = []
    real = opening.answer_greeting

    def answer(*args: object) -> None:
        greeted.append(args[0])
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr("tlaunch.rpc.server.answer_greeting", answer)
    with RPCServer(Service(), keys) as server:
        quiet = RPCClient("svc/0", keys, fixed_resolver(server.address), shared_memory=False)
        big = np.arange(1 << 22, dtype=np.int64)  # 32 MiB: sealed memory files when greeted
        assert np.array_equal(quiet.echo(big), big)
        quiet.close()
        assert greeted == []
        usual = RPCClient("svc/0", keys, fixed_resolver(server.address))
        assert usual.add(1, 2) == 3
        usual.close()
        assert len(greeted) == 1


def test_a_connection_opened_ahead_serves_the_next_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """``connect_ahead`` (a node's registration seen by the launcher): the connection opens in
    a thread of its own; a call made meanwhile waits for it rather than opening a second, and
    the calls after it use it too."""
    from tlaunch.rpc import client as client_module

    keys = RunKeys.generate()
    opened: list[str] = []
    real = client_module.connect

    def slow_connect(*args: object, **kwargs: object) -> object:
        opened.append(threading.current_thread().name)
        time.sleep(0.3)  # the call below comes while this one is on its way
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(client_module, "connect", slow_connect)
    with RPCServer(Service(), keys) as server:
        never = RPCClient("svc/0", keys, lambda previous, timeout: pytest.fail("resolved"))
        never.connect_ahead(server.address)
        assert never.add(1, 2) == 3
        assert never.add(3, 4) == 7
        assert opened == ["tlaunch-connect-ahead"]
        never.close()
        never.connect_ahead(server.address)  # a closed client opens nothing
        assert opened == ["tlaunch-connect-ahead"]


def test_a_connection_that_cannot_be_opened_ahead_leaves_the_call_its_own_error() -> None:
    """An address refused ahead is dropped quietly: the call connects by itself, and a server
    that moved meanwhile is found through the resolver as usual."""
    keys = RunKeys.generate()
    gone = socket.socket()
    gone.bind(("127.0.0.1", 0))
    dead = f"127.0.0.1:{gone.getsockname()[1]}"
    gone.close()  # nothing listens there
    with RPCServer(Service(), keys) as server:
        box = {"address": dead}
        client = RPCClient("svc/0", keys, movable(box), resolve_timeout=5.0)
        client.connect_ahead(dead)
        box["address"] = server.address
        assert client.add(2, 2) == 4
        client.close()


def test_no_more_than_eight_connections_are_opened_ahead_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A launcher holding handles of many nodes that register together shakes hands with
    eight at a time ahead; the others connect at their first call, as before."""
    from tlaunch.rpc import client as client_module

    keys = RunKeys.generate()
    opened: list[str] = []
    real = client_module.connect

    def slow_connect(*args: object, **kwargs: object) -> object:
        opened.append(threading.current_thread().name)
        time.sleep(0.3)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(client_module, "connect", slow_connect)
    with RPCServer(Service(), keys) as server:
        clients = [RPCClient(f"svc/{i}", keys, fixed_resolver(server.address)) for i in range(10)]
        for c in clients:
            c.connect_ahead(server.address)
        assert sum(c._pool._ahead is not None for c in clients) == 8  # each takes 0.3 s
        assert [c.add(i, 1) for i, c in enumerate(clients)] == list(range(1, 11))
        assert opened.count("tlaunch-connect-ahead") == 8 and len(opened) == 10
        for c in clients:
            c.close()


def test_may_share_memory_is_true_for_this_hosts_addresses_only() -> None:
    """A connection to a loopback address, or to the address its own end has, may reach a
    process of this host (it is greeted); an unconnected socket has no peer to greet.
    (A node on another host is not greeted: test_launch_ssh.py.)"""
    from tlaunch.rpc.opening import may_share_memory

    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()) as sock:
            assert may_share_memory(sock)
    with socket.socket() as lone:
        assert not may_share_memory(lone)


@pytest.mark.parametrize("server_side", [True, False])
def test_a_connection_reset_before_its_handshake_leaves_no_socket_open(server_side: bool) -> None:
    """A peer that resets the connection before the TLS handshake: ``ssl`` left the socket it
    had made open (CPython gh-113280), and the collector later found it (a ResourceWarning,
    which failed test_kill9_coordinator now and then). ``wrap`` closes it."""
    import gc
    import select
    import struct
    import warnings

    from tlaunch.rpc.opening import wrap

    keys = RunKeys.generate()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        raw = socket.create_connection(listener.getsockname())
        peer, _ = listener.accept()
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()  # closed with no lingering: a reset
        assert select.select([raw], [], [], 5.0)[0]
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", ResourceWarning)
            with pytest.raises(OSError):
                wrap(keys.context(server=server_side), raw, server_side)
            raw.close()
            gc.collect()
    assert [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)] == []
