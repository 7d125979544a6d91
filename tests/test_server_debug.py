"""A server's job debugged from a user's machine: ``tlaunch job debug NAME [NODE]`` through the server.

The job's run key stays on the server; the user's terminal holds only their token
(a ``TLAUNCH_HOME`` of its own, empty). Driven through a pty (``pexpect``) as a user
types it; the server is a real process (``tests/server_helpers.py``).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest
from server_helpers import ALICE, BOB, ROOT, Server, error_of, upload, wait_state

from tlaunch.jobs import Client, JobServerError
from tlaunch.server.guard import Guard

PAUSES = """
x = 41
breakpoint()  # pdb stops at the next line: 4
print("after the breakpoint, x =", x, flush=True)
"""
ENDED = ("SUCCEEDED", "FAILED", "STOPPED", "LOST")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("debug") / "home")
    try:
        yield srv
        with srv.client(ROOT) as c:
            for job in c.get("/v1/jobs", params={"limit": 500}).json()["jobs"]:
                c.post(f"/v1/jobs/{job['name']}/stop", params={"owner": job["owner"]})
                wait_state(c, job["name"], ENDED, params={"owner": job["owner"]})
    finally:
        srv.stop()


def _paused_job(srv: Server, name: str) -> dict[str, Any]:
    """Alice's job ``name``, once its trainer waits at its ``breakpoint()``; what the server lists."""
    with srv.client(ALICE) as c:
        pkg = upload(c, {"train.py": PAUSES})
        assert c.post("/v1/trainer/job", json={"job_name": name, "trainer_package": pkg}).status_code == 201
        deadline = time.monotonic() + 90
        while True:
            r = c.get(f"/v1/jobs/{name}/paused")
            if r.status_code == 200 and r.json()["paused"]:
                return dict(r.json())
            assert r.status_code in (200, 409) and time.monotonic() < deadline, r.text  # 409: not started yet
            time.sleep(0.2)


def _user_env(tmp_path: Path, srv: Server, token: str) -> dict[str, str]:
    """A user's shell elsewhere: the server and a token, and a run store of its own with nothing in it."""
    return {
        **os.environ,
        "TLAUNCH_SERVER": srv.url,
        "TLAUNCH_TOKEN": token,
        "TLAUNCH_HOME": str(tmp_path / "mine"),
    }


def test_a_job_at_a_breakpoint_is_debugged_by_its_owner_through_the_server(
    server: Server, tmp_path: Path
) -> None:
    listed = _paused_job(server, "bp")
    assert [(p["node"], p["at"], p["kind"]) for p in listed["paused"]] == [
        ("trainer/0", "train.py:4", "breakpoint")
    ]
    prog = pexpect.spawn(
        sys.executable,
        ["-m", "tlaunch.cli.main", "job", "debug", "bp"],  # the only paused node: no NODE needed
        cwd=str(tmp_path),
        env=_user_env(tmp_path, server, ALICE),
        encoding="utf-8",
        timeout=60,
    )
    try:
        prog.expect(r"tlaunch: attached to trainer/0 .*breakpoint at train.py:4")
        prog.expect(r"\(Pdb\) ")
        prog.sendline("p x + 1")
        prog.expect(r"42\s+\(Pdb\) ")
        prog.sendline("c")
        prog.expect(pexpect.EOF)
    finally:
        prog.close(force=True)
    assert prog.exitstatus == 0, prog.before
    with Client(server.url, ALICE) as c:
        assert c.wait("bp", timeout=60)["state"] == "SUCCEEDED"
        text = "\n".join(line["text"] for line in c.logs("bp"))
    assert "tlaunch: through the job server: tlaunch job debug bp trainer/0" in text, text
    assert "after the breakpoint, x = 41" in text, text
    assert not (tmp_path / "mine").exists()  # nothing of the run's here: no key, no record


def test_a_session_that_is_dropped_lets_the_node_go_on(server: Server) -> None:
    _paused_job(server, "dropped")
    with Client(server.url, ALICE) as c:
        session = c.debug("dropped", "trainer/0")
        assert session.greeting.startswith("tlaunch: attached to trainer/0"), session.greeting
        session.close()  # the terminal went away without a word to pdb
        assert c.wait("dropped", timeout=60)["state"] == "SUCCEEDED"


def test_only_the_jobs_owner_or_an_admin_reaches_its_debugger(server: Server) -> None:
    _paused_job(server, "hers")
    with server.client(BOB) as c:  # another user's job is not found, as one that does not exist
        assert "no job 'hers'" in error_of(c.get("/v1/jobs/hers/paused"), 404)["message"]
    with Client(server.url, BOB) as bob, pytest.raises(JobServerError, match="no job 'hers'") as refused:
        bob.debug("hers", "trainer/0")
    assert refused.value.status == 404
    with Client(server.url, "not-a-token") as nobody, pytest.raises(JobServerError) as refused:
        nobody.debug("hers", "trainer/0")
    assert refused.value.status == 401
    with Client(server.url, ALICE) as alice, pytest.raises(JobServerError, match="no/such") as refused:
        alice.debug("hers", "no/such")
    assert refused.value.status == 404
    with Client(server.url, ROOT) as admin:  # an admin names it with its owner
        assert [p["node"] for p in admin.paused("alice/hers")] == ["trainer/0"]
        session = admin.debug("alice/hers", "trainer/0")
        try:
            session.sock.sendall(b"c\n")
        finally:
            session.close()
        assert admin.wait("alice/hers", timeout=60)["state"] == "SUCCEEDED"


def test_a_websocket_from_another_origin_or_host_is_refused_before_it_is_accepted() -> None:
    """A page of another site may open a WebSocket to a server without tokens on this machine;
    the guard closes its handshake (HTTP 403), as it refuses that page's writes (ASGI, in process)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})

    guard = Guard(app, max_body=1024, upload_path="/up", max_upload=1024, hosts=("here",), same_origin=True)

    async def handshake(headers: dict[str, str]) -> list[Any]:
        sent: list[Any] = []

        async def receive() -> dict[str, str]:
            return {"type": "websocket.connect"}

        async def send(message: Any) -> None:
            sent.append(message)

        raw = [(k.encode(), v.encode()) for k, v in headers.items()]
        await guard({"type": "websocket", "path": "/ws", "headers": raw}, receive, send)
        return sent

    accepted = [{"type": "websocket.accept"}]
    assert asyncio.run(handshake({"host": "here:8765", "origin": "http://here:8765"})) == accepted
    assert asyncio.run(handshake({"host": "here:8765"})) == accepted  # not a browser
    for headers in ({"host": "here:8765", "origin": "http://evil.example"}, {"host": "evil.example"}):
        (closed,) = asyncio.run(handshake(headers))
        assert closed["type"] == "websocket.close" and closed["code"] == 1008, closed
