"""TransmitNode benchmark on the namespace test hosts (needs root).

    python bench/transmit.py [--reps 3] [--out bench/results/transmit.json]

1. Small-message throughput at one server (th1) with 1, 4 and 16 senders spread
   over th2..th4: messages/s with one ``insert`` per message and with
   ``insert_many`` batches of 100. Reference in the same run: the same senders
   making no-op calls to a CourierNode on th1 (the RPC ceiling).
2. A 64 MiB weights dict delivered to 8 readers (2 on each of th1..th4): one
   server (star) against a root with two middle servers fed by relays (tree).
   Time from ``insert_weight`` to the last reader holding the weights.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import numpy as np
import plots  # bench/plots.py, beside this script

from tlaunch import lp_ssh as lp
from tlaunch.testing.hosts import SSHTestHosts, hosts_unavailable

MSG = {"obs": list(range(16)), "reward": 1.0, "step": 0}


class Noop:
    def ping(self, item: object) -> None:
        return None


class Sender:
    """Waits for the go board, sends ``n`` messages, reports its span."""

    def __init__(self, server: Any, target: Any, mode: str, n: int) -> None:
        self.server, self.target, self.mode, self.n = server, target, mode, n

    def run(self) -> None:
        self.server.get("go", timeout=120)
        t0 = time.time()
        if self.mode == "insert":
            for i in range(self.n):
                self.target.insert("data", {**MSG, "step": i})
        elif self.mode == "batch":
            for start in range(0, self.n, 100):
                self.target.insert_many("data", [{**MSG, "step": i} for i in range(start, start + 100)])
        else:
            for i in range(self.n):
                self.target.ping({**MSG, "step": i})
        self.server.insert("spans", (t0, time.time(), self.n))


def throughput(hosts: SSHTestHosts, senders: int, mode: str, n: int) -> float:
    program = lp.Program(f"tput-{mode}-{senders}")
    server = program.add_node(
        lp.TransmitNode({"data": lp.Table("data", "queue", 10**7), "go": "latest", "spans": "queue"}).to_host(
            "th1"
        ),
        label="server",
    )
    target = server
    if mode == "rpc":
        target = program.add_node(lp.CourierNode(Noop).to_host("th1"), label="noop")
    names = [h.name for h in hosts.hosts[1:]]
    with program.group("sender"):
        for i in range(senders):
            program.add_node(lp.PyClassNode(Sender, server, target, mode, n).to_host(names[i % len(names)]))
    with lp.launch(program, wait=False, ssh_config=hosts.ssh_config, terminal="output_to_files") as run:
        client = server.dereference()
        while (
            sum(1 for k, v in run.status().items() if k.startswith("sender") and v["state"] == "running")
            < senders
        ):
            time.sleep(0.01)
        client.insert("go", True)
        spans = [client.get("spans", timeout=300) for _ in range(senders)]
        if mode != "rpc":
            assert client.size("data") == senders * n
    start, end = min(s[0] for s in spans), max(s[1] for s in spans)
    return sum(s[2] for s in spans) / (end - start)


def _check(run: lp.Run) -> None:
    if run.done:
        raise SystemExit(f"the benchmark's run ended early: {run.failure() or run.status()}")


def make_weights() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {
        f"layer{i}": {"w": rng.standard_normal((1024, 2048), dtype=np.float32)} for i in range(8)
    }  # 64 MiB


class Publisher:
    def __init__(self, server: Any, board: Any) -> None:
        self.server, self.board = server, board

    def run(self) -> None:
        weights = make_weights()
        self.board.get("go", timeout=120)
        t0 = time.time()
        self.server.insert_weight(weights)
        self.board.insert("spans", ("publish", t0))


class Relay:
    def __init__(self, source: Any, sink: Any) -> None:
        self.source, self.sink = source, sink

    def run(self) -> None:
        self.sink.insert_weight(self.source.get_weight(timeout=300))


class Reader:
    def __init__(self, server: Any, board: Any) -> None:
        self.server, self.board = server, board

    def run(self) -> None:
        weights = self.server.get_weight(timeout=300)
        done = time.time()
        assert sum(a["w"].nbytes for a in weights.values()) == 64 * 2**20
        self.board.insert("spans", ("read", done))


def weights_delivery(hosts: SSHTestHosts, shape: str) -> float:
    names = [h.name for h in hosts.hosts]
    program = lp.Program(f"weights-{shape}")
    board = program.add_node(
        lp.TransmitNode({"go": "latest", "spans": "queue"}).to_host("th1"), label="board"
    )
    root = program.add_node(lp.TransmitNode().to_host("th1"), label="root")
    program.add_node(lp.PyClassNode(Publisher, root, board).to_host("th1"), label="publisher")
    sources = [root, root]
    if shape == "tree":
        with program.group("middle"):
            sources = [program.add_node(lp.TransmitNode().to_host(h)) for h in (names[1], names[2])]
        with program.group("relay"):
            for middle, h in zip(sources, (names[1], names[2]), strict=True):
                program.add_node(lp.PyClassNode(Relay, root, middle).to_host(h))
    with program.group("reader"):
        for i in range(8):
            program.add_node(lp.PyClassNode(Reader, sources[i % 2], board).to_host(names[i % len(names)]))
    with lp.launch(program, wait=False, ssh_config=hosts.ssh_config, terminal="output_to_files") as run:
        client = board.dereference()
        while any(v["state"] in ("pending", "starting") for v in run.status().values()):
            _check(run)
            time.sleep(0.01)
        client.insert("go", True)
        spans = [client.get("spans", timeout=300) for _ in range(9)]
    t0 = next(t for kind, t in spans if kind == "publish")
    return max(t for kind, t in spans if kind == "read") - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--messages", type=int, default=2000, help="messages per sender")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "transmit.json"))
    args = parser.parse_args()
    reason = hosts_unavailable()
    if reason:
        raise SystemExit(f"bench/transmit.py needs SSH test hosts: {reason}")
    results: dict[str, Any] = {"messages_per_sender": args.messages, "reps": args.reps, "throughput": {}}
    with SSHTestHosts(4) as hosts:
        for senders in (1, 4, 16):
            row = {}
            for mode in ("insert", "batch", "rpc"):
                n = args.messages * (10 if mode == "batch" else 1)
                rates = [throughput(hosts, senders, mode, n) for _ in range(args.reps)]
                row[mode] = round(statistics.median(rates))
                print(
                    f"senders={senders:2d} {mode:6s}: {row[mode]:>9,} msg/s (median of {args.reps})",
                    flush=True,
                )
            row["insert_vs_rpc"] = round(row["insert"] / row["rpc"], 2)
            results["throughput"][str(senders)] = row
        results["weights_64mib_8_readers_s"] = {}
        for shape in ("star", "tree"):
            times = [weights_delivery(hosts, shape) for _ in range(args.reps)]
            results["weights_64mib_8_readers_s"][shape] = round(statistics.median(times), 3)
            print(f"64 MiB to 8 readers, {shape}: {statistics.median(times):.2f} s", flush=True)
    w = results["weights_64mib_8_readers_s"]
    results["tree_vs_star"] = round(w["tree"] / w["star"], 2)
    results["cpus"] = os.cpu_count()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    plots.plot_file(args.out, "transmit")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
