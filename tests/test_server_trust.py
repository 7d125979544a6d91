"""The job server as a team's trust boundary: jobs apart from the server, one user apart from another.

Each test drives a real ``python -m tlaunch.server`` process over HTTP (see
``tests/server_helpers.py``), as a user of a shared team server would, and
checks one finding of issue 43 (``docs/security.md`` states what holds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

from server_helpers import ALICE, ROOT, Server, error_of, upload, wait_state

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
