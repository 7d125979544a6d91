"""The job server, as a real server process on 127.0.0.1, driven over HTTP.

Jobs are real: trainer packages uploaded as archives, run by detached
launchers on this machine (and on the SSH test hosts), followed through the
run store; the server is killed with SIGKILL mid-job and started again.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from server_helpers import ALICE, BOB, ROOT, TRAINER, Server  # noqa: E402
from server_helpers import error_of as _error  # noqa: E402
from server_helpers import events as _events  # noqa: E402
from server_helpers import launched as _launched  # noqa: E402
from server_helpers import upload as _upload  # noqa: E402
from server_helpers import wait_state as _wait  # noqa: E402
from server_helpers import zip_of as _zip  # noqa: E402


@pytest.fixture(scope="module")
def postgres() -> Iterator[Any]:
    """A real PostgreSQL of the tests' own (Debian's package), for the whole module."""
    from tlaunch.testing.postgres import PostgresTestServer, postgres_bin

    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql; .ci/run does)")
    with PostgresTestServer() as pg:
        yield pg


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """The server on SQLite, then the same test on PostgreSQL (a fresh database each)."""
    db = request.getfixturevalue("postgres").create_database("jobs") if request.param == "postgres" else None
    srv = Server(tmp_path / "server-home", db=db)
    ended = ("SUCCEEDED", "FAILED", "STOPPED", "LOST")
    try:
        yield srv
        with srv.client(ROOT) as c:  # nothing of the tests' jobs is left running
            for job in c.get("/v1/jobs").json()["jobs"]:
                if job["state"] not in ended:
                    c.post(f"/v1/jobs/{job['name']}/stop")
            deadline = time.monotonic() + 30
            while any(j["state"] not in ended for j in c.get("/v1/jobs").json()["jobs"]):
                assert time.monotonic() < deadline
                time.sleep(0.2)
    finally:
        srv.stop()


# -- endpoints and errors ------------------------------------------------------------


def test_health_version_and_tokens(server: Server) -> None:
    assert httpx.get(f"{server.url}/v1/health").json() == {"status": "ok"}
    _error(httpx.get(f"{server.url}/v1/version"), 401)
    _error(httpx.get(f"{server.url}/v1/version", headers={"Authorization": "Bearer wrong-token-000000"}), 401)
    with server.client() as c:
        assert c.get("/v1/version").json()["api"] == "v1"
        _error(c.get("/v1/nothing-here"), 404)
        assert c.get("/openapi.json").json()["info"]["title"] == "tlaunch job server"


def test_packages_are_stored_once_by_content(server: Server) -> None:
    with server.client() as c:
        data = _zip({"train.py": TRAINER})
        first = c.post("/v1/package", content=data)
        assert first.status_code == 201 and first.json()["new"] is True
        again = c.post("/v1/package", content=data)
        assert again.status_code == 200 and again.json()["package_id"] == first.json()["package_id"]
        assert c.get(f"/v1/packages/{first.json()['package_id']}").json()["size"] == len(data)
        _error(c.get("/v1/packages/" + "0" * 64), 404)
        _error(c.post("/v1/package", content=b"not an archive"), 400)
        _error(c.post("/v1/package", content=os.urandom(5 << 20)), 413)  # the server's limit is 4 MiB

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is found as it arrives
            for _ in range(5):
                yield os.urandom(1 << 20)

        _error(c.post("/v1/package", content=chunks()), 413)
        streamed = c.post("/v1/package", content=iter([data[:100], data[100:]]))
        assert streamed.status_code == 200 and streamed.json()["package_id"] == first.json()["package_id"]
    store = server.home / "server" / "packages"
    left = [p.name for p in store.rglob(".*") if p.name.startswith((".incoming-", ".upload-"))]
    assert left == [], left  # no upload is left behind, refused or not


def _tar(add: Any) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        add(t)
    return buf.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"x", link: str = "") -> Any:
    def add(t: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.size = kind, link, len(data) if kind == tarfile.REGTYPE else 0
        t.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

    return add


@pytest.mark.parametrize(
    ("archive", "why"),
    [
        (lambda: _zip({"../escape.py": "x"}), "would leave the package's folder"),
        (lambda: _zip({"/etc/evil.py": "x"}), "would leave the package's folder"),
        (lambda: _tar(_member("../../escape.py")), "would leave the package's folder"),
        (lambda: _tar(_member("link", tarfile.SYMTYPE, link="/etc/passwd")), "is a link or a device"),
        (lambda: _tar(_member("hard", tarfile.LNKTYPE, link="/etc/passwd")), "is a link or a device"),
        (lambda: _tar(_member("dev", tarfile.CHRTYPE)), "is a link or a device"),
        (lambda: _zip({"bomb.bin": "\0" * (6 << 20)}), "unpacks to more than"),
        (lambda: _zip({f"f{i}.txt": "" for i in range(10_001)}), "more than 10000 members"),
    ],
)
def test_hostile_archives_are_refused(server: Server, archive: Any, why: str) -> None:
    with server.client() as c:
        error = _error(c.post("/v1/package", content=archive()), 400)
        assert why in error["message"], error
    store = server.home / "server" / "packages"
    assert [p.name for p in store.glob("*/*") if not p.name.startswith(".")] == []
    assert not (server.home / "escape.py").exists() and not (server.home.parent / "escape.py").exists()


def test_bad_submissions_say_what_is_wrong(server: Server) -> None:
    with server.client() as c:
        pkg = _upload(c)
        e = _error(c.post("/v1/trainer/job", json={"job_name": "Bad Name", "trainer_package": pkg}), 400)
        assert "job_name" in e["message"]
        e = _error(c.post("/v1/trainer/job", json={"job_name": "x", "trainer_package": "f" * 64}), 404)
        assert "upload it first" in e["message"]
        e = _error(
            c.post("/v1/trainer/job", json={"job_name": "x", "trainer_package": pkg, "entry_point": "no.py"}),
            400,
        )
        assert "'no.py' is not a file of the package" in e["message"]
        e = _error(
            c.post("/v1/trainer/job", json={"job_name": "x", "trainer_package": pkg, "pservers": 2}), 400
        )
        assert "pservers=2" in e["message"]
        # A value only the job itself can check: refused before the name is taken (before: a
        # FAILED job of that name was left, and the corrected submission was a 409).
        body = {"job_name": "gpus", "trainer_package": pkg, "use_gpu": True, "gpu_num": 65}
        e = _error(c.post("/v1/trainer/job", json=body), 400)
        assert "gpu=65 must be a whole number from 0 to 64" in e["message"], e
        _error(c.get("/v1/jobs/gpus"), 404)
        body["gpu_num"], body["slurm"] = 1, {"partition": "x\ny"}
        e = _error(c.post("/v1/trainer/job", json=body), 400)
        assert "partition" in e["message"], e
        _error(c.get("/v1/jobs/gpus"), 404)
        _error(c.get("/v1/jobs/nope"), 404)
        _error(c.post("/v1/jobs/nope/stop"), 404)
        _error(c.delete("/v1/jobs/nope"), 404)


def test_listing_refuses_what_it_cannot_filter_by(server: Server) -> None:
    with server.client() as c:
        e = _error(c.get("/v1/jobs", params={"state": "runing"}), 400)
        assert "'runing' is not one of" in e["message"] and "RUNNING" in e["message"]
        e = _error(c.get("/v1/jobs", params={"label": "team"}), 400)
        assert "label 'team' is not KEY=VALUE" in e["message"]
        assert c.get("/v1/jobs", params={"state": "running"}).json() == {"jobs": [], "total": 0}


# -- jobs ---------------------------------------------------------------------------


def test_a_job_runs_to_success_and_its_logs_follow(server: Server) -> None:
    with server.client() as c:
        pkg = _upload(c)
        body = {"job_name": "quickstart", "trainer_package": pkg, "num_trainer": 2, "args": ["4"],
                "labels": {"team": "rl"}, "env": {"STEP_TIME": "0.3"}}  # fmt: skip
        r = c.post("/v1/trainer/job", json=body)
        assert r.status_code == 201 and r.headers["location"] == "/v1/jobs/quickstart", r.text
        assert r.json()["state"] == "PENDING"  # answered as accepted; its launcher starts after
        _error(c.post("/v1/trainer/job", json=body), 409)  # the name is taken
        events = _events(c, "/v1/jobs/quickstart/logs?follow=true")  # ends when the job ends
        lines = [data["text"] for kind, data in events if kind == "message"]
        assert "step 3 rank 1 of 2" in lines and "step 0 rank 0 of 2" in lines, lines
        assert events[-1] == ("end", {"state": "SUCCEEDED"})
        job = c.get("/v1/jobs/quickstart").json()
        assert job["state"] == "SUCCEEDED" and job["exit_code"] == 0 and job["owner"] == "alice"
        assert len(job["nodes"]) >= 2 and all(n["state"] == "done" for n in job["nodes"])
        tail = _events(c, "/v1/jobs/quickstart/logs?tail=1")
        assert len([d for k, d in tail if k == "message"]) == 1
        listed = c.get("/v1/jobs", params={"label": "team=rl", "state": "succeeded"}).json()
        assert [j["name"] for j in listed["jobs"]] == ["quickstart"]
        assert c.get("/v1/jobs", params={"label": "team=cv"}).json()["jobs"] == []


def test_a_failed_job_carries_its_root_cause(server: Server) -> None:
    with server.client() as c:
        pkg = _upload(c)
        body = {"job_name": "diverges", "trainer_package": pkg, "env": {"FAIL_AT_END": "1"}}
        assert c.post("/v1/trainer/job", json=body).status_code == 201
        job = _wait(c, "diverges", ("FAILED",))
        assert job["exit_code"] not in (0, None), job
        assert "ValueError: the loss is nan at step 3" in json.dumps(job["failure"]) + (
            job["message"] or ""
        ), job


def test_stop_is_idempotent_and_delete_of_a_running_job_needs_force(server: Server) -> None:
    with server.client() as c:
        pkg = _upload(c)
        for name in ("longrun", "forced"):
            body = {"job_name": name, "trainer_package": pkg, "args": ["1000"], "env": {"STEP_TIME": "0.2"}}
            assert c.post("/v1/trainer/job", json=body).status_code == 201
            _wait(c, name, ("RUNNING",))
        _error(c.delete("/v1/jobs/longrun"), 409)
        r = c.post("/v1/jobs/longrun/stop")
        assert r.status_code == 202 and r.json()["state"] == "STOPPING"
        assert _wait(c, "longrun", ("STOPPED",))["state"] == "STOPPED"
        assert c.post("/v1/jobs/longrun/stop").status_code == 200  # already stopped: nothing to do
        assert c.delete("/v1/jobs/longrun").json() == {"deleted": "longrun", "owner": "alice"}
        _error(c.get("/v1/jobs/longrun"), 404)
        run_id = c.get("/v1/jobs/forced").json()["refs"]["run_id"]
        assert c.delete("/v1/jobs/forced", params={"force": "true"}).status_code == 200
        from tlaunch import control

        assert control.find_run(run_id, str(server.home)).snapshot().state.value == "STOPPED"


def test_a_user_sees_and_stops_only_their_own_jobs(server: Server) -> None:
    with server.client(ALICE) as alice, server.client(BOB) as bob, server.client(ROOT) as root:
        pkg = _upload(alice)
        body = {"job_name": "alices", "trainer_package": pkg, "args": ["1000"], "env": {"STEP_TIME": "0.2"}}
        assert alice.post("/v1/trainer/job", json=body).status_code == 201
        _error(bob.get("/v1/jobs/alices"), 404)
        _error(bob.post("/v1/jobs/alices/stop"), 404)
        _error(bob.delete("/v1/jobs/alices", params={"force": "true"}), 404)
        _error(bob.get("/v1/jobs/alices/logs"), 404)
        _error(bob.post("/v1/jobs/alices/restart"), 404)
        assert bob.get("/v1/jobs").json()["jobs"] == []
        _error(bob.get("/v1/jobs", params={"owner": "alice"}), 403)
        assert [j["name"] for j in root.get("/v1/jobs", params={"owner": "alice"}).json()["jobs"]] == [
            "alices"
        ]
        assert _wait(alice, "alices", ("RUNNING",))["state"] == "RUNNING"  # bob's stop did nothing
        _error(alice.post("/v1/jobs/alices/restart"), 409)  # it runs: stop it first
        assert root.post("/v1/jobs/alices/stop").status_code == 202  # an admin may
        first = _wait(alice, "alices", ("STOPPED",))["refs"]["run_id"]
        again = root.post("/v1/jobs/alices/restart", params={"owner": "alice"})  # an admin may
        assert again.status_code == 201 and again.json()["state"] == "PENDING", again.text  # launched after
        assert _launched(alice, "alices")["refs"]["run_id"] != first
        assert _wait(alice, "alices", ("RUNNING",))["owner"] == "alice"
        assert root.post("/v1/jobs/alices/stop").status_code == 202
        _wait(alice, "alices", ("STOPPED",))


def test_a_server_killed_mid_job_finds_the_job_when_it_starts_again(server: Server) -> None:
    with server.client() as c:
        pkg = _upload(c)
        body = {"job_name": "survivor", "trainer_package": pkg, "args": ["50"], "env": {"STEP_TIME": "0.2"}}
        assert c.post("/v1/trainer/job", json=body).status_code == 201
        _wait(c, "survivor", ("RUNNING",))
    server.kill()  # SIGKILL: no chance to tidy anything
    time.sleep(1.0)
    server.start()
    with server.client() as c:
        assert c.get("/v1/jobs/survivor").json()["state"] == "RUNNING"  # the job ran on without it
        events = _events(c, "/v1/jobs/survivor/logs?follow=true")
        assert events[-1] == ("end", {"state": "SUCCEEDED"})
        assert "step 49 rank 0 of 1" in [d["text"] for k, d in events if k == "message"]


@pytest.mark.ssh
def test_a_job_on_the_ssh_test_hosts(server: Server, ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    with server.client() as c:
        pkg = _upload(c)
        body = {"job_name": "overssh", "trainer_package": pkg, "num_trainer": 2, "hosts": ["th1", "th2"],
                "ssh_config": ssh_hosts.ssh_config}  # fmt: skip
        r = c.post("/v1/trainer/job", json=body)
        assert r.status_code == 201, r.text
        events = _events(c, "/v1/jobs/overssh/logs?follow=true")
        assert events[-1] == ("end", {"state": "SUCCEEDED"}), events
        job = c.get("/v1/jobs/overssh").json()
        assert {n["host"] for n in job["nodes"]} >= {"th1", "th2"}, job["nodes"]
        assert ssh_hosts.wait_no_leftovers(job["refs"]["run_id"], 10) == {}
        # A program of the package: its nodes spread over the hosts, round-robin.
        body = {"job_name": "ps-ssh", "trainer_package": _upload(c, {"train.py": PROGRAM_PACKAGE}),
                "launch_method": "program", "program": "train.py:make_program", "pservers": 2,
                "hosts": ["th1", "th2"], "ssh_config": ssh_hosts.ssh_config}  # fmt: skip
        assert c.post("/v1/trainer/job", json=body).status_code == 201
        events = _events(c, "/v1/jobs/ps-ssh/logs?follow=true")
        assert events[-1] == ("end", {"state": "SUCCEEDED"}), events
        assert any("trainer got [0, 10]" in d["text"] for k, d in events if k == "message"), events
        job = c.get("/v1/jobs/ps-ssh").json()
        placed = {n["key"]: n["host"] for n in job["nodes"]}
        assert placed == {"pserver/0": "th1", "pserver/1": "th2", "trainer/0": "th1"}, placed
        assert ssh_hosts.wait_no_leftovers(job["refs"]["run_id"], 10) == {}


SELF_SUBMITTING = """
import os, sys
from tlaunch.jobs import submit_self

if submit_self("selfsub", num_trainer=2):
    print("SUBMITTED")
    sys.exit()
print("training as rank", os.environ["RANK"], "with", sys.argv[1:], flush=True)
"""


def test_the_python_client_the_cli_and_a_script_that_submits_itself(server: Server, tmp_path: Path) -> None:
    from tlaunch.jobs import Client, JobServerError

    folder = tmp_path / "quick_start"
    folder.mkdir()
    (folder / "trainer.py").write_text(TRAINER)
    (folder / "self.py").write_text(SELF_SUBMITTING)
    with Client(server.url, ALICE) as c:
        assert c.version()
        pkg = c.upload(str(folder))
        c.submit("viaclient", pkg, entry_point="trainer.py", args=["2"])
        lines = [line["text"] for line in c.logs("viaclient", follow=True)]
        assert "step 1 rank 0 of 1" in lines, lines
        assert c.wait("viaclient", timeout=60)["state"] == "SUCCEEDED"
        with pytest.raises(JobServerError) as caught:
            c.get("nope")
        assert caught.value.status == 404
    env = {**os.environ, "TLAUNCH_SERVER": server.url, "TLAUNCH_TOKEN": ALICE}
    cli = [sys.executable, "-m", "tlaunch.cli.main", "job"]
    listed = subprocess.run([*cli, "ls"], env=env, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "viaclient" in listed.stdout and "SUCCEEDED" in listed.stdout, listed
    done = subprocess.run(
        [*cli, "submit", str(folder), "--name", "viacli", "--", "python", "trainer.py", "2"],
        env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 0 and "submitted job viacli" in done.stdout, done.stdout + done.stderr
    followed = subprocess.run(
        [*cli, "logs", "viacli", "-f"], env=env, capture_output=True, text=True, timeout=90
    )
    assert "step 1 rank 0 of 1" in followed.stdout, followed
    status = subprocess.run([*cli, "status", "viacli"], env=env, capture_output=True, text=True, timeout=60)
    assert "job viacli (alice): SUCCEEDED" in status.stdout, status
    bad = subprocess.run([*cli, "status", "nope"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "404: no job 'nope'" in bad.stderr and "Traceback" not in bad.stderr
    by_hand = subprocess.run(
        [sys.executable, str(folder / "self.py"), "--lr", "3e-4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert by_hand.stdout.strip() == "SUBMITTED", by_hand.stdout + by_hand.stderr
    with Client(server.url, ALICE) as c:
        lines = [line["text"] for line in c.logs("selfsub", follow=True)]
        assert "training as rank 1 with ['--lr', '3e-4', '--rank', '1', '--world_size', '2']" in lines, lines


def test_the_cli_says_when_no_server_answers() -> None:
    """Every job command, logs -f included, names the address and ends without a traceback."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {**os.environ, "TLAUNCH_SERVER": url, "TLAUNCH_TOKEN": ALICE}
    for args in (["ls"], ["status", "x"], ["logs", "-f", "x"], ["stop", "x"]):
        done = subprocess.run(
            [sys.executable, "-m", "tlaunch.cli.main", "job", *args],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 1, (args, done)
        said = done.stderr
        assert url in said and "Traceback" not in said and ": 0:" not in said, said


def test_schemathesis_finds_no_server_error_and_no_answer_off_the_schema(
    server: Server, tmp_path: Path
) -> None:
    """Every operation of the server's own OpenAPI document, fuzzed; ``positive_data_acceptance`` is
    left out: random bytes are a schema-valid upload body that no archive reader accepts (400). Its
    invalid bodies may also be refused as too large (413: a 2 MB string over a field's bound is over
    the body limit first)."""
    st = shutil.which("schemathesis", path=os.path.dirname(sys.executable)) or shutil.which("schemathesis")
    if st is None:
        pytest.skip("schemathesis is not installed (requirements.txt pins it)")
    config = tmp_path / "schemathesis.toml"
    rejected = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]
    config.write_text(f"[checks.negative_data_rejection]\nexpected-statuses = {json.dumps(rejected)}\n")
    done = subprocess.run(
        [st, "--config-file", str(config), "run", f"{server.url}/openapi.json", "-H",
         f"Authorization: Bearer {ROOT}", "--max-examples", "25", "--exclude-checks",
         "positive_data_acceptance", "--seed", "1"],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "5xx" not in done.stdout.split("SUMMARY")[-1]


def test_a_finished_job_keeps_its_end_when_its_run_is_pruned(server: Server) -> None:
    """The server notices a job's end by itself (nobody asks) and keeps it: pruning the run store
    afterwards leaves the job SUCCEEDED, with its nodes, not LOST."""
    from tlaunch import control
    from tlaunch.server.store import JobStore

    with server.client() as c:
        pkg = _upload(c)
        r = c.post("/v1/trainer/job", json={"job_name": "pruned", "trainer_package": pkg, "num_trainer": 2})
        assert r.status_code == 201, r.text
        run_id = _launched(c, "pruned")["refs"]["run_id"]
        control.find_run(run_id, str(server.home)).wait(timeout=60)  # its end, read without the server
        store = JobStore(server.db or str(server.home / "server" / "jobs.db"))
        try:
            deadline = time.monotonic() + 30
            while (row := store.get("alice", "pruned")) is None or row.final_state is None:
                assert time.monotonic() < deadline, "the server never kept the job's end"
                time.sleep(0.2)
        finally:
            store.close()
        shutil.rmtree(server.home / "runs" / run_id)  # the run store is pruned
        job = c.get("/v1/jobs/pruned").json()
        assert job["state"] == "SUCCEEDED" and job["exit_code"] == 0, job
        assert len(job["nodes"]) >= 2 and job["refs"]["run_id"] == run_id, job
        listed = c.get("/v1/jobs", params={"state": "succeeded"}).json()
        assert [j["name"] for j in listed["jobs"]] == ["pruned"] and listed["total"] == 1


def test_runs_are_listed_by_page_newest_first(server: Server) -> None:
    """The dashboard's run list asks only the page's runs how they are; a user sees their jobs' runs."""
    with server.client(ALICE) as alice, server.client(BOB) as bob, server.client(ROOT) as root:
        pkg = _upload(alice)
        ids = []
        for i in range(3):
            r = alice.post("/v1/trainer/job", json={"job_name": f"paged-{i}", "trainer_package": pkg})
            assert r.status_code == 201, r.text
            ids.append(_launched(alice, f"paged-{i}")["refs"]["run_id"])
        newest_first = ids[::-1]
        page = root.get("/v1/runs", params={"limit": 2}).json()
        assert page["total"] == 3 and [r["run_id"] for r in page["runs"]] == newest_first[:2], page
        page = alice.get("/v1/runs", params={"limit": 1, "offset": 1}).json()
        assert page["total"] == 3 and [r["run_id"] for r in page["runs"]] == newest_first[1:2], page
        assert bob.get("/v1/runs").json() == {"runs": [], "total": 0}
        _error(root.get("/v1/runs", params={"limit": 0}), 400)


def test_the_server_answers_again_once_its_database_connections_are_cut(server: Server) -> None:
    """PostgreSQL restarted, a connection dropped by a proxy: the next request opens another
    connection instead of answering 500 for ever (before: one connection for the server's life)."""
    if server.db is None:
        pytest.skip("SQLite has no connection to cut")
    import psycopg

    with server.client() as c:
        pkg = _upload(c)
        assert (
            c.post("/v1/trainer/job", json={"job_name": "before-cut", "trainer_package": pkg}).status_code
            == 201
        )
        with psycopg.connect(server.db, autocommit=True) as admin:
            cut = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        assert cut, "the server had no connection to cut"
        for _ in range(5):  # every request thread's connection was cut: each opens another
            r = c.get("/v1/jobs")
            assert r.status_code == 200 and r.json()["total"] == 1, r.text
        assert (
            c.post("/v1/trainer/job", json={"job_name": "after-cut", "trainer_package": pkg}).status_code
            == 201
        )


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
def test_rows_added_at_once_are_each_written_once_and_one_that_cannot_be_fails_alone(
    db: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """50 submits at once (written together, tlaunch.server.groupwrite): every name is taken once,
    the second add of a name is refused, and a row that cannot be written fails without the others."""
    from tlaunch.server.store import DuplicateJob, JobRow, JobStore

    url = (
        request.getfixturevalue("postgres").create_database("rows")
        if db == "postgres"
        else str(tmp_path / "j.db")
    )
    store = JobStore(url)
    names = [f"job-{i % 40}" for i in range(50)]  # ten names asked twice
    outcomes: dict[int, str] = {}
    start = threading.Barrier(51)

    def add(i: int) -> None:
        spec: dict[str, Any] = {"n": i} if i != 45 else {"n": i, "cannot": {1, 2}}  # a set: no JSON
        start.wait()
        try:
            store.add(JobRow(names[i], "alice", spec))
            outcomes[i] = "written"
        except DuplicateJob:
            outcomes[i] = "taken"
        except TypeError:
            outcomes[i] = "refused"

    try:
        threads = [threading.Thread(target=add, args=(i,)) for i in range(51 - 1)]
        for t in threads:
            t.start()
        start.wait()
        for t in threads:
            t.join(60)
        assert outcomes[45] == "refused", outcomes
        rows = {r.name: r for r in store.list(owner="alice", limit=100)}
        assert sorted(rows) == sorted(set(names)), sorted(rows)
        for name, row in rows.items():
            asked = sorted(outcomes[i] for i in range(50) if names[i] == name)
            assert asked.count("written") == 1 and outcomes[row.spec["n"]] == "written", (name, asked)
            assert set(asked) <= {"written", "taken", "refused"}
        with pytest.raises(DuplicateJob):
            store.add(JobRow("job-0", "alice", {}))
        store.add(JobRow("job-0", "bob", {}))  # names are per user
        assert store.get("bob", "job-0") is not None
    finally:
        store.close()


# -- runtime environments -----------------------------------------------------------

ENV_TRAINER = """
import os, sys, tinyrt
print("rank", os.environ["RANK"], "tinyrt", tinyrt.VALUE, flush=True)
"""


def _env_package(requirement: str = "./tinyrt-0.1-py3-none-any.whl") -> dict[str, str | bytes]:
    from test_runtime_env import wheel_bytes

    wheel = "tinyrt-0.1-py3-none-any.whl"
    return {"train.py": ENV_TRAINER, wheel: wheel_bytes(), "requirements.txt": requirement}


def _env_log(c: Any, name: str) -> list[str]:
    return [d["text"] for k, d in _events(c, f"/v1/jobs/{name}/logs?node=runtime-env") if k == "message"]


def test_a_package_with_requirements_runs_in_its_environment_built_once(server: Server) -> None:
    with server.client() as c:
        pkg = _upload(c, _env_package())
        run_ids = []
        for name in ("env-a", "env-b"):  # at once: one builds, the other waits for it
            r = c.post("/v1/trainer/job", json={"job_name": name, "trainer_package": pkg, "num_trainer": 2})
            assert r.status_code == 201, r.text
            assert r.json()["state"] == "PENDING", r.json()
            run_ids.append(_launched(c, name)["refs"]["run_id"])
        # The dashboard's view of the first: PENDING while its environment builds, then its graph.
        snapshots = [d for k, d in _events(c, f"/v1/runs/{run_ids[0]}/events") if k == "snapshot"]
        assert snapshots[0]["state"] == "PENDING", snapshots[0]
        assert "building its runtime environment" in snapshots[0]["reason"], snapshots[0]
        assert snapshots[-1]["state"] == "SUCCEEDED", snapshots[-1]
        assert {n["key"] for n in snapshots[-1]["graph"]} == {"trainer/0", "trainer/1"}, snapshots[-1]
        for name in ("env-a", "env-b"):
            events = _events(c, f"/v1/jobs/{name}/logs?follow=true")
            assert events[-1] == ("end", {"state": "SUCCEEDED"}), events
            lines = [d["text"] for k, d in events if k == "message"]
            assert "rank 1 tinyrt 42" in lines, lines
        logs = _env_log(c, "env-a") + _env_log(c, "env-b")
        built = [line for line in logs if line.startswith("tlaunch: built the runtime environment")]
        used = [line for line in logs if line.startswith("tlaunch: using the runtime environment")]
        assert len(built) == 1 and len(used) == 1, logs
        assert sum("Successfully installed tinyrt-0.1" in line for line in logs) == 1, logs
        r = c.post("/v1/trainer/job", json={"job_name": "env-later", "trainer_package": pkg})
        assert r.status_code == 201, r.text
        assert _wait(c, "env-later", ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"
        assert _env_log(c, "env-later")[-1].startswith("tlaunch: using the runtime environment")
    envs = [p.name for p in (server.home / "envs").iterdir() if not p.name.endswith(".lock")]
    assert len(envs) == 1, envs


def test_a_failed_environment_build_fails_the_job_with_pips_output(server: Server) -> None:
    with server.client() as c:
        pkg = _upload(c, _env_package("./tinyrt-9.9-py3-none-any.whl  # not in the package"))
        r = c.post("/v1/trainer/job", json={"job_name": "no-wheel", "trainer_package": pkg})
        assert r.status_code == 201, r.text
        job = _wait(c, "no-wheel", ("FAILED", "SUCCEEDED"))
        assert job["state"] == "FAILED", job
        failure = job["failure"]
        assert failure["node"] == "runtime-env" and failure["host"] == "localhost", failure
        assert "pip install -r requirements.txt failed with exit code 1" in failure["reason"], failure
        assert "No such file or directory" in job["message"], job  # pip's own last word
        assert "tinyrt-9.9-py3-none-any.whl" in failure["traceback"], failure
        assert any("No such file or directory" in line for line in _env_log(c, "no-wheel"))
    # Nothing half-made is left for the next job.
    assert [p.name for p in (server.home / "envs").iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.ssh
def test_a_job_with_requirements_on_the_ssh_test_hosts(server: Server, ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    with server.client() as c:
        pkg = _upload(c, _env_package())
        body = {"job_name": "sshenv", "trainer_package": pkg, "num_trainer": 2, "hosts": ["th1", "th2"],
                "ssh_config": ssh_hosts.ssh_config}  # fmt: skip
        assert c.post("/v1/trainer/job", json=body).status_code == 201
        events = _events(c, "/v1/jobs/sshenv/logs?follow=true")
        said = (c.get("/v1/jobs/sshenv").json(), [d.get("text") for _, d in events[-30:]])
        assert events[-1] == ("end", {"state": "SUCCEEDED"}), str(said)  # a str: shown whole
        lines = [d["text"] for k, d in events if k == "message"]
        assert "rank 0 tinyrt 42" in lines and "rank 1 tinyrt 42" in lines, lines
        job = c.get("/v1/jobs/sshenv").json()
        assert {n["host"] for n in job["nodes"]} >= {"th1", "th2"}, job["nodes"]
        # A later job of the same package reuses each host's environment: nothing is shipped.
        body["job_name"] = "sshenv2"
        assert c.post("/v1/trainer/job", json=body).status_code == 201
        assert _wait(c, "sshenv2", ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"
        run_dir = server.home / "runs" / c.get("/v1/jobs/sshenv2").json()["refs"]["run_id"]
        for host in ("th1", "th2"):
            text = (run_dir / "logs" / f"runtime-env-{host}.log").read_text()
            assert text.startswith("tlaunch: using the runtime environment") and host in text, text
        # A build that fails on a host fails the job, naming the host, with pip's output.
        bad = _upload(c, _env_package("./tinyrt-9.9-py3-none-any.whl"))
        body.update(job_name="sshenv-bad", trainer_package=bad, hosts=["th1"])
        assert c.post("/v1/trainer/job", json=body).status_code == 201
        job = _wait(c, "sshenv-bad", ("FAILED", "SUCCEEDED"))
        assert job["state"] == "FAILED" and job["failure"]["host"] == "th1", job
        assert "pip install -r requirements.txt failed on th1" in job["failure"]["reason"], job
        assert "tinyrt-9.9-py3-none-any.whl" in job["failure"]["traceback"], job
    assert ssh_hosts.wait_no_leftovers(job["refs"]["run_id"], 10) == {}


# -- Kubernetes ---------------------------------------------------------------------


def test_a_job_on_kubernetes_through_the_operator(  # type: ignore[no-untyped-def]
    cluster, server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """POST with kubernetes: an LPJob (validated against its CRD, its pods against Kubernetes' schemas)
    that the real operator runs on the stand-in cluster; the package travels in the job's Secret, each
    pod builds the runtime environment first (once for both: the lock), and the logs follow to SUCCEEDED."""
    jsonschema = pytest.importorskip("jsonschema")
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    from tlaunch.k8s.crd import GROUP, PLURAL, VERSION, lpjob_schema

    api, _ = cluster
    # The stand-in kubelet runs pods here: their image's `python` is this one, their /tmp a folder of ours.
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with server.client() as c:
        files = _env_package()
        pkg = _upload(c, files)
        body = {"job_name": "onk8s", "trainer_package": pkg, "num_trainer": 2, "base_image": "trainer:1",
                "cpu_num": 2, "memory": "1Gi", "kubernetes": {"namespace": "default"}}  # fmt: skip
        r = c.post("/v1/trainer/job", json=body)
        assert r.status_code == 201, r.text
        refs = _launched(c, "onk8s")["refs"]
        assert refs["lpjob"] == "onk8s" and refs["namespace"] == "default", refs
        lpjob = api.get(GROUP, VERSION, PLURAL, "default", "onk8s")
        jsonschema.validate(lpjob, lpjob_schema())
        # Its environment is named by what it installs (the wheel the requirements name), not by the package.
        from tlaunch.runtime.envkey import env_key

        assert lpjob["spec"]["runFiles"] and lpjob["spec"]["package"]["requirements"] is True
        assert lpjob["spec"]["package"]["sha256"] != pkg
        with tempfile.TemporaryDirectory() as folder:  # the package's files, as the server holds them
            for name, data in files.items():
                Path(folder, name).write_bytes(data if isinstance(data, bytes) else data.encode())
            key = env_key(folder, str(files["requirements.txt"]).splitlines(), pkg)
        assert lpjob["spec"]["package"]["sha256"] == key
        assert lpjob["spec"]["roles"][0]["resources"] == {"cpu": "2", "memory": "1Gi"}
        events = _events(c, "/v1/jobs/onk8s/logs?follow=true")
        assert events[-1] == ("end", {"state": "SUCCEEDED"}), events
        lines = [d["text"] for k, d in events if k == "message"]
        assert "rank 0 tinyrt 42" in lines and "rank 1 tinyrt 42" in lines, lines
        assert sum("Successfully installed tinyrt-0.1" in line for line in lines) == 1, lines  # built once
        job = c.get("/v1/jobs/onk8s").json()
        pods = {name for n in job["nodes"] for name in (n["key"], n["host"])}  # a pod per trainer, done
        assert job["state"] == "SUCCEEDED" and {"onk8s-trainer-0", "onk8s-trainer-1"} <= pods, job
        assert {n["state"] for n in job["nodes"]} == {"done"}, job
        for pod in api.list("", "pods", "default"):
            manifest = {k: pod[k] for k in ("apiVersion", "kind", "spec")}
            manifest["metadata"] = {k: pod["metadata"][k] for k in ("name", "namespace", "labels")}
            kubernetes_validate.validate(manifest, "1.32.0", strict=True)
        # Bad input is refused before anything reaches the cluster.
        e = _error(c.post("/v1/trainer/job", json={**body, "job_name": "noimage", "base_image": None}), 400)
        assert "give base_image" in e["message"]
        e = _error(c.post("/v1/trainer/job", json={**body, "job_name": "badmem", "memory": "lots"}), 400)
        assert "memory='lots' is not a Kubernetes quantity" in e["message"], e
        assert api.get(GROUP, VERSION, PLURAL, "default", "badmem") is None
        assert c.delete("/v1/jobs/onk8s").status_code == 200


# -- launch methods beyond torch ----------------------------------------------------

PROGRAM_PACKAGE = """
import sys
from tlaunch import lp_ssh as lp


class ParameterServer:
    def __init__(self, index):
        self.index = index

    def get(self):
        return 10 * self.index


class Trainer:
    def __init__(self, pservers, flags):
        self.pservers, self.flags = pservers, flags

    def run(self):
        got = sorted(p.get() for p in self.pservers)
        print("trainer got", got, "with flags", self.flags, flush=True)
        lp.stop()


def make_program(pservers: int = 1):
    p = lp.Program("ps-job")
    with p.group("pserver"):
        handles = [p.add_node(lp.CourierNode(ParameterServer, i)) for i in range(pservers)]
    with p.group("trainer"):
        p.add_node(lp.CourierNode(Trainer, handles, sys.argv[1:]))  # the job's args, as it is made
    return p


def no_pservers():
    return make_program(1)


def work(scale):
    import os
    return {"rank": int(os.environ["RANK"]), "value": int(scale) * (1 + int(os.environ["RANK"]))}
"""


def test_command_program_and_function_jobs(server: Server, tmp_path: Path) -> None:
    """command: every trainer runs an argv with its rank; program: make_program(pservers=N) of the
    package, launched; function: FILE:FUNCTION in N workers, its results kept with the job."""
    with server.client() as c:
        pkg = _upload(c, {"train.py": PROGRAM_PACKAGE})
        command = ["sh", "-c", 'echo "trainer $RANK of $WORLD_SIZE in $(basename "$PWD")"; exit "${CODE:-0}"']
        body = {"job_name": "cmd", "trainer_package": pkg, "launch_method": "command", "num_trainer": 2,
                "command": command}  # fmt: skip
        assert c.post("/v1/trainer/job", json=body).status_code == 201
        events = _events(c, "/v1/jobs/cmd/logs?follow=true")
        assert events[-1] == ("end", {"state": "SUCCEEDED"}), events
        assert "trainer 1 of 2 in package" in [d["text"] for k, d in events if k == "message"], events
        body.update(job_name="cmd-fails", env={"CODE": "3"}, num_trainer=1)
        assert c.post("/v1/trainer/job", json=body).status_code == 201
        job = _wait(c, "cmd-fails", ("FAILED", "SUCCEEDED"))
        assert job["state"] == "FAILED" and job["exit_code"] == 3, job
        body = {"job_name": "ps", "trainer_package": pkg, "launch_method": "program", "pservers": 3,
                "program": "train.py:make_program", "args": ["--lr", "0.1"]}  # fmt: skip
        r = c.post("/v1/trainer/job", json=body)
        assert r.status_code == 201, r.text
        events = _events(c, "/v1/jobs/ps/logs?follow=true")
        assert events[-1] == ("end", {"state": "SUCCEEDED"}), events
        said = [d["text"] for k, d in events if k == "message"]
        assert "trainer got [0, 10, 20] with flags ['--lr', '0.1']" in said, said
        nodes = {n["key"] for n in c.get("/v1/jobs/ps").json()["nodes"]}
        assert nodes >= {"pserver/0", "pserver/2", "trainer/0"}, nodes
        folder = tmp_path / "ps_job"  # the same from the command line
        folder.mkdir()
        (folder / "train.py").write_text(PROGRAM_PACKAGE)
        env = {**os.environ, "TLAUNCH_SERVER": server.url, "TLAUNCH_TOKEN": ALICE}
        done = subprocess.run(
            [sys.executable, "-m", "tlaunch.cli.main", "job", "submit", str(folder), "--name", "ps-cli",
             "--method", "program", "--program", "train.py:make_program", "--pservers", "2",
             "--", "--lr", "0.5"],
            env=env, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert done.returncode == 0 and "submitted job ps-cli" in done.stdout, done.stdout + done.stderr
        events = _events(c, "/v1/jobs/ps-cli/logs?follow=true")
        said = [d["text"] for k, d in events if k == "message"]
        assert "trainer got [0, 10] with flags ['--lr', '0.5']" in said, said
        body = {"job_name": "fn", "trainer_package": pkg, "launch_method": "function", "nproc_per_node": 2,
                "program": "train.py:work", "args": ["7"]}  # fmt: skip
        assert c.post("/v1/trainer/job", json=body).status_code == 201
        job = _wait(c, "fn", ("SUCCEEDED", "FAILED"), timeout=180)
        assert job["state"] == "SUCCEEDED", job
        workers = [{"rank": 0, "value": 7}, {"rank": 1, "value": 14}]
        assert job["results"] == {"results": {"localhost": workers}}, job
        # What each method cannot take is refused before anything starts, naming it.
        bad = {"job_name": "bad", "trainer_package": pkg}
        for extra, why in (
            ({"launch_method": "program"}, "give program, FILE:FUNCTION"),
            ({"launch_method": "program", "program": "train.py:nope"}, "defines no function 'nope'"),
            ({"launch_method": "program", "program": "train.py:no_pservers", "pservers": 2},
             "no_pservers() takes no 'pservers' parameter"),
            ({"launch_method": "command"}, "give command"),
            ({"launch_method": "torchrun", "pservers": 1, "entry_point": "train.py"},
             "launch_method torchrun has no parameter-server group"),
            ({"launch_method": "program", "program": "train.py:make_program", "kubernetes": {},
              "base_image": "img:1"}, "does not run on Kubernetes"),
        ):  # fmt: skip
            e = _error(c.post("/v1/trainer/job", json={**bad, **extra}), 400)
            assert why in e["message"], (extra, e)
        _error(c.get("/v1/jobs/bad"), 404)


def test_a_torchrun_job_ends_succeeded_or_failed_with_its_rank_not_stopped(server: Server) -> None:
    """A torch job's launcher judges the outcome from its collector and ends the run so: SUCCEEDED,
    or FAILED naming the rank, its host and its traceback (before, such runs always ended STOPPED:
    their launcher stopped them once the outcome was in)."""
    pytest.importorskip("torch")
    with server.client() as c:
        pkg = _upload(c)
        body = {"job_name": "tr", "trainer_package": pkg, "launch_method": "torchrun", "nproc_per_node": 2,
                "args": ["2"]}  # fmt: skip
        assert c.post("/v1/trainer/job", json=body).status_code == 201
        job = _wait(c, "tr", ("SUCCEEDED", "FAILED", "STOPPED", "LOST"), timeout=180)
        assert job["state"] == "SUCCEEDED" and job["exit_code"] == 0, job
        body.update(job_name="tr-fails", env={"FAIL_AT_END": "1"})
        assert c.post("/v1/trainer/job", json=body).status_code == 201
        job = _wait(c, "tr-fails", ("SUCCEEDED", "FAILED", "STOPPED", "LOST"), timeout=180)
        assert job["state"] == "FAILED", job
        failure = job["failure"]
        assert failure["node"] in ("rank 0", "rank 1") and failure["host"] == "localhost", failure
        assert "ValueError: the loss is nan at step 2" in (failure["traceback"] or ""), failure
