"""The seed's data-transfer types as programs: star, tree and net.

Workers send numbered messages through ``TransmitNode`` queues; consumers
check that every message arrives exactly once and print one ``RESULT {json}``
line; each program ends by itself.

Not run by itself: the module that star_type.py, tree_type.py and net_type.py run.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tlaunch import lp_ssh as lp


class Worker:
    """Sends ``messages`` numbered messages to every server it is given, then posts its info."""

    def __init__(self, worker_id: int, servers: list[Any], messages: int, batch: int = 50) -> None:
        self.worker_id = worker_id
        self.servers = servers
        self.messages = messages
        self.batch = batch

    def run(self) -> None:
        host = lp.get_context().host
        for start in range(0, self.messages, self.batch):
            items = [
                {"worker": self.worker_id, "seq": s, "host": host}
                for s in range(start, min(start + self.batch, self.messages))
            ]
            for server in self.servers:
                server.insert_many("data", items)
        for server in self.servers:
            server.send_info({"worker": self.worker_id, "sent": self.messages, "at": time.time()})


class Relay:
    """A middle node of the tree: forwards everything of its server's queue to the root."""

    def __init__(self, source: Any, sink: Any, expected: int) -> None:
        self.source, self.sink, self.expected = source, sink, expected

    def run(self) -> None:
        moved = 0
        while moved < self.expected:
            items = self.source.get_many("data", 200, timeout=120)
            self.sink.insert_many("data", items)
            moved += len(items)
        self.sink.send_info(self.source.get_info(timeout=60))
        print(f"relay on {lp.get_context().host} forwarded {moved}", flush=True)


class Consumer:
    """Reads ``expected`` messages from its server, checks them, prints the RESULT, ends."""

    def __init__(self, server: Any, expected: int, name: str, stop_program: bool = True) -> None:
        self.server, self.expected, self.name, self.stop_program = server, expected, name, stop_program

    def run(self) -> None:
        seen: dict[tuple[int, int], int] = {}
        t0 = time.monotonic()
        while sum(seen.values()) < self.expected:
            for item in self.server.get_many("data", 500, timeout=120):
                key = (item["worker"], item["seq"])
                seen[key] = seen.get(key, 0) + 1
        info = self.server.get_info(timeout=60)
        result = {
            "consumer": self.name,
            "host": lp.get_context().host,
            "received": sum(seen.values()),
            "unique": len(seen),
            "duplicates": sum(n - 1 for n in seen.values()),
            "workers": sorted({w for w, _ in seen}),
            "info_sent": info["sent"],
            "left_in_queue": self.server.size("data"),
            "seconds": round(time.monotonic() - t0, 3),
        }
        print("RESULT " + json.dumps(result), flush=True)


def star(hosts: list[str], workers_per_host: int = 2, messages: int = 500) -> lp.Program:
    """One server on hosts[0]; workers on hosts[1:]; a consumer beside the server."""
    program = lp.Program("star")
    server = program.add_node(lp.TransmitNode({"data": "queue"}).to_host(hosts[0]), label="server")
    workers = [h for h in hosts[1:] or hosts for _ in range(workers_per_host)]
    with program.group("worker"):
        for i, host in enumerate(workers):
            program.add_node(lp.SSHNode(Worker, i, [server], messages).to_host(host))
    program.add_node(
        lp.SSHNode(Consumer, server, len(workers) * messages, "root").to_host(hosts[0]), label="consumer"
    )
    return program


def tree(hosts: list[str], workers_per_host: int = 1, messages: int = 500) -> lp.Program:
    """Root server on hosts[0], two middle servers on hosts[1], hosts[2]; leaves on every host."""
    program = lp.Program("tree")
    root = program.add_node(lp.TransmitNode({"data": "queue"}).to_host(hosts[0]), label="root")
    middle_hosts = [hosts[1 % len(hosts)], hosts[2 % len(hosts)]]
    with program.group("middle"):
        middles = [program.add_node(lp.TransmitNode({"data": "queue"}).to_host(h)) for h in middle_hosts]
    leaves = [h for h in hosts for _ in range(workers_per_host)]
    per_middle = [0, 0]
    with program.group("leaf"):
        for i, host in enumerate(leaves):
            program.add_node(lp.SSHNode(Worker, i, [middles[i % 2]], messages).to_host(host))
            per_middle[i % 2] += messages
    with program.group("relay"):
        for middle, host, expected in zip(middles, middle_hosts, per_middle, strict=True):
            program.add_node(lp.SSHNode(Relay, middle, root, expected).to_host(host))
    program.add_node(
        lp.SSHNode(Consumer, root, len(leaves) * messages, "root").to_host(hosts[0]), label="consumer"
    )
    return program


class Joiner:
    """Ends the net program once every consumer has printed its result."""

    def __init__(self, board: Any, consumers: int) -> None:
        self.board, self.consumers = board, consumers

    def run(self) -> None:
        while self.board.size("done") < self.consumers:
            time.sleep(0.05)
        lp.stop()


class NetConsumer(Consumer):
    """A net consumer: reports to the shared board when done instead of stopping the program."""

    def __init__(self, server: Any, expected: int, name: str, board: Any) -> None:
        super().__init__(server, expected, name)
        self.board = board

    def run(self) -> None:
        super().run()
        self.board.insert("done", self.name)
        lp.wait_for_stop()


def net(hosts: list[str], workers_per_host: int = 1, messages: int = 300) -> lp.Program:
    """Every host a server with its consumer; every worker sends to every server."""
    program = lp.Program("net")
    with program.group("server"):
        servers = [program.add_node(lp.TransmitNode({"data": "queue"}).to_host(h)) for h in hosts]
    board = program.add_node(lp.TransmitNode({"done": "replay"}).to_host(hosts[0]), label="board")
    workers = [h for h in hosts for _ in range(workers_per_host)]
    with program.group("worker"):
        for i, host in enumerate(workers):
            program.add_node(lp.SSHNode(Worker, i, servers, messages).to_host(host))
    with program.group("consumer"):
        for j, (server, host) in enumerate(zip(servers, hosts, strict=True)):
            program.add_node(
                lp.SSHNode(NetConsumer, server, len(workers) * messages, f"server{j}", board).to_host(host)
            )
    program.add_node(lp.SSHNode(Joiner, board, len(hosts)).to_host(hosts[0]), label="joiner")
    return program


def run_example(builder: Any) -> None:
    """``main`` of the three example scripts: ``builder`` on 4 hosts, ``--messages`` per worker."""
    import os
    import sys

    from absl import app, flags

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from hosts_flag import example_hosts

    flags.DEFINE_integer("messages", 500, "Messages per worker.")

    def main(_: list[str]) -> None:
        with example_hosts(4) as (hosts, ssh_config):
            program = builder(hosts, messages=flags.FLAGS.messages)
            lp.launch(program, terminal="ssh_tmux_session", ssh_config=ssh_config)

    app.run(main)
