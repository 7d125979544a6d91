"""The run's coordinator on its own (no processes): long polls and the launcher's lease."""

from __future__ import annotations

import threading
import time

from tlaunch import lp_ssh as lp
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
    coord.lease()
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
    assert summary == coord.summary()
