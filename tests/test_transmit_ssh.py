"""TransmitNode across the SSH test hosts: star, tree and net; weights; stop unblocks."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from typing import Any

import numpy as np
import pytest

from tlaunch import lp_ssh as lp
from tlaunch.ssh import connect_all

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "trans_types"))

import topologies

pytestmark = pytest.mark.ssh


def node_logs(ssh_hosts: Any, run: lp.Run, label: str) -> dict[str, str]:
    """The logs of every node labelled ``label``, by key, read from their hosts."""
    status = run.status()
    keys = [k for k in status if k.rsplit("/", 1)[0] == label]
    hosts = sorted({status[k]["host"] for k in keys})
    conns = connect_all(hosts, ssh_config=ssh_hosts.ssh_config)
    try:
        logs = {}
        for k in keys:
            path = f".tlaunch/runs/{run.run_id}/logs/{label}_{k.rsplit('/', 1)[1]}.log"
            out = conns[status[k]["host"]].run(["cat", path], check=False)  # not there yet: ""
            logs[k] = out.stdout
        return logs
    finally:
        for conn in conns.values():
            conn.close()


def results(ssh_hosts: Any, run: lp.Run, label: str = "consumer") -> list[dict[str, Any]]:
    out = []
    for log in node_logs(ssh_hosts, run, label).values():
        out += [json.loads(line[len("RESULT ") :]) for line in log.splitlines() if line.startswith("RESULT ")]
    return out


def hosts(ssh_hosts: Any) -> list[str]:
    return [h.name for h in ssh_hosts.hosts]


def test_star(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    names = hosts(ssh_hosts)
    run = lp.launch(
        topologies.star(names, 2, 400), ssh_config=ssh_hosts.ssh_config, terminal="output_to_files"
    )
    (res,) = results(ssh_hosts, run)
    workers = 2 * (len(names) - 1)
    assert res["received"] == res["unique"] == workers * 400 and res["duplicates"] == 0
    assert res["workers"] == list(range(workers)) and res["left_in_queue"] == 0
    assert res["info_sent"] == 400  # the board holds a latest value
    assert ssh_hosts.leftovers(run.run_id) == {}


def test_tree(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    names = hosts(ssh_hosts)
    run = lp.launch(
        topologies.tree(names, 1, 400), ssh_config=ssh_hosts.ssh_config, terminal="output_to_files"
    )
    (res,) = results(ssh_hosts, run)
    assert res["received"] == res["unique"] == len(names) * 400 and res["duplicates"] == 0
    assert res["workers"] == list(range(len(names))) and res["info_sent"] == 400
    relays = node_logs(ssh_hosts, run, "relay")
    assert sorted(int(log.split("forwarded ")[1]) for log in relays.values()) == [800, 800]
    assert {run.status()[k]["host"] for k in relays} == {"th2", "th3"}
    assert ssh_hosts.leftovers(run.run_id) == {}


def test_net(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    names = hosts(ssh_hosts)
    run = lp.launch(
        topologies.net(names, 1, 300), ssh_config=ssh_hosts.ssh_config, terminal="output_to_files"
    )
    res = results(ssh_hosts, run)
    assert sorted(r["host"] for r in res) == names
    for r in res:  # every server got every message of every worker, once
        assert r["received"] == r["unique"] == len(names) * 300 and r["duplicates"] == 0
        assert r["workers"] == list(range(len(names))) and r["left_in_queue"] == 0
    assert ssh_hosts.leftovers(run.run_id) == {}


def make_state(seed: int = 0) -> dict[str, Any]:
    """A 64 MiB state dict: two layers of float32 weights."""
    rng = np.random.default_rng(seed)
    return {
        "layer1": {"w": rng.standard_normal((2048, 4096), dtype=np.float32)},  # 32 MiB
        "layer2": {
            "w": rng.standard_normal((2048, 4095), dtype=np.float32),
            "b": np.arange(4096, dtype=np.float32),
        },
    }


def digest(state: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for layer in sorted(state):
        for name in sorted(state[layer]):
            h.update(np.ascontiguousarray(state[layer][name]).tobytes())
    return h.hexdigest()


class WeightPublisher:
    def __init__(self, server: Any) -> None:
        self.server = server

    def run(self) -> None:
        state = make_state()
        self.server.insert_weight(state)
        print("published", digest(state), flush=True)


class WeightReader:
    def __init__(self, server: Any) -> None:
        self.server = server

    def run(self) -> None:
        state = self.server.get_weight(timeout=120)
        print("RESULT " + json.dumps({"digest": digest(state), "host": lp.get_context().host}), flush=True)


def test_weights_64mib_reach_three_hosts_intact(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    names = hosts(ssh_hosts)
    program = lp.Program("weights")
    server = program.add_node(lp.TransmitNode().to_host(names[0]), label="server")
    program.add_node(lp.SSHNode(WeightPublisher, server).to_host(names[0]), label="publisher")
    with program.group("reader"):
        for host in names[1:]:
            program.add_node(lp.SSHNode(WeightReader, server).to_host(host))
    run = lp.launch(program, ssh_config=ssh_hosts.ssh_config, terminal="output_to_files")
    want = digest(make_state())
    got = results(ssh_hosts, run, "reader")
    assert sorted(r["host"] for r in got) == names[1:]
    assert all(r["digest"] == want for r in got)
    assert sum(a.nbytes for layer in make_state().values() for a in layer.values()) >= 64 * 2**20
    assert ssh_hosts.leftovers(run.run_id) == {}


class Waiter:
    """Blocks on an empty queue forever; reports how the wait ended."""

    def __init__(self, server: Any, what: str) -> None:
        self.server, self.what = server, what

    def run(self) -> None:
        print("waiting", flush=True)
        try:
            if self.what == "get":
                self.server.get("data")
            elif self.what == "info":
                self.server.get_info()
            else:
                self.server.sample("replay", 4)
        except (lp.TransmitStopped, lp.RPCError) as exc:
            print(f"unblocked by {type(exc).__name__}", flush=True)


def test_stop_unblocks_every_waiting_get(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    import time

    names = hosts(ssh_hosts)
    program = lp.Program("unblock")
    server = program.add_node(
        lp.TransmitNode({"data": "queue", "replay": "replay"}).to_host(names[0]), label="server"
    )
    with program.group("waiter"):
        for host, what in zip(names[1:], ["get", "info", "sample"], strict=True):
            program.add_node(lp.SSHNode(Waiter, server, what).to_host(host))
    run = lp.launch(
        program, wait=False, ssh_config=ssh_hosts.ssh_config, terminal="output_to_files", stop_grace=10
    )
    try:
        deadline = time.monotonic() + 30
        while sum("waiting" in log for log in node_logs(ssh_hosts, run, "waiter").values()) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(0.5)
        t0 = time.monotonic()
        run.stop()
        assert time.monotonic() - t0 < 8  # well inside the grace period: nobody needed SIGTERM
    finally:
        run.stop()
    logs = node_logs(ssh_hosts, run, "waiter")
    assert all("unblocked by" in log for log in logs.values()), logs
    assert {v["state"] for v in run.status().values()} <= {"stopped", "done"}
    assert ssh_hosts.leftovers(run.run_id) == {}


def test_restarted_server_keeps_its_checkpointed_data(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    program = lp.Program("ckpt")
    server = program.add_node(
        lp.TransmitNode({"data": "queue"}, checkpoint_path="transmit.ckpt").to_host("th2"), label="server"
    )
    run = lp.launch(
        program,
        wait=False,
        ssh_config=ssh_hosts.ssh_config,
        max_restarts=1,
        restart_backoff=0.1,
        terminal="output_to_files",
    )
    try:
        client = server.dereference()
        client.insert_many("data", list(range(100)))
        client.send_info("before the crash")
        assert client.checkpoint() == "transmit.ckpt"
        pid = run.status()["server/0"]["pid"]
        conn = connect_all(["th2"], ssh_config=ssh_hosts.ssh_config)["th2"]
        try:
            conn.run(["kill", "-9", str(pid)])
        finally:
            conn.close()
        # A call racing the kill may be lost ("may or may not have run"): wait for the new server.
        deadline = time.monotonic() + 30
        while not (run.status()["server/0"]["restarts"] == 1 and run.status()["server/0"]["pid"] != pid):
            assert time.monotonic() < deadline, run.status()
            time.sleep(0.05)
        assert [client.get("data", timeout=30) for _ in range(100)] == list(range(100))
        assert client.get_info() == "before the crash"
        assert run.status()["server/0"]["restarts"] == 1
    finally:
        run.stop()
    assert ssh_hosts.leftovers(run.run_id) == {}
