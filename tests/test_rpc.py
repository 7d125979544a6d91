"""RPC: calls, futures, errors, bulk payloads, restarts and authentication."""

from __future__ import annotations

import os
import pickle
import threading

import numpy as np
import pytest
import zmq

from tlaunch.errors import RemoteError, ResolveTimeoutError, RPCError, ServerRestartedError
from tlaunch.rpc import RPCClient, RPCServer, RunKeys
from tlaunch.rpc.security import AuthError, Sealer


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


def fixed(address: str):  # type: ignore[no-untyped-def]
    def resolve(previous: str | None, timeout: float) -> str:
        if previous == address:
            raise ResolveTimeoutError("fixed")
        return address

    return resolve


@pytest.fixture(params=[True, False], ids=["encrypted", "authenticated"])
def pair(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    keys = RunKeys.generate(encrypt=request.param)
    server = RPCServer(Service(), keys)
    client = RPCClient("svc/0", keys, fixed(server.address))
    yield server, client
    client.close()
    server.close()


def test_calls_and_futures(pair) -> None:  # type: ignore[no-untyped-def]
    _server, client = pair
    assert client.add(2, b=3) == 5
    futures = [client.futures.add(i, i) for i in range(50)]
    assert [f.result(10) for f in futures] == [2 * i for i in range(50)]
    assert client.get(timeout=7.5) == 7.5


def test_remote_exception_carries_traceback(pair) -> None:  # type: ignore[no-untyped-def]
    _server, client = pair
    with pytest.raises(RemoteError) as info:
        client.boom()
    err = info.value
    assert err.type_name == "ValueError"
    assert err.remote_message == "bad input 42"
    assert "in boom" in err.remote_traceback
    assert err.node == "svc/0"
    with pytest.raises(RemoteError, match="not a public method"):
        client.call("_private")
    with pytest.raises(RemoteError, match="no public method 'nope'"):
        client.nope()


def test_numpy_round_trip_by_value(pair) -> None:  # type: ignore[no-untyped-def]
    _server, client = pair
    a = np.random.default_rng(0).standard_normal((300, 1000)).astype(np.float32)
    b = client.echo({"w": a, "tail": b"x" * 100_000})
    assert b["w"].dtype == a.dtype and b["w"].shape == a.shape
    assert np.array_equal(a, b["w"]) and b["w"] is not a
    assert b["w"].flags.writeable
    b["w"][0, 0] = 1.0  # received arrays are the caller's own


def test_client_is_not_picklable(pair) -> None:  # type: ignore[no-untyped-def]
    _server, client = pair
    with pytest.raises(TypeError, match="pass the node's handle"):
        pickle.dumps(client)


def test_wrong_key_is_dropped_and_server_keeps_serving() -> None:
    keys = RunKeys.generate()
    with RPCServer(Service(), keys) as server:
        intruder = RPCClient("svc/0", RunKeys.generate(), fixed(server.address))
        with pytest.raises(RPCError, match="no reply in time"):
            intruder.call("add", (1, 2), timeout=1.0)
        intruder.close()
        good = RPCClient("svc/0", keys, fixed(server.address))
        assert good.add(1, 2) == 3
        good.close()
        assert server.rejected >= 1


def test_crafted_pickle_is_never_unpickled(tmp_path) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {marker}",))

    payload = pickle.dumps(("add", (Evil(),), {}))
    keys = RunKeys.generate()
    service = Service()
    with RPCServer(service, keys) as server:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://{server.address}")
        forged = Sealer(RunKeys.generate()).seal(1, 1, [payload])  # right format, wrong key
        for frames in ([payload], [b"T1" + bytes(60), payload], forged, [forged[0][:10]]):
            sock.send_multipart(frames)
        assert sock.poll(1000) == 0  # no reply to any of them
        sock.close(0)
        client = RPCClient("svc/0", keys, fixed(server.address))
        assert client.add(1, 1) == 2
        client.close()
        assert server.rejected == 4
    assert not marker.exists()
    assert service.calls == 1


def test_tampered_message_fails_authentication() -> None:
    for encrypt in (True, False):
        sealer = Sealer(RunKeys(os.urandom(32), encrypt))
        for size in (10, 9 << 20):
            frames = sealer.seal(1, 5, [os.urandom(size)])
            body = bytearray(frames[1])  # type: ignore[arg-type]
            body[-1] ^= 1
            with pytest.raises(AuthError):
                sealer.open([frames[0], body])  # type: ignore[list-item]


def test_client_follows_a_restarted_server() -> None:
    keys = RunKeys.generate()
    first = RPCServer(Service(), keys)
    current = {"address": first.address}

    def resolve(previous: str | None, timeout: float) -> str:
        if current["address"] == previous:
            raise ResolveTimeoutError("same")
        return current["address"]

    client = RPCClient("svc/0", keys, resolve)
    assert client.add(1, 1) == 2
    first.close()
    second = RPCServer(Service(), keys)
    current["address"] = second.address
    assert client.add(2, 2) == 4  # re-resolved: the new port
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
    current = {"address": first.address}

    def resolve(previous: str | None, timeout: float) -> str:
        if current["address"] == previous:
            raise ResolveTimeoutError("same")
        return current["address"]

    client = RPCClient("slow/0", keys, resolve)
    fut = client.futures.wait()
    assert started.wait(10)
    second = RPCServer(Slow(), keys)
    current["address"] = second.address
    with pytest.raises(ServerRestartedError, match="may or may not have run"):
        fut.result(10)
    release.set()
    client.close()
    first.close()
    second.close()
