"""The job server's hot paths against a real server process: submit answers at once, lists page.

A submit answers ``PENDING`` before the job's launcher has started; a launch
that fails turns the job ``FAILED`` with the reason; a server killed between
its answers and the launches launches every job when it starts again, each
once; ``Client.list()`` and ``tlaunch job ls`` show every one of 120 jobs (or
say how many they leave out); the client sends a GET again when the
connection it reused was closed under it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from server_helpers import ALICE, ROOT, TRAINER, Server  # noqa: E402
from server_helpers import launched as _launched  # noqa: E402
from server_helpers import upload as _upload  # noqa: E402
from server_helpers import wait_state as _wait  # noqa: E402

ENDED = ("SUCCEEDED", "FAILED", "STOPPED", "LOST")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the module that launches one job at a time (the others wait, PENDING)."""
    home = tmp_path_factory.mktemp("speed") / "home"
    srv = Server(home, extra=["--max-starting", "1"])
    try:
        yield srv
        with srv.client(ROOT) as c:
            for job in c.get("/v1/jobs", params={"limit": 500}).json()["jobs"]:
                if job["state"] not in ENDED:
                    c.post(f"/v1/jobs/{job['name']}/stop")
            for job in c.get("/v1/jobs", params={"limit": 500}).json()["jobs"]:
                _wait(c, job["name"], ENDED)
    finally:
        srv.stop()


def test_a_submit_answers_before_the_launcher_starts_and_a_failed_launch_fails_the_job(
    server: Server,
) -> None:
    from tlaunch import control

    with server.client() as c:
        pkg = _upload(c, {"train.py": TRAINER})
        r = c.post("/v1/trainer/job", json={"job_name": "at-once", "trainer_package": pkg})
        answered = time.time()
        assert r.status_code == 201, r.text
        job = r.json()
        assert job["state"] == "PENDING" and job["refs"]["run_id"] is None and job["nodes"] == [], job
        assert "waiting for its launcher" in job["message"], job
        run_id = _launched(c, "at-once")["refs"]["run_id"]
        assert _wait(c, "at-once", ENDED)["state"] == "SUCCEEDED"
        # The run was recorded by its launcher, a process that began after the answer.
        assert control.find_run(run_id, str(server.home)).snapshot().created > answered
        # A launch that fails (a host nobody can resolve): answered PENDING, then FAILED with why.
        body = {"job_name": "no-host", "trainer_package": pkg, "hosts": ["no-such-host.invalid"]}
        r = c.post("/v1/trainer/job", json=body)
        assert r.status_code == 201 and r.json()["state"] == "PENDING", r.text
        job = _wait(c, "no-host", ENDED)
        assert job["state"] == "FAILED" and "could not start" in job["message"], job
        assert "no-such-host.invalid" in job["message"], job
        assert job["refs"]["run_id"] is None


def test_a_server_killed_between_its_answers_and_the_launches_launches_each_job_once(
    server: Server,
) -> None:
    names = [f"queued-{i}" for i in range(6)]
    with server.client() as c:
        pkg = _upload(c, {"train.py": TRAINER})
        for name in names:  # one launch at a time: most are still waiting when the server dies
            r = c.post("/v1/trainer/job", json={"job_name": name, "trainer_package": pkg, "args": ["1"]})
            assert r.status_code == 201 and r.json()["state"] == "PENDING", r.text
        waiting = [j["name"] for j in c.get("/v1/jobs", params={"state": "pending"}).json()["jobs"]]
    server.kill()
    assert len(set(waiting) & set(names)) >= 3, waiting  # killed with jobs accepted, not launched
    server.start()
    with server.client() as c:
        jobs = [_wait(c, name, ENDED, timeout=120) for name in names]
    assert [j["state"] for j in jobs] == ["SUCCEEDED"] * len(names), jobs
    runs = {j["refs"]["run_id"] for j in jobs}
    assert len(runs) == len(names) and None not in runs, runs
    recorded = [p.name for p in (server.home / "runs").iterdir() if p.name.startswith("queued-")]
    assert sorted(recorded) == sorted(runs), recorded  # none launched twice


def test_the_client_and_the_cli_list_every_one_of_120_jobs(server: Server, tmp_path: Path) -> None:
    from tlaunch.jobs import Client

    with server.client() as c:
        pkg = _upload(c, {"train.py": TRAINER})
        for i in range(120):  # stopped as they are accepted: most never launch (one launch at a time)
            name = f"many-{i:03d}"
            r = c.post("/v1/trainer/job", json={"job_name": name, "trainer_package": pkg,
                                                "labels": {"batch": "many"}})  # fmt: skip
            assert r.status_code == 201, r.text
            assert c.post(f"/v1/jobs/{name}/stop").status_code in (200, 202)
        for i in range(120):
            _wait(c, f"many-{i:03d}", ENDED)
    with Client(server.url, ALICE) as client:
        jobs = client.list(label={"batch": "many"})
        assert len(jobs) == 120 and {j["name"] for j in jobs} == {f"many-{i:03d}" for i in range(120)}
        assert [j["name"] for j in jobs] == sorted((j["name"] for j in jobs), reverse=True)  # newest first
        assert len(client.list(label={"batch": "many"}, limit=7)) == 7
        everyone = client.list()
        assert len(everyone) >= 120 and client.page(limit=1)["total"] == len(everyone)
    env = {**os.environ, "TLAUNCH_SERVER": server.url, "TLAUNCH_TOKEN": ALICE}
    cli = [sys.executable, "-m", "tlaunch.cli.main", "job", "ls"]
    total = len(everyone)

    def ls(*args: str) -> str:
        done = subprocess.run(
            [*cli, *args], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    default = ls()
    assert f"50 of {total} jobs, newest first; --all lists every one" in default, default
    assert sum(f"many-{i:03d}" in default for i in range(120)) == 50
    every = ls("--all")
    assert all(f"many-{i:03d}" in every for i in range(120)) and f"{total} jobs" in every, every[-500:]
    seven = ls("--limit", "7")
    assert f"7 of {total} jobs" in seven and sum(f"many-{i:03d}" in seven for i in range(120)) == 7
    bad = subprocess.run([*cli, "--limit", "0"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--limit 0: give 1 or more" in bad.stderr, bad


def test_a_get_is_sent_again_when_its_kept_alive_connection_was_closed_under_it() -> None:
    """A server that closes a kept-alive connection as the next request arrives (what a server's
    keep-alive timeout does at the wrong moment): the client's GET is answered on a new connection;
    its submit (a POST) is never sent twice."""
    from tlaunch.jobs import Client, JobServerError

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    requests: list[bytes] = []
    done = threading.Event()

    def serve() -> None:
        while True:  # until the test is done: a connection it did not expect is one more request seen
            conn, _ = listener.accept()
            with conn:
                if done.is_set():  # the test's own connection, which ends this loop
                    return
                for number in (1, 2):  # the second request of each connection: closed, unanswered
                    data = b""
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    if not data:
                        break
                    requests.append(data.split(b"\r\n", 1)[0])
                    if number == 2:
                        break
                    body = b'{"version": "x", "api": "v1"}'
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip

    # The accept loop ends before its socket closes, whatever the test found: a thread left in
    # accept() on a closed socket raises later (EBADF), under whichever test then runs.
    thread = threading.Thread(target=serve, name="closing server", daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with Client(url, ALICE, timeout=10) as c:
            assert c.version() == "x"
            assert c.version() == "x"  # its connection closed under it: asked again on a new one
            assert requests == [b"GET /v1/version HTTP/1.1"] * 3, requests
            with pytest.raises(JobServerError, match="closed the connection"):
                c.submit("x", "0" * 64)  # on the second connection, closed under it: not sent again
    finally:
        done.set()
        socket.create_connection(listener.getsockname(), timeout=10).close()  # wakes its accept()
        thread.join(10)
        listener.close()
    assert not thread.is_alive(), "the accept loop did not end"
    assert requests[3:] == [b"POST /v1/trainer/job HTTP/1.1"], requests


def test_a_kept_alive_connection_is_answered_without_waiting_for_an_acknowledgement(server: Server) -> None:
    """Every answer on one connection comes at once: without TCP_NODELAY on the server's connections,
    each answer after the first waited 40 ms (its body held back until the client acknowledged its
    headers, which a client delays)."""
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        times = []
        for _ in range(21):
            t0 = time.perf_counter()
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            data = b""
            while not data.endswith(b'{"status":"ok"}'):
                chunk = s.recv(4096)
                assert chunk, data
                data += chunk
            times.append(time.perf_counter() - t0)
    assert sorted(times)[10] < 0.02, sorted(times)  # the median: 40 ms and more with the stall


def test_the_index_pages_each_owner_and_everyone_newest_first_through_changes() -> None:
    """A page of the server's view (a slice of its order when nothing but an owner is asked) is
    the same as filtering every job, through adds, a job submitted again (new created) and deletes."""
    import random

    from tlaunch.server.store import JobRow
    from tlaunch.server.views import Entry, JobIndex

    rng = random.Random(44)
    index = JobIndex()
    jobs: dict[tuple[str, str], Entry] = {}

    def put(owner: str, name: str, created: float) -> None:
        state = rng.choice(["PENDING", "RUNNING", "SUCCEEDED"])
        row = JobRow(name, owner, {}, {"team": rng.choice("ab")}, created=created)
        entry = Entry(row, state, b"{}")
        jobs[(owner, name)] = entry
        index.put(entry)

    index.load([])
    for i in range(300):
        put(rng.choice(["alice", "bob", "carol"]), f"job-{rng.randrange(200)}", 1000.0 + i)
        if i % 7 == 0 and jobs:
            gone = rng.choice(sorted(jobs))
            del jobs[gone]
            index.remove(*gone)
    newest = sorted(jobs.values(), key=lambda e: -e.row.created)
    for owner in (None, "alice", "bob", "nobody"):
        for labels, state in (({}, None), ({"team": "a"}, None), ({}, "RUNNING")):
            want = [
                e for e in newest
                if (owner is None or e.row.owner == owner)
                and all(e.row.labels.get(k) == v for k, v in labels.items())
                and (state is None or e.state == state)
            ]  # fmt: skip
            for offset, limit in ((0, 50), (20, 7), (len(want), 5), (0, 500)):
                page, total = index.page(owner=owner, labels=labels, state=state, limit=limit, offset=offset)
                assert total == len(want) and page == want[offset : offset + limit], (owner, labels, state)
