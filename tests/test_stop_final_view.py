"""``tlaunch ps RUN`` right after ``tlaunch stop RUN`` shows the run's nodes as they ended.

The race that showed them ``serving``/``running`` under a run that said ``ended (stopped)``: a
detached run's head exits as soon as its nodes have ended; the stopper learnt that they had
ended (``wait_ended``) and asked for their final states in a second call, which found the head
gone, and recorded the states it had seen before the stop. The final states now come in the
answer that says the run ended (``Coordinator.wait_ended_renew``), and a teardown that found
nothing left never records a node as up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from userpath import run_as_user, says

from tlaunch import lp_ssh as lp
from tlaunch.plan import make_plan
from tlaunch.rpc.client import direct_client
from tlaunch.rpc.security import RunKeys
from tlaunch.rpc.server import RPCServer
from tlaunch.runtime.coordinator import Coordinator
from tlaunch.runtime.remote import RemoteCoordinator


class HeadThatExits:
    """What a detached run's head serves: its coordinator, until it has answered that every node
    ended; it exits then, so a later call gets no answer (its connection drops)."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.server: RPCServer | None = None
        self.gone = False

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.coord, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.gone:  # the head has exited: this call's connection drops unanswered
                assert self.server is not None
                threading.Thread(target=self.server.close).start()
                time.sleep(0.5)
                raise ConnectionError("the head has exited")
            answer = method(*args, **kwargs)
            if name.startswith("wait_ended") and (
                answer is True or (isinstance(answer, tuple) and answer[0])
            ):
                self.gone = True
            return answer

        return call


def test_the_stoppers_view_is_final_when_the_head_exits_as_the_nodes_end() -> None:
    program = lp.Program("p")
    for label in ("server", "loop"):
        program.add_node(lp.PyNode(print), label=label)
    coord, keys = Coordinator(make_plan(program)), RunKeys.generate()
    head = HeadThatExits(coord)
    head.server = server = RPCServer(head, keys, "127.0.0.1", "127.0.0.1", 0)
    link = RemoteCoordinator(direct_client("coordinator", server.address, keys), "head", 15.0, server.address)
    try:
        coord.node_started("server/0", 1, 1)
        coord.set_state("server/0", "serving")
        coord.node_started("loop/0", 2, 2)
        coord.set_state("loop/0", "running")
        link.stop("`tlaunch stop`")  # the stopper's view: serving, running, stopping
        assert {r["state"] for r in link.status().values()} == {"serving", "running"}
        for key in ("server/0", "loop/0"):  # the supervisors report the ends
            threading.Timer(0.2, coord.node_finished, (key, True, None, -15, "stopped with the run")).start()
        assert link.wait_ended(10.0)
        assert {k: r["state"] for k, r in link.status().items()} == {
            "server/0": "stopped",
            "loop/0": "stopped",
        }
    finally:
        link.client.close()
        server.close()


def test_a_view_that_missed_the_ends_of_nodes_torn_down_says_stopped() -> None:
    """After a teardown that found nothing of the run left (its wait for the ends ran out)."""
    link = RemoteCoordinator(None, "head", 15.0)  # type: ignore[arg-type]  # no calls: its view only
    link._summary = {
        "status": {"a/0": {"state": "serving"}, "b/0": {"state": "failed", "reason": "x"}},
        "stopping": True,
    }
    link.torn_down()
    assert link._summary["status"]["a/0"]["state"] == "stopped"
    assert link._summary["status"]["b/0"] == {"state": "failed", "reason": "x"}


PROGRAM = """\
import time
from tlaunch import lp_ssh as lp

class Server:
    def ping(self):
        return 1

def loop():
    while True:
        time.sleep(0.1)

p = lp.Program("psrace")
for host in ("th1", "th2"):
    p.add_node(lp.CourierNode(Server).to_host(host), label="server")
    p.add_node(lp.PyNode(loop).to_host(host), label="loop")
run = lp.launch(p, wait=False, stop_grace=1.0)
run.wait_ready(["server"], timeout=60)
print(run.run_id, flush=True)
run.detach()
"""


@pytest.mark.ssh
def test_tlaunch_ps_right_after_tlaunch_stop_shows_every_node_ended(
    ssh_hosts, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """As a user: a detached program on two hosts, ``tlaunch stop``, then ``tlaunch ps`` at once
    (three times: before, one in two such stops showed the nodes up)."""
    monkeypatch.setenv("TLAUNCH_SSH_CONFIG", ssh_hosts.ssh_config)
    (tmp_path / "prog.py").write_text(PROGRAM)
    for _ in range(3):
        launched = run_as_user(["python", "prog.py"], tmp_path, timeout=120)
        assert launched.returncode == 0, says(launched)
        run_id = launched.stdout.split()[0]
        stopped = run_as_user(["tlaunch", "stop", run_id], tmp_path, timeout=120)
        assert stopped.returncode == 0, says(stopped)
        ps = run_as_user(["tlaunch", "ps", run_id], tmp_path, timeout=60)
        rows = [line for line in ps.stdout.splitlines() if line.startswith("│ ")]
        assert f"run {run_id} (psrace, ssh): ended (stopped)" in ps.stdout, says(ps)
        assert len(rows) == 4 and all(" stopped " in r for r in rows), says(ps)
        assert ssh_hosts.wait_no_leftovers(run_id, 10) == {}
