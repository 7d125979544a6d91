"""The job server as a team's trust boundary: jobs apart from the server, one user apart from another.

Each test drives a real ``python -m tlaunch.server`` process over HTTP (see
``tests/server_helpers.py``), as a user of a shared team server would, and
checks one finding of issue 43 (``docs/security.md`` states what holds).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

from server_helpers import ALICE, BOB, ROOT, Server, error_of, upload, wait_state, zip_of

SECRETS = {
    "PGPASSWORD": "pg-secret-4242",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-4242",
    "TLAUNCH_SERVER_TOKEN": "env-admin-token-4242-4242",
}

SHOW = """
import json, os, sys
try:
    open(f"/proc/{sys.argv[1]}/environ", "rb").read()
    server_environ = "read"
except OSError as exc:
    server_environ = type(exc).__name__
print("SHOW " + json.dumps({"env": dict(os.environ), "server_environ": server_environ}), flush=True)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the module, with secrets in its environment and its database named by one."""
    home = tmp_path_factory.mktemp("trust") / "home"
    env = {**os.environ, **SECRETS, "NCCL_DEBUG": "INFO", "TLAUNCH_SERVER_DB": f"sqlite:///{home}.db"}
    srv = Server(home, env=env, extra=["--job-env", "NCCL_*"])
    try:
        yield srv
    finally:
        srv.stop()


def _shown(c: Any, name: str) -> dict[str, Any]:
    """What the SHOW script of job ``name`` printed (its first rank's line)."""
    for line in c.get(f"/v1/jobs/{name}/logs").iter_lines():
        if line.startswith("data: ") and "SHOW " in line:
            text = json.loads(line[6:])["text"]
            return dict(json.loads(text[text.index("SHOW ") + 5 :]))
    raise AssertionError(f"job {name} printed nothing: {c.get(f'/v1/jobs/{name}').json()}")


def test_a_job_gets_no_variable_of_the_servers_environment(server: Server) -> None:
    assert server.proc is not None
    with server.client() as c:
        pkg = upload(c, {"show.py": SHOW})
        body = {"job_name": "env", "trainer_package": pkg, "entry_point": "show.py",
                "args": [str(server.proc.pid)], "env": {"MINE": "mine"}}  # fmt: skip
        assert c.post("/v1/trainer/job", json=body).status_code == 201
        job = wait_state(c, "env", ("SUCCEEDED", "FAILED"))
        assert job["state"] == "SUCCEEDED", job
        shown = _shown(c, "env")
    env = shown["env"]
    leaked = {k: v for k, v in env.items() if k in SECRETS or any(s in v for s in SECRETS.values())}
    assert leaked == {}, leaked
    assert "TLAUNCH_SERVER_DB" not in env and str(server.home) + ".db" not in json.dumps(env)
    assert env["MINE"] == "mine" and env["NCCL_DEBUG"] == "INFO"  # its spec's, and what --job-env passes
    assert env["HOME"] and env["TLAUNCH_HOME"] and env["RANK"] == "0"
    # The database came from $TLAUNCH_SERVER_DB.
    assert Path(f"{server.home}.db").is_file() and not (server.home / "server" / "jobs.db").exists()


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m tlaunch.server ARGS`` that ends at once (a refused start)."""
    return subprocess.run(
        [sys.executable, "-m", "tlaunch.server", "--port", "1", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_a_database_password_is_never_on_the_command_line_or_in_a_message(tmp_path: Path) -> None:
    url = "postgresql://team:hunter2-secret@127.0.0.1:1/jobs"  # nothing listens on port 1
    home = ["--home", str(tmp_path / "home")]
    refused = _serve(*home, "--db", url)
    assert refused.returncode == 2 and "holds a password" in refused.stderr, refused.stderr
    assert "hunter2" not in refused.stderr and "TLAUNCH_SERVER_DB" in refused.stderr
    for given, env in (
        (["--db-file", str(tmp_path / "dsn")], None),
        ([], {**os.environ, "TLAUNCH_SERVER_DB": url}),
    ):
        (tmp_path / "dsn").write_text(url + "\n")
        failed = _serve(*home, *given, env=env)
        assert failed.returncode == 2, failed.stderr
        assert "team:***@127.0.0.1:1/jobs" in failed.stderr and "hunter2" not in failed.stderr, failed.stderr


def test_the_admin_token_of_the_environment_still_works(server: Server) -> None:
    with server.client(SECRETS["TLAUNCH_SERVER_TOKEN"]) as c:
        assert c.get("/v1/jobs").status_code == 200
    with server.client(ROOT) as c, server.client(ALICE) as a:
        assert c.get("/v1/version").status_code == 200
        error_of(a.get("/v1/jobs", params={"owner": "root"}), 403)


# -- users apart on one account: names, packages, copies --------------------------------


def _submit(c: Any, name: str, pkg: str, **fields: Any) -> Any:
    return c.post("/v1/trainer/job", json={"job_name": name, "trainer_package": pkg, **fields})


def test_job_names_are_per_user_and_an_answer_never_tells_of_anothers(server: Server) -> None:
    with server.client(ALICE) as alice, server.client(BOB) as bob, server.client(ROOT) as admin:
        mine, his = upload(alice), upload(bob)
        assert _submit(alice, "train", mine).status_code == 201
        assert _submit(bob, "train", his).status_code == 201  # the same name, another user's
        assert _submit(bob, "bobs-only", his).status_code == 201
        assert alice.get("/v1/jobs/train").json()["owner"] == "alice"
        assert bob.get("/v1/jobs/train").json()["owner"] == "bob"
        e = error_of(_submit(alice, "train", mine), 409)
        assert e["message"].startswith("you have a job named 'train'"), e
        # Another user's job and no job at all read the same, whatever is asked.
        for path in ("/v1/jobs/bobs-only", "/v1/jobs/nothing-here"):
            name = path.rsplit("/", 1)[1]
            assert error_of(alice.get(path), 404)["message"] == f"no job {name!r}"
            assert error_of(alice.post(f"{path}/stop"), 404)["message"] == f"no job {name!r}"
            assert error_of(alice.delete(path), 404)["message"] == f"no job {name!r}"
        error_of(alice.get("/v1/jobs/train", params={"owner": "bob"}), 404)
        # An admin names them with their owner.
        e = error_of(admin.get("/v1/jobs/train"), 409)
        assert "alice, bob each have a job 'train'" in e["message"], e
        assert admin.get("/v1/jobs/train", params={"owner": "bob"}).json()["owner"] == "bob"
        assert admin.get("/v1/jobs/bobs-only").json()["owner"] == "bob"  # only one has it
        for c, name in ((alice, "train"), (bob, "train"), (bob, "bobs-only")):
            wait_state(c, name, ("SUCCEEDED",))
        for c in (alice, bob):
            c.delete("/v1/jobs/train")
        bob.delete("/v1/jobs/bobs-only")
    with server.client(BOB) as bob:
        assert _submit(bob, "named", upload(bob)).status_code == 201
    from tlaunch.jobs import Client

    with Client(server.url, ROOT) as client:  # the client's way: owner/name
        assert client.get("bob/named")["owner"] == "bob"
        assert client.wait("bob/named", timeout=60)["state"] == "SUCCEEDED"
        client.delete("bob/named")


def test_a_package_is_its_uploaders_unless_shared(server: Server) -> None:
    with server.client(ALICE) as alice, server.client(BOB) as bob:
        data = zip_of({"train.py": "print('alice was here')\n"})  # the same bytes for both (a zip has times)
        pkg = alice.post("/v1/package", content=data).json()["package_id"]
        error_of(bob.get(f"/v1/packages/{pkg}"), 404)
        e = error_of(_submit(bob, "guessed", pkg), 404)
        assert "upload it first" in e["message"]
        again = bob.post("/v1/package", content=data)  # the same bytes: his own copy
        assert again.status_code == 201 and again.json()["package_id"] == pkg
        shared = alice.post(
            "/v1/package", params={"shared": "true"}, content=zip_of({"train.py": "print(2)"})
        )
        assert shared.status_code == 201 and shared.json()["shared"] is True
        assert bob.get(f"/v1/packages/{shared.json()['package_id']}").json()["shared"] is True
        assert _submit(bob, "from-shared", shared.json()["package_id"]).status_code == 201
        assert wait_state(bob, "from-shared", ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"
        bob.delete("/v1/jobs/from-shared")


WRITER = """
import hashlib, os, sys
print("FILES", sorted(os.listdir(".")), flush=True)
print("SOURCE", hashlib.sha256(open(__file__, "rb").read()).hexdigest(), flush=True)
with open(__file__, "a") as f:
    f.write("# tampered\\n")
with open("checkpoint.bin", "wb") as f:
    f.write(os.urandom(64))
"""


def _printed(c: Any, name: str, word: str) -> str:
    for line in c.get(f"/v1/jobs/{name}/logs").iter_lines():
        if line.startswith("data: ") and f"{word} " in line:
            text = json.loads(line[6:])["text"]
            return str(text[text.index(f"{word} ") + len(word) + 1 :])
    raise AssertionError(f"job {name} printed no {word}")


def test_a_job_writing_into_its_folder_changes_its_own_copy_only(server: Server) -> None:
    files = {"train.py": WRITER, "data.txt": "x"}
    data = zip_of(files)
    with server.client(ALICE) as alice, server.client(BOB) as bob:
        pkg = alice.post("/v1/package", content=data).json()["package_id"]
        for c, name in ((alice, "writer-1"), (alice, "writer-2"), (bob, "writer-b")):
            if c is bob:  # the same bytes, his own
                assert bob.post("/v1/package", content=data).json()["package_id"] == pkg
            assert _submit(c, name, pkg).status_code == 201
            assert wait_state(c, name, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"
            # Each job sees the package as it was uploaded: no checkpoint, no edit of an earlier job.
            assert _printed(c, name, "FILES") == "['data.txt', 'train.py']"
            assert _printed(c, name, "SOURCE") == hashlib.sha256(WRITER.encode()).hexdigest()
            c.delete(f"/v1/jobs/{name}")
    for who in ("alice", "bob"):
        stored = server.home / "server" / "packages" / who / pkg / "files"
        assert sorted(p.name for p in stored.iterdir()) == ["data.txt", "train.py"]
        assert (stored / "train.py").read_text() == WRITER
        assert oct((stored / "train.py").stat().st_mode & 0o777) == "0o400"
        assert oct(stored.stat().st_mode & 0o777) == "0o500"


def test_a_package_changed_on_disk_is_refused_and_removed(server: Server) -> None:
    with server.client(ALICE) as alice:
        data = zip_of({"train.py": "print('as uploaded')\n"})
        pkg = alice.post("/v1/package", content=data).json()["package_id"]
        stored = server.home / "server" / "packages" / "alice" / pkg / "files" / "train.py"
        stored.chmod(0o600)
        stored.write_text("print('changed behind the server')\n")
        # Answered as accepted (a submit answers before the job's copy is made); the copy finds the
        # change, and the job fails with why, having run nothing.
        assert _submit(alice, "changed", pkg).status_code == 201
        job = wait_state(alice, "changed", ("FAILED", "SUCCEEDED"))
        assert job["state"] == "FAILED" and "changed on disk since it was stored" in job["message"], job
        assert job["refs"]["run_id"] is None and not stored.exists()
        assert alice.post("/v1/package", content=data).status_code == 201  # stored again
        assert _submit(alice, "changed-2", pkg).status_code == 201
        assert wait_state(alice, "changed-2", ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"
