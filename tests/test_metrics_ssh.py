"""Resource metrics of a run on SSH test hosts: each supervisor samples its node, ``tlaunch top`` shows it."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from tlaunch import control, lp_ssh

pytestmark = pytest.mark.ssh


class Idle:
    def ping(self) -> str:
        return lp_ssh.get_context().host


class Hog:
    def __init__(self) -> None:
        self.held: bytearray | None = None

    def allocate(self, mib: int) -> float:
        """Take ``mib`` MiB (every page touched); returns when."""
        self.held = bytearray(mib << 20)
        for i in range(0, len(self.held), 4096):
            self.held[i] = 1
        return time.time()


def test_top_shows_a_node_that_takes_500_mb_first_within_3_s(ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    program = lp_ssh.Program("top")
    hosts = ["th1", "th2", "th3", "th4"]
    with program.group("idle"):
        for i in range(7):
            program.add_node(lp_ssh.CourierNode(Idle).to_host(hosts[i % 4]))
    hog = program.add_node(lp_ssh.CourierNode(Hog).to_host("th3"), label="hog")
    with lp_ssh.launch(program, wait=False, ssh_config=ssh_hosts.ssh_config) as run:
        assert run.wait_ready(timeout=60)
        handle = control.find_run(run.run_id)
        deadline = time.monotonic() + 10
        while len([r for r in control.metrics.top(handle) if r.last is not None]) < 8:
            assert time.monotonic() < deadline, "not every node was sampled within 10 s"
            time.sleep(0.2)
        took = hog.dereference().allocate(500)
        while True:
            first = control.metrics.top(handle, sort="mem")[0]
            if first.node == "hog/0" and first.last is not None and first.last.rss > 500 << 20:
                break
            assert time.time() - took < 3.0, (
                f"hog/0 not first after 3 s: {control.metrics.top(handle, 'mem')}"
            )
            time.sleep(0.1)
        seen = time.time() - took
        assert seen < 3.0
        assert first.host == "th3" and first.state == "serving"
        out = subprocess.run(
            [sys.executable, "-m", "tlaunch.cli.main", "top", run.run_id, "--once", "--sort", "mem"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        rows = [line for line in out.stdout.splitlines() if re.match(r"│ (hog|idle)/\d", line)]
        assert len(rows) == 8, out.stdout
        assert re.match(r"│ hog/0 +│ th3 +│ serving +│ +\d+ │ +5\d\d\.\d MiB", rows[0]), out.stdout
        samples = control.metrics.samples(handle)
        assert set(samples) == {f"idle/{i}" for i in range(7)} | {"hog/0"}
        assert all(s.procs >= 1 and s.threads >= 1 and s.fds > 0 for v in samples.values() for s in v)
    assert ssh_hosts.leftovers(run.run_id) == {}
