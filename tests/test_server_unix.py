"""``tlaunch server --unix-users``: each user's jobs run as that user's own Unix account.

Two real local accounts are made for the module (``tlaunch.testing.accounts``:
``useradd``, removed after); a real server runs as root with a token per
account. One user's job tries to read everything of the other's (package,
run folder, environment values, process environment) and of the server's
(token file, database, its own process environment), and ``ps`` says which
account each job's processes run as.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

from server_helpers import Server, error_of, upload, wait_state
from test_runtime_env import wheel_bytes

from tlaunch.testing.accounts import TestAccounts, accounts_unavailable

pytestmark = pytest.mark.skipif(accounts_unavailable() is not None, reason=str(accounts_unavailable()))

ALICE, BOB = "unix-alice-token-0123456789", "unix-bob-token-0123456789ab"

HOLDER = """
import json, os, sys, time
print("HELD " + json.dumps({"pid": os.getpid(), "cwd": os.getcwd()}), flush=True)
time.sleep(120)
"""

PROBE = """
import json, os, sys
def tried(path, write=False):
    try:
        if write:
            with open(os.path.join(path, "planted.py"), "w") as f:
                f.write("print('planted')")
            return "written"
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
        return "read"
    except OSError as exc:
        return type(exc).__name__
paths = json.loads(sys.argv[1])
out = {name: tried(path) for name, path in paths.items()}
import site
out["own runtime environment"] = tried(site.getsitepackages()[0], write=True)
out["uid"], out["groups"], out["home"] = os.getuid(), sorted(os.getgroups()), os.environ["HOME"]
print("PROBE " + json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def accounts() -> Iterator[TestAccounts]:
    with TestAccounts("alice", "bob") as made:
        yield made
        deadline = time.monotonic() + 10  # an SSH session's last processes end as their sshd does
        while (left := made.pids()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], f"processes of the test accounts were left: {[_stat(p) for p in left]}"


@pytest.fixture(scope="module")
def server(accounts: TestAccounts) -> Iterator[Server]:
    """The server as root; its home in a folder each account can pass through (pytest's are root's)."""
    top = tempfile.mkdtemp(prefix="tlaunch-unix-", dir="/var/tmp")
    os.chmod(top, 0o711)
    tokens = f"{ALICE} {accounts['alice'].name}\n{BOB} {accounts['bob'].name}\n"
    env = {**os.environ, "PGPASSWORD": "pg-secret-4242"}
    srv = Server(Path(top) / "home", tokens=tokens, env=env, extra=["--unix-users"])
    try:
        yield srv
    finally:
        try:
            srv.stop()
        finally:  # its home goes whatever its log says
            shutil.rmtree(top, ignore_errors=True)


def _said(c: Any, name: str, word: str) -> dict[str, Any]:
    for line in c.get(f"/v1/jobs/{name}/logs").iter_lines():
        if line.startswith("data: ") and f"{word} " in line:
            text = json.loads(line[6:])["text"]
            return dict(json.loads(text[text.index(f"{word} ") + len(word) + 1 :]))
    raise AssertionError(f"job {name} said no {word}: {c.get(f'/v1/jobs/{name}').json()}")


def _stat(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return f"{pid} (gone)"


def _uid_of(pid: int) -> int:
    return os.stat(f"/proc/{pid}").st_uid


def test_each_users_job_runs_as_their_account_and_reads_nothing_of_the_others(
    server: Server, accounts: TestAccounts
) -> None:
    alice, bob = accounts["alice"], accounts["bob"]
    assert server.proc is not None
    with server.client(ALICE) as a, server.client(BOB) as b:
        held = upload(b, {"train.py": HOLDER, "requirements.txt": ""})
        body = {"job_name": "holder", "trainer_package": held, "env": {"BOB_SECRET": "bob-secret-4242"}}
        assert b.post("/v1/trainer/job", json=body).status_code == 201
        wait_state(b, "holder", ("RUNNING",))
        deadline = time.monotonic() + 60
        while True:
            try:
                holder = _said(b, "holder", "HELD")
                break
            except AssertionError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        bob_run = b.get("/v1/jobs/holder").json()["refs"]["run_id"]
        bob_home = server.home / "users" / bob.name
        paths = {
            "the token file": str(server.token_file),
            "the database": str(server.home / "server" / "jobs.db"),
            "the package store": str(server.home / "server" / "packages" / bob.name / held / "files"),
            "the other's package copy": os.path.join(holder["cwd"], "train.py"),
            "the other's run folder": str(bob_home / "runs" / bob_run),
            "the other's TLAUNCH_HOME": str(bob_home),
            "the other's trainer's environment": f"/proc/{holder['pid']}/environ",
            "the server's environment": f"/proc/{server.proc.pid}/environ",
        }
        # an environment of its own (a wheel of the package's: nothing downloaded)
        probe = upload(a, {**_who_package(), "train.py": PROBE})
        body = {"job_name": "probe", "trainer_package": probe, "args": [json.dumps(paths)]}
        assert a.post("/v1/trainer/job", json=body).status_code == 201
        job = wait_state(a, "probe", ("SUCCEEDED", "FAILED"), timeout=180)
        assert job["state"] == "SUCCEEDED", job
        found = _said(a, "probe", "PROBE")
        # ps: each job under its own account.
        assert _uid_of(holder["pid"]) == bob.uid
        ps = subprocess.run(["ps", "-o", "user=", "-p", str(holder["pid"])], capture_output=True, text=True)
        assert ps.stdout.strip() in (bob.name, str(bob.uid)), ps.stdout
        b.post("/v1/jobs/holder/stop")
        wait_state(b, "holder", ("STOPPED",))
    assert found.pop("uid") == alice.uid and found.pop("home") == alice.home
    assert found.pop("groups") == sorted(alice.groups)
    assert found == {**dict.fromkeys(paths, "PermissionError"), "own runtime environment": "PermissionError"}
    # What each account owns of the server's home: its own folder, nobody else's.
    assert (server.home / "users" / alice.name).stat().st_uid == alice.uid
    assert oct((server.home / "users" / alice.name).stat().st_mode & 0o777) == "0o700"
    assert (server.home / "server").stat().st_uid == 0
    assert oct((server.home / "server").stat().st_mode & 0o777) == "0o700"


def _serve(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tlaunch.server", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **kwargs,
    )


def test_an_unknown_account_or_a_server_not_root_is_refused_at_start(
    accounts: TestAccounts, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ALICE} {accounts['alice'].name}\n{BOB} nobody-here-4242\n")
    tokens.chmod(0o600)
    done = _serve("--unix-users", "--home", str(tmp_path / "h"), "--token-file", str(tokens))
    assert done.returncode == 2 and "'nobody-here-4242' is not an account of this machine" in done.stderr
    tokens.write_text(f"{ALICE} {accounts['alice'].name}\n")
    os.chown(tokens, accounts["alice"].uid, accounts["alice"].gid)
    done = _serve("--unix-users", "--home", str(tmp_path / "h"), "--token-file", str(tokens))
    assert done.returncode == 2 and "owned by root" in done.stderr, done.stderr
    open_home = tmp_path / "open"
    open_home.mkdir(mode=0o755)
    os.chown(open_home, accounts["alice"].uid, accounts["alice"].gid)
    as_alice = accounts["alice"].drop()
    done = _serve("--unix-users", "--home", str(open_home / "h"), cwd=str(open_home), **as_alice)
    assert done.returncode == 2 and "--unix-users needs the server to run as root" in done.stderr, done.stderr


def test_without_unix_users_the_server_says_it_runs_every_job_as_itself(tmp_path: Path) -> None:
    srv = Server(tmp_path / "home")
    try:
        with srv.client(None) as c:
            error_of(c.get("/v1/jobs"), 401)
    finally:
        srv.stop()
    assert "users: one account: for a single trusted team" in srv.log.read_text()


WHO = """
import json, os, socket, sys, tinyrt
who = {"uid": os.getuid(), "host": socket.gethostname(), "home": os.environ["HOME"]}
who.update(tinyrt=tinyrt.VALUE, env=sys.prefix, env_owner=os.stat(sys.prefix).st_uid)
print("WHO " + json.dumps(who), flush=True)
"""
WHEEL = "tinyrt-0.1-py3-none-any.whl"


def _who_package() -> dict[str, str | bytes]:
    """WHO, with a requirement: its runtime environment, built where it runs as the user's account."""
    return {"train.py": WHO, WHEEL: wheel_bytes(7), "requirements.txt": f"./{WHEEL}\n"}


def _ssh_identity(account: Any, ssh_hosts: Any) -> None:
    """The account's own SSH key and config (``~/.ssh``), as a user sets them up: the test hosts let
    its key in, and its config names them."""
    ssh = Path(account.home) / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    key = ssh / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (ssh / "authorized_keys").write_text((ssh / "id_ed25519.pub").read_text())
    shutil.copy(ssh_hosts.known_hosts, ssh / "known_hosts")
    (ssh / "config").write_text(
        "".join(
            f"Host {h.name}\n  HostName {h.address}\n  User {account.name}\n  IdentityFile {key}\n"
            f"  IdentitiesOnly yes\n  StrictHostKeyChecking yes\n"
            for h in ssh_hosts.hosts
        )
    )
    for path in [ssh, *ssh.iterdir()]:
        os.chown(path, account.uid, account.gid)
        path.chmod(0o700 if path.is_dir() else 0o600)


@pytest.mark.ssh
def test_on_ssh_hosts_each_users_job_runs_as_their_account_there(
    server: Server, accounts: TestAccounts, ssh_hosts: Any
) -> None:
    for short in ("alice", "bob"):
        _ssh_identity(accounts[short], ssh_hosts)
    seen = {}
    for short, token in (("alice", ALICE), ("bob", BOB)):
        with server.client(token) as c:
            pkg = upload(c, _who_package())
            body = {
                "job_name": "who-ssh",
                "trainer_package": pkg,
                "hosts": ["th2"],
            }  # their own ~/.ssh/config
            r = c.post("/v1/trainer/job", json=body)
            assert r.status_code == 201, r.text
            job = wait_state(c, "who-ssh", ("SUCCEEDED", "FAILED"), timeout=120)
            assert job["state"] == "SUCCEEDED", job
            seen[short] = _said(c, "who-ssh", "WHO")
            assert ssh_hosts.wait_no_leftovers(job["refs"]["run_id"], 10) == {}
    for short in ("alice", "bob"):
        account = accounts[short]
        env = seen[short].pop("env")  # no root there: the account's own environment, in its home
        assert env.startswith(f"{account.home}/.tlaunch/envs/"), env
        assert seen[short] == {"uid": account.uid, "host": "th2", "home": account.home, "tinyrt": 7,
                               "env_owner": account.uid}  # fmt: skip


@pytest.mark.slurm
def test_on_slurm_each_users_job_is_their_own_sbatch(accounts: TestAccounts, slurm_cluster: Any) -> None:
    """The server's home on the cluster's shared folder; each user's job is their own batch job: SLURM
    says its user is the account, and its processes on the nodes run as it."""
    top = slurm_cluster.open_to_users()
    tokens = f"{ALICE} {accounts['alice'].name}\n{BOB} {accounts['bob'].name}\n"
    srv = Server(Path(top) / "home", tokens=tokens, env=slurm_cluster.env, extra=["--unix-users"])
    try:
        for short, token in (("alice", ALICE), ("bob", BOB)):
            account = accounts[short]
            with srv.client(token) as c:
                body = {"job_name": "who-slurm", "trainer_package": upload(c, _who_package()),
                        "slurm": {"time": "5"}}  # fmt: skip
                r = c.post("/v1/trainer/job", json=body)
                assert r.status_code == 201, r.text
                job = wait_state(c, "who-slurm", ("SUCCEEDED", "FAILED"), timeout=180)
                assert job["state"] == "SUCCEEDED", job
                who = _said(c, "who-slurm", "WHO")
            assert who["uid"] == account.uid and who["host"] in slurm_cluster.nodes, who
            # no root on the cluster's nodes: the account's own environment, on the shared folder
            assert who["env"].startswith(f"{top}/home/users/{account.name}/envs/"), who
            assert who["env_owner"] == account.uid and who["tinyrt"] == 7, who
            shown = subprocess.run(
                ["scontrol", "show", "job", job["refs"]["slurm_job"]],
                env=slurm_cluster.env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert f"UserId={account.name}({account.uid})" in shown, shown
    finally:
        try:
            srv.stop()
        finally:  # its home goes whatever its log says
            shutil.rmtree(top, ignore_errors=True)


def test_on_kubernetes_each_users_job_is_created_as_them(  # type: ignore[no-untyped-def]
    accounts: TestAccounts, cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The LPJob is created with the server's credentials as its user (``Impersonate-User``), so the
    cluster's RBAC decides: in the namespace granted to them it runs; in another it is refused. Its run
    is the user's, in their own folder."""
    from tlaunch.k8s.crd import GROUP, PLURAL, VERSION

    api, _ = cluster
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")  # the pods' python
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    alice = accounts["alice"]
    for ns in ("team-a", "team-b"):
        api.create("", "v1", "namespaces", None, {"metadata": {"name": ns}})
    api.grant(alice.name, "team-a")
    top = tempfile.mkdtemp(prefix="tlaunch-unix-", dir="/var/tmp")
    os.chmod(top, 0o711)
    srv = Server(Path(top) / "home", tokens=f"{ALICE} {alice.name}\n", extra=["--unix-users"])
    try:
        with srv.client(ALICE) as c:
            pkg = upload(c, {"train.py": "print('trained on kubernetes', flush=True)\n"})
            body = {"job_name": "onk8s", "trainer_package": pkg, "base_image": "trainer:1",
                    "kubernetes": {"namespace": "team-a"}}  # fmt: skip
            r = c.post("/v1/trainer/job", json=body)
            assert r.status_code == 201, r.text
            job = wait_state(c, "onk8s", ("SUCCEEDED", "FAILED"), timeout=120)
            assert job["state"] == "SUCCEEDED", job
            run_dir = Path(top) / "home" / "users" / alice.name / "runs" / job["refs"]["run_id"]
            assert run_dir.stat().st_uid == alice.uid
            body = {**body, "job_name": "elsewhere", "kubernetes": {"namespace": "team-b"}}
            assert c.post("/v1/trainer/job", json=body).status_code == 201  # answered before its launch
            job = wait_state(c, "elsewhere", ("FAILED", "SUCCEEDED"), timeout=120)  # which RBAC refuses
            said = job["message"]
            assert job["state"] == "FAILED" and "403 Forbidden" in said, job
            assert f'{alice.name}\\" cannot create' in said, job
        assert (alice.name, "POST", PLURAL, "team-a") in api.impersonated
        assert api.get(GROUP, VERSION, PLURAL, "team-b", "elsewhere") is None
        assert {user for user, *_ in api.impersonated} == {alice.name}
    finally:
        try:
            srv.stop()
        finally:  # its home goes whatever its log says
            shutil.rmtree(top, ignore_errors=True)
