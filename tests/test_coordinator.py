"""The run's coordinator on its own (no processes): long polls and the launcher's lease."""

from __future__ import annotations

import threading
import time
from typing import Any

from tlaunch import lp_ssh as lp
from tlaunch.errors import RPCError
from tlaunch.plan import make_plan
from tlaunch.runtime.coordinator import Coordinator


def coordinator(n: int) -> Coordinator:
    program = lp.Program("c")
    for _ in range(n):
        program.add_node(lp.PyNode(print), label="n")
    return Coordinator(make_plan(program))


def test_a_stop_poll_returns_for_the_stop_only() -> None:
    """Other nodes starting and registering do not answer a node's long poll (N squared calls)."""
    coord = coordinator(3)
    returned: list[float] = []

    def poll() -> None:
        t0 = time.monotonic()
        coord.wait_stop("n/0", 5.0)
        returned.append(time.monotonic() - t0)

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.05)
    coord.node_started("n/1", 1, 1)
    coord.register("n/1", "h:1")
    coord.set_state("n/2", "running")
    time.sleep(0.3)
    assert returned == []  # still waiting
    coord.stop("done")
    thread.join(2.0)
    assert returned and returned[0] < 2.0  # the stop answers it at once


def test_a_launcher_that_has_not_leased_yet_gets_the_start_time() -> None:
    """The launcher learns the head's address only once it is up, possibly long after its start."""
    coord = coordinator(1)
    coord.launcher_seen = time.time() - 20.0  # the head has been up for 20 s, no lease yet
    coord.check_health(heartbeat_timeout=10.0, launcher_timeout=15.0)
    assert not coord.stopping
    coord.renew()
    coord.launcher_seen = time.time() - 20.0  # it leased, then went silent for 20 s
    coord.check_health(heartbeat_timeout=10.0, launcher_timeout=15.0)
    assert coord.stopping and "the launcher stopped answering" in (coord.stop_reason or "")


def test_a_renewed_lease_carries_the_summary_only_when_it_changed() -> None:
    coord = coordinator(2)
    changes, summary = coord.renew()
    assert summary is not None and summary["status"]["n/0"]["state"] == "pending"
    assert coord.renew(changes) == (changes, None)  # nothing changed: nothing travels
    coord.heartbeat("n/0")  # a heartbeat is no change
    assert coord.renew(changes)[1] is None
    coord.node_started("n/0", 1, 1)
    later, summary = coord.renew(changes)
    assert later > changes and summary is not None and summary["status"]["n/0"]["state"] == "starting"
    assert list(summary["status"]) == ["n/0"]  # only what changed travels
    assert summary["since"] == changes and coord.summary()["status"]["n/1"]["state"] == "pending"


def test_a_launcher_merges_what_changed_into_the_whole_even_when_answers_cross() -> None:
    """``RemoteCoordinator``: each renew brings the records changed since its last answer;
    merged, they are the coordinator's summary; an older answer arriving late is dropped."""
    from tlaunch.runtime.remote import RemoteCoordinator

    coord = coordinator(3)
    link = RemoteCoordinator.__new__(RemoteCoordinator)  # its merge alone, no connection
    link._summary, link._seen = None, -1
    link._merge(*coord.renew(link._seen))
    coord.node_started("n/0", 1, 1)
    early = coord.renew(link._seen)  # an answer that will arrive late
    coord.register("n/0", "h:1")
    coord.node_finished("n/2", False, "Traceback...", None, "it failed")
    link._merge(*coord.renew(link._seen))
    link._merge(*early)
    assert link._summary == coord.summary()
    assert link._summary is not None and link._summary["status"]["n/0"]["address"] == "h:1"
    coord.node_finished("n/2", False, None, 4, "again")  # an ended node's exit code, noted later
    link._merge(*coord.renew(link._seen))
    assert link._summary == coord.summary() and link._summary["status"]["n/2"]["exit_code"] == 4


def test_a_launcher_that_let_its_head_go_or_saw_the_run_end_loses_nothing_when_a_call_fails() -> None:
    """``RemoteCoordinator``: a call that fails as the launcher releases the head (the lease's
    renew in flight as the head exits), or once the run was seen ended, marks no loss: the run
    is not recorded as failed for it (CI once recorded a run that ended well as FAILED, "the
    coordinator on th1 was lost ... during renew()"). A head that goes before the end is a loss."""
    from tlaunch.runtime.remote import RemoteCoordinator

    gone = "127.0.0.1:1"  # refuses connections, as the address of a head that exited does
    coord = coordinator(2)

    class Failing:
        def __init__(self, then: Any = None) -> None:
            self.then = then

        def call(self, method: str, args: tuple[Any, ...] = (), timeout: float | None = None) -> Any:
            if self.then is not None:
                self.then()
            raise RPCError(f"the connection was lost during {method}()")

    def link(client: Any) -> RemoteCoordinator:
        made = RemoteCoordinator(client, "th1", 15.0, gone)
        made._merge(*coord.renew(-1))
        return made

    running = link(Failing())
    running._call("renew", 0)
    assert running.lost is not None and "the coordinator on th1 was lost" in running.lost
    released = link(Failing())
    released.client.then = lambda: setattr(released, "_released", True)  # as release() returns
    released._call("renew", 0)
    assert released.lost is None
    coord.stop("every node with a run() finished")
    for key in ("n/0", "n/1"):
        coord.node_finished(key, True)
    ended = link(Failing())
    assert ended.ended and ended.wait_ended(5.0)
    ended._call("renew", 0)
    assert ended.lost is None and ended.failure is None


def test_the_launchers_first_lease_goes_at_once_in_the_leases_thread() -> None:
    """``RemoteCoordinator.start_lease``: the first renewal (a connection, its TLS handshake)
    goes at once, in the lease's thread: the launcher goes on meanwhile (it starts the other
    SSH hosts), and the head is leased well before the renewals' half-second beat."""
    import threading

    from tlaunch.runtime.remote import RemoteCoordinator

    coord = coordinator(1)
    calls: list[float] = []
    answer = threading.Event()

    class Slow:
        def call(self, method: str, args: tuple[Any, ...] = (), timeout: float | None = None) -> Any:
            calls.append(time.monotonic())
            answer.wait(5.0)
            return getattr(coord, method)(*args)

    link = RemoteCoordinator(Slow(), "th1", 15.0, "127.0.0.1:1")  # type: ignore[arg-type]
    t0 = time.monotonic()
    link.start_lease()
    assert time.monotonic() - t0 < 0.1  # not waited for
    deadline = time.monotonic() + 2.0
    while not calls:
        assert time.monotonic() < deadline, "no lease"
        time.sleep(0.005)
    assert calls[0] - t0 < 0.2
    # The launch returns only once it was answered (SSHBackend.start): a launcher killed right
    # after is given up on after its lease's timeout, not after the start's allowance.
    assert not link.wait_first_lease(0.05) and not coord.leased
    answer.set()
    assert link.wait_first_lease(2.0) and coord.leased
    link.stop_lease()


class _Seen:
    """The coordinator, served, noting the server thread (one a connection) of each method's first call."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.threads: dict[str, int] = {}
        self.last: dict[str, int] = {}  # the server thread of each method's latest call

    def _note(self, method: str) -> None:
        self.threads.setdefault(method, threading.get_ident())
        self.last[method] = threading.get_ident()

    def node_started(self, key: str, pid: int, pgid: int) -> None:
        self._note("node_started")
        self.coord.node_started(key, pid, pgid)

    def register(self, key: str, address: str) -> None:
        self._note("register")
        self.coord.register(key, address)

    def set_state(self, key: str, state: str) -> None:
        self._note("set_state")
        self.coord.set_state(key, state)

    def wait_stop(self, key: str | None = None, timeout: float = 2.0) -> bool:
        self._note("wait_stop")
        return self.coord.wait_stop(key, timeout)


def test_a_node_starts_on_one_connection_and_its_stop_watcher_polls_on_it_once_settled() -> None:
    """As a node starts, its calls (node_started, register, set_state) go on one connection:
    the stop watcher's long poll waits for the node's first state, then takes that
    connection (no second TLS handshake on either side while the node starts). A later
    call while the poll holds it opens another, and the stop still reaches the node."""
    from tlaunch.rpc.security import RunKeys
    from tlaunch.rpc.server import RPCServer
    from tlaunch.runtime.node_main import coordinator_client
    from tlaunch.runtime.node_runtime import NodeRuntime, RuntimeConfig

    coord, keys = coordinator(1), RunKeys.generate()
    seen = _Seen(coord)
    server = RPCServer(seen, keys, "127.0.0.1", "127.0.0.1", 0, tls_client=True)  # as coordinators serve
    config = RuntimeConfig("r", "c", keys)
    link = coordinator_client(server.address, config)
    runtime = NodeRuntime(config, link, "n/0")
    try:
        link.node_started("n/0", 1, 1)
        runtime.start_watcher(settle=30.0)
        time.sleep(0.2)
        assert "wait_stop" not in seen.threads  # settling: the node's calls come first
        stop_serving = runtime.serve(object())
        runtime.set_state("serving")
        deadline = time.monotonic() + 5.0
        while "wait_stop" not in seen.threads and time.monotonic() < deadline:
            time.sleep(0.01)
        assert coord.status()["n/0"]["address"]
        started = {seen.threads[m] for m in ("node_started", "register", "set_state", "wait_stop")}
        assert len(started) == 1, seen.threads
        runtime.set_state("running")  # the poll holds the connection: this call opens another
        assert seen.last["set_state"] != seen.threads["wait_stop"]
        coord.stop("done")
        assert runtime.stop_event().wait(5.0)
        stop_serving()
    finally:
        runtime.close()
        link.close()
        server.close()


def test_a_node_that_never_says_its_state_is_watched_after_the_settle_time() -> None:
    """A node whose first state never comes (a constructor that runs on) still sees a stop."""
    from tlaunch.rpc.security import RunKeys
    from tlaunch.rpc.server import RPCServer
    from tlaunch.runtime.node_main import coordinator_client
    from tlaunch.runtime.node_runtime import NodeRuntime, RuntimeConfig

    coord, keys = coordinator(1), RunKeys.generate()
    server = RPCServer(coord, keys, "127.0.0.1", "127.0.0.1", 0, tls_client=True)
    config = RuntimeConfig("r", "c", keys)
    link = coordinator_client(server.address, config)
    runtime = NodeRuntime(config, link, "n/0")
    try:
        runtime.start_watcher(settle=0.3)
        coord.stop("done")
        assert runtime.stop_event().wait(5.0)
    finally:
        runtime.close()
        link.close()
        server.close()


def test_a_closed_runtimes_watcher_ends_when_its_coordinator_is_gone(caplog) -> None:  # type: ignore[no-untyped-def]
    """A launcher's run closed after its coordinator died (a kill -9 of the head): the stop
    watcher ends at its next failed poll, firing and logging nothing, instead of polling on
    for ``coordinator_lost_after`` and then saying it lost the coordinator."""
    from tlaunch.errors import RPCError
    from tlaunch.rpc.security import RunKeys
    from tlaunch.runtime.node_runtime import NodeRuntime, RuntimeConfig

    class Gone:
        def wait_stop(self, key: str | None, timeout: float) -> bool:
            time.sleep(0.05)
            raise RPCError("the coordinator is gone")

    runtime = NodeRuntime(
        RuntimeConfig("r", "c", RunKeys.generate(), coordinator_lost_after=0.5), Gone(), None
    )
    fired: list[bool] = []
    runtime.register_stop_handler(lambda: fired.append(True))
    runtime.start_watcher()
    runtime.close()
    assert runtime._watcher is not None
    runtime._watcher.join(2.0)
    assert not runtime._watcher.is_alive()
    assert fired == [] and "lost the coordinator" not in caplog.text


def test_a_remote_coordinator_sees_the_stop_and_the_end_as_soon_as_its_calls_return() -> None:
    """Over RPC: after ``stop()``, ``wait_stopping`` and ``wait_ended`` the launcher's copy
    already holds what they waited for (no lease renewal needed in between)."""
    from tlaunch.rpc.client import direct_client
    from tlaunch.rpc.security import RunKeys
    from tlaunch.rpc.server import RPCServer
    from tlaunch.runtime.remote import RemoteCoordinator

    coord, keys = coordinator(2), RunKeys.generate()
    server = RPCServer(coord, keys, "127.0.0.1", "127.0.0.1", 0)
    link = RemoteCoordinator(direct_client("coordinator", server.address, keys), "here", 15.0, server.address)
    try:
        assert link.status()["n/0"]["state"] == "pending" and not link.stopping
        coord.node_started("n/0", 1, 1)
        threading.Timer(0.2, coord.stop, ("from elsewhere",)).start()
        assert link.wait_stopping(5.0) and link.stopping and link.stop_reason == "from elsewhere"
        assert link.status()["n/0"]["state"] == "starting"
        for key in ("n/0", "n/1"):
            threading.Timer(0.2, coord.node_finished, (key, True)).start()
        assert link.wait_ended(5.0)
        assert link._summary is not None
        assert {r["state"] for r in link._summary["status"].values()} == {"stopped"}
        other = RemoteCoordinator(direct_client("coordinator", server.address, keys), "here", 15.0)
        other.stop("again")  # the first reason stands, and this link knows it at once
        assert other.stopping and other.stop_reason == "from elsewhere"
        other.client.close()
    finally:
        link.client.close()
        server.close()


def test_waiting_for_the_nodes_to_be_up_returns_once_the_last_is() -> None:
    """``wait_ready``: up is serving (an address), running or done; a stop first, or the time
    running out, answers False; it returns as the last one comes up, not at a later poll."""
    coord = coordinator(3)
    assert not coord.wait_ready(None, 0.05)  # none is up
    coord.register("n/0", "h:1")
    coord.set_state("n/1", "running")
    assert coord.wait_ready(["n/0", "n/1"], 0.0)  # those two are
    assert not coord.wait_ready(None, 0.05)
    threading.Timer(0.2, coord.node_finished, ("n/2", True)).start()
    t0 = time.monotonic()
    assert coord.wait_ready(None, 5.0)
    assert 0.15 < time.monotonic() - t0 < 1.0

    failing = coordinator(2)
    failing.register("n/0", "h:1")
    threading.Timer(0.2, failing.node_finished, ("n/1", False, "Traceback...", 1, "exit 1")).start()
    t0 = time.monotonic()
    assert not failing.wait_ready(None, 5.0)  # the failure stopped the run: it answers at once
    assert time.monotonic() - t0 < 1.0 and failing.stopping


def test_a_remote_coordinator_waits_for_the_nodes_to_be_up_with_one_long_poll() -> None:
    """Over RPC, ``wait_ready`` answers as the last node comes up, and the launcher's copy of the
    status already shows it; a stop before then answers False."""
    from tlaunch.rpc.client import direct_client
    from tlaunch.rpc.security import RunKeys
    from tlaunch.rpc.server import RPCServer
    from tlaunch.runtime.remote import RemoteCoordinator

    coord, keys = coordinator(2), RunKeys.generate()
    server = RPCServer(coord, keys, "127.0.0.1", "127.0.0.1", 0)
    link = RemoteCoordinator(direct_client("coordinator", server.address, keys), "here", 15.0, server.address)
    calls: list[str] = []
    real = link.client.call
    link.client.call = lambda method, *a, **k: (calls.append(method), real(method, *a, **k))[1]  # type: ignore[method-assign]
    try:
        coord.register("n/0", "h:1")
        threading.Timer(0.3, coord.register, ("n/1", "h:2")).start()
        t0 = time.monotonic()
        assert link.wait_ready(None, 5.0)
        assert 0.25 < time.monotonic() - t0 < 1.5
        assert calls == ["wait_ready", "renew"]  # one long poll, then the state it waited for
        assert {k: r["address"] for k, r in link._summary["status"].items()} == {"n/0": "h:1", "n/1": "h:2"}  # type: ignore[index]
        assert link.wait_ready(["n/1"], 0.0)
    finally:
        link.client.close()
        server.close()
    coord = coordinator(2)
    server = RPCServer(coord, keys, "127.0.0.1", "127.0.0.1", 0)
    link = RemoteCoordinator(direct_client("coordinator", server.address, keys), "here", 15.0, server.address)
    try:
        assert not link.wait_ready(None, 0.2)  # the time runs out
        threading.Timer(0.2, coord.stop, ("from elsewhere",)).start()
        t0 = time.monotonic()
        assert not link.wait_ready(None, 10.0)  # the stop answers it
        assert time.monotonic() - t0 < 1.5 and link.stopping
    finally:
        link.client.close()
        server.close()
