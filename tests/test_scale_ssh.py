"""Many SSH test hosts, one node each: launch, call every node, tear down with nothing left (slow).

The issue's case is 256 hosts: ``TLAUNCH_SCALE_HOSTS=256 pytest tests/test_scale_ssh.py``
(past 240 the test hosts take a /22). It takes 2 to 3 minutes on a 2-core machine (512
Python processes start on it) and ~8 GiB of memory, so the suite runs it with 32 hosts
(~20 s) unless told otherwise. It prints the launcher's CPU time per host (its own process
and its children, from ``launch()`` to the end of ``stop()``); ``bench/scale.py`` measures
that against the tlaunch before, ``bench/footprint.py`` what the run holds.
"""

from __future__ import annotations

import os
import resource
import socket
import threading
import time

import pytest

from tlaunch import lp_ssh as lp

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

HOSTS = int(os.environ.get("TLAUNCH_SCALE_HOSTS", "32"))


class Echo:
    def name(self) -> str:
        return socket.gethostname()


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.mark.timeout(1800)
def test_a_node_on_every_one_of_many_hosts(capsys: pytest.CaptureFixture[str]) -> None:
    from tlaunch.testing.hosts import SSHTestHosts, hosts_unavailable

    reason = hosts_unavailable()
    if reason:
        pytest.skip(reason)
    with SSHTestHosts(HOSTS) as hosts:
        names = [h.name for h in hosts.hosts]
        program = lp.Program("scale")
        handles = [program.add_node(lp.CourierNode(Echo).to_host(n), label=n) for n in names]
        fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
        c0, t0 = cpu_seconds(), time.monotonic()
        run = lp.launch(program, wait=False, ssh_config=hosts.ssh_config)
        c1, t1 = cpu_seconds(), time.monotonic()
        assert [h.dereference().name() for h in handles] == names  # every node answers, from its host
        c2, t2 = cpu_seconds(), time.monotonic()
        run.stop()
        c3, t3 = cpu_seconds(), time.monotonic()
        left = hosts.leftovers(run.run_id)
        assert left == {}, f"left on {len(left)} hosts, e.g. {next(iter(left.items()))}"
        deadline = time.monotonic() + 5.0  # the closed connections' threads end within a second
        while threading.active_count() > threads + 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(os.listdir("/proc/self/fd")) <= fds + 2, "the launcher kept connections open"
        assert threading.active_count() <= threads + 2, [t.name for t in threading.enumerate()]
        with capsys.disabled():
            print(
                f"\n{HOSTS} hosts x 1 node: launch {t1 - t0:.1f} s, calls {t2 - t1:.1f} s,"
                f" stop {t3 - t2:.1f} s; the launcher's CPU per host:"
                f" {1000 * (c1 - c0) / HOSTS:.1f} ms launch, {1000 * (c3 - c2) / HOSTS:.1f} ms stop"
                f" ({1000 * (c1 - c0 + c3 - c2) / HOSTS:.1f} ms both), {1000 * (c3 - c0) / HOSTS:.1f} ms"
                " with the calls"
            )
