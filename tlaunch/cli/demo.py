"""The demo behind ``tlaunch demo``: producers serve ``work()``, a consumer gathers."""

from __future__ import annotations

import time

from tlaunch import lp_ssh as lp

__all__ = ["Consumer", "Producer", "make_program", "run_demo"]


class Producer:
    """Serves ``work()`` over RPC and says where it runs."""

    def work(self, x: int) -> tuple[int, str]:
        return x * x, lp.get_context().host


class Consumer:
    """Calls every producer concurrently, prints what came back, stops the program."""

    def __init__(self, producers: list[lp.Handle]) -> None:
        self._producers = producers

    def run(self) -> None:
        futures = [p.futures.work(i) for i, p in enumerate(self._producers)]  # type: ignore[attr-defined]
        for i, f in enumerate(futures):
            value, host = f.result()
            print(f"producer/{i} on {host}: work({i}) = {value}", flush=True)
        lp.stop()


def make_program(producers: int, hosts: list[str] | None = None) -> lp.Program:
    """Producers spread over ``hosts`` (local when None), the consumer on the first."""
    program = lp.Program("demo")
    with program.group("producer"):
        handles = []
        for i in range(producers):
            node: lp.CourierNode[..., Producer] = lp.CourierNode(Producer)
            if hosts:
                node.to_host(hosts[i % len(hosts)])
            handles.append(program.add_node(node))
    consumer: lp.CourierNode[..., Consumer] = lp.CourierNode(Consumer, handles)
    if hosts:
        consumer.to_host(hosts[0])
    program.add_node(consumer, label="consumer")
    return program


def run_demo(num_hosts: int, producers: int, local: bool = False) -> int:
    """Run the demo on ``num_hosts`` SSH test hosts when they can be made, else locally."""
    from tlaunch.testing.hosts import SSHTestHosts, hosts_unavailable

    reason = "--local was given" if local else hosts_unavailable()
    t0 = time.monotonic()
    if reason is None:
        print(f"tlaunch demo: making {num_hosts} SSH test hosts (network namespaces with their own sshd)")
        with SSHTestHosts(num_hosts) as hosts:
            names = [h.name for h in hosts.hosts]
            spread = ", ".join(names)
            print(f"tlaunch demo: {producers} producers on {spread}, a consumer on {names[0]}, over SSH")
            t1 = time.monotonic()
            # Every node's output streams back here, prefixed with its host and label.
            lp.launch(make_program(producers, names), ssh_config=hosts.ssh_config)
            print(f"program ran in {time.monotonic() - t1:.2f} s on {num_hosts} hosts")
    else:
        print(f"tlaunch demo: no test hosts ({reason}); running on this machine instead")
        lp.launch(make_program(producers))
    print(f"demo finished in {time.monotonic() - t0:.2f} s")
    return 0
