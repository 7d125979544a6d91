"""``tlaunch server --unix-users``: a runtime environment is built by its user, then sealed by the server.

Two real local accounts (``tlaunch.testing.accounts``) and a real server as
root. Bob's job holds his environment; Alice's job tries every way to write
into her own (its folder, its module, a new module, a chmod, a rename) and to
read Bob's: each is refused, as root owns them. Her second job, of edited code
and the same requirements, reuses her environment and imports the package as
it was built. The server's collector removes the environments nobody holds
(root's), keeps Bob's while his job runs, and collects a user's own folder of
environments as that user. The copy that seals an environment refuses what a
build must not leave (links out of it, a FIFO), and a descriptor opened on the
user's file before the seal does not write into the sealed one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

from server_helpers import Server, events, upload, wait_state
from test_runtime_env import wheel_bytes

from tlaunch.testing.accounts import TestAccounts, accounts_unavailable

pytestmark = pytest.mark.skipif(accounts_unavailable() is not None, reason=str(accounts_unavailable()))

ALICE, BOB = "envs-alice-token-0123456789", "envs-bob-token-0123456789ab"
WHEEL = "tinyrt-0.1-py3-none-any.whl"
ENDED = ("SUCCEEDED", "FAILED", "STOPPED", "LOST")

HOLDER = """
import sys, time, tinyrt
print("HELD", sys.prefix, flush=True)
time.sleep(120)
"""

PROBE = """
import json, os, sys, tinyrt
module = tinyrt.__file__
package = os.path.dirname(module)
def tried(what):
    try:
        what()
        return "done"
    except OSError as exc:
        return type(exc).__name__
out = {
    "chmod its package folder": tried(lambda: os.chmod(package, 0o755)),
    "chmod its module": tried(lambda: os.chmod(module, 0o644)),
    "append to its module": tried(lambda: open(module, "a").close()),
    "add a module": tried(lambda: open(os.path.join(os.path.dirname(package), "planted.py"), "w").close()),
    "move the environment": tried(lambda: os.rename(sys.prefix, sys.prefix + "-moved")),
    "list the other's environments": tried(lambda: os.listdir(sys.argv[1])),
}
out.update(value=tinyrt.VALUE, prefix=sys.prefix, owner=os.stat(module).st_uid)
print("ENV " + json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def accounts() -> Iterator[TestAccounts]:
    with TestAccounts("alice", "bob") as made:
        yield made
        deadline = time.monotonic() + 10
        while (left := made.pids()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], f"processes of the test accounts were left: {left}"


@pytest.fixture(scope="module")
def server(accounts: TestAccounts) -> Iterator[Server]:
    """The server as root; its home in a folder each account can pass through (pytest's are root's)."""
    top = tempfile.mkdtemp(prefix="tlaunch-unix-envs-", dir="/var/tmp")
    os.chmod(top, 0o711)
    tokens = f"{ALICE} {accounts['alice'].name}\n{BOB} {accounts['bob'].name}\n"
    srv = Server(Path(top) / "home", tokens=tokens, extra=["--unix-users"])
    try:
        yield srv
    finally:
        try:
            srv.stop()
        finally:
            shutil.rmtree(top, ignore_errors=True)


def _said(c: Any, name: str, word: str) -> str:
    for kind, data in events(c, f"/v1/jobs/{name}/logs"):
        text = data.get("text", "")
        if kind == "message" and f"{word} " in text:
            return str(text[text.index(f"{word} ") + len(word) + 1 :])
    raise AssertionError(f"job {name} said no {word}: {c.get(f'/v1/jobs/{name}').json()}")


def _built(c: Any, name: str) -> list[str]:
    return [d["text"] for k, d in events(c, f"/v1/jobs/{name}/logs?node=runtime-env") if k == "message"]


def _store(server: Server, accounts: TestAccounts) -> Any:
    from tlaunch.server.envstore import EnvStore
    from tlaunch.server.unixusers import UnixUsers

    names = [accounts["alice"].name, accounts["bob"].name]
    return EnvStore(UnixUsers(str(server.home), names), max_bytes=1 << 30)


def test_a_users_job_cannot_write_into_any_runtime_environment_and_the_next_reuses_it_unchanged(
    server: Server, accounts: TestAccounts
) -> None:
    alice, bob = accounts["alice"], accounts["bob"]
    envs = server.home / "users" / ".envs"
    wheel = {WHEEL: wheel_bytes(42), "requirements.txt": f"./{WHEEL}\n"}
    with server.client(ALICE) as a, server.client(BOB) as b:
        body = {"job_name": "holder", "trainer_package": upload(b, {"train.py": HOLDER, **wheel})}
        assert b.post("/v1/trainer/job", json=body).status_code == 201
        wait_state(b, "holder", ("RUNNING",), timeout=180)
        deadline = time.monotonic() + 60
        while True:  # its first line, once its log has it
            try:
                bobs = _said(b, "holder", "HELD")
                break
            except AssertionError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert Path(bobs).parent == envs / bob.name, bobs
        for n, train in enumerate((PROBE, PROBE + "# tuned the learning rate\n")):
            body = {"job_name": f"probe-{n}", "trainer_package": upload(a, {"train.py": train, **wheel}),
                    "args": [str(envs / bob.name)]}  # fmt: skip
            assert a.post("/v1/trainer/job", json=body).status_code == 201
            job = wait_state(a, f"probe-{n}", ENDED, timeout=180)
            assert job["state"] == "SUCCEEDED", job
            said = json.loads(_said(a, f"probe-{n}", "ENV"))
            assert said.pop("value") == 42 and said.pop("owner") == 0, said
            prefix = said.pop("prefix")
            assert Path(prefix).parent == envs / alice.name and prefix != bobs, prefix
            assert set(said.values()) == {"PermissionError"}, said
            built = _built(a, f"probe-{n}")
            # The first job's launcher (Alice's account) built it and the server sealed it; the next used it.
            assert any(f"{'built' if n == 0 else 'using'} the runtime environment {prefix}" in line
                       for line in built), built  # fmt: skip
            assert n == 0 or not any("Successfully installed" in line for line in built), built
        for path in (Path(prefix), Path(bobs)):
            assert {(p.stat(follow_symlinks=False).st_uid, p.stat(follow_symlinks=False).st_mode & 0o222)
                    for p in [path, *path.rglob("*")] if not p.is_symlink()} == {(0, 0)}  # fmt: skip
        # The collector: Alice's is unused (removed), Bob's held by his running job (kept), then removed.
        store = _store(server, accounts)
        _collected(store, prefix)
        assert Path(bobs).is_dir()
        b.post("/v1/jobs/holder/stop")
        wait_state(b, "holder", ("STOPPED",))
    _collected(store, bobs)


def _collected(store: Any, path: str) -> None:
    """Collect until ``path`` is removed (its last job's launcher holds it until its processes are gone)."""
    deadline = time.monotonic() + 30
    while Path(path).exists():
        assert store.collect(keep_bytes=0, keep_days=0) in ([], [path]) and time.monotonic() < deadline
        time.sleep(0.2)


def test_a_failed_build_fails_the_job_and_leaves_nothing_in_the_store(
    server: Server, accounts: TestAccounts
) -> None:
    alice = accounts["alice"]
    with server.client(ALICE) as a:
        pkg = upload(a, {"train.py": "print('never')\n", "requirements.txt": "./not-a-wheel.whl\n"})
        r = a.post("/v1/trainer/job", json={"job_name": "bad-env", "trainer_package": pkg})
        assert r.status_code == 201, r.text
        job = wait_state(a, "bad-env", ENDED, timeout=180)
    assert job["state"] == "FAILED" and job["failure"]["node"] == "runtime-env", job
    assert "not-a-wheel.whl" in json.dumps(job["failure"]), job["failure"]
    deadline = time.monotonic() + 10  # the connection ended before "built": the server removes the folder
    store = server.home / "users" / ".envs" / alice.name
    while left := [p.name for p in store.iterdir() if p.suffix != ".lock"]:
        assert time.monotonic() < deadline, left
        time.sleep(0.1)


def test_a_users_own_folder_of_environments_is_collected_as_that_user(
    server: Server, accounts: TestAccounts
) -> None:
    """A folder the user owns (SLURM jobs build there): root never removes in it; the user's process does."""
    from tlaunch.runtime.pyenv import MARKER

    alice = accounts["alice"]
    old = server.home / "users" / alice.name / "envs" / ("a" * 64)
    (old / "lib").mkdir(parents=True)
    (old / MARKER).write_text(json.dumps({"bytes": 10}))
    os.utime(old / MARKER, (time.time() - 90 * 86400,) * 2)
    (old / "lib").chmod(0o500)
    for path in (old.parent, old, old / "lib", old / MARKER):
        os.chown(path, alice.uid, alice.gid)
    assert _store(server, accounts).collect(keep_bytes=1 << 30, keep_days=30) == [str(old)]
    assert not old.exists()


def test_the_sealer_answers_only_the_servers_users(server: Server) -> None:
    with socket.socket(socket.AF_UNIX) as conn:  # this test runs as root: no user of the server
        conn.connect(str(server.home / "users" / ".envs" / ".sealer"))
        answer = json.loads(conn.makefile("rb").readline())  # at once, before it reads a request
    assert answer == {"error": "uid 0 is not a user of this server"}


def test_sealing_copies_into_new_files_and_refuses_links_out_and_fifos(tmp_path: Path) -> None:
    from tlaunch.server.sealcopy import Refused, copy_sealed

    built = tmp_path / "built"
    (built / "bin").mkdir(parents=True)
    (built / "bin" / "tool").write_text("#!/bin/sh\n")
    (built / "bin" / "tool").chmod(0o4755)  # a set-uid bit is never copied
    (built / "bin" / "python").symlink_to(os.path.realpath(shutil.which("python3") or "/usr/bin/python3"))
    (built / "lib64").symlink_to("lib")
    (built / "lib").mkdir()
    module = built / "lib" / "mod.py"
    module.write_text("VALUE = 1\n")
    held = open(module, "a")  # a job of the user's kept it open while the environment was built
    python = os.path.realpath(built / "bin" / "python")
    links = frozenset({python})
    sealed = tmp_path / "sealed"
    assert copy_sealed(str(built), str(sealed), max_bytes=1 << 20, owner=0, links=links) == 20
    held.write("VALUE = 2\n")
    held.close()
    assert (sealed / "lib" / "mod.py").read_text() == "VALUE = 1\n"
    assert stat.S_IMODE((sealed / "bin" / "tool").stat().st_mode) == 0o555
    assert {stat.S_IMODE(p.lstat().st_mode) for p in (sealed / "lib", sealed / "lib" / "mod.py")} == {
        0o555,
        0o444,
    }
    assert os.readlink(sealed / "lib64") == "lib"

    def theirs(path: Path) -> None:  # as a hard link to a file the user could not read would be
        path.write_text("secret")
        os.chown(path, 12345, 12345)

    for name, make, said in (
        ("out", lambda p: p.symlink_to("/home"), "link out of the environment (to /home)"),
        ("up", lambda p: p.symlink_to("../../etc"), "link out of the environment"),
        ("fifo", os.mkfifo, "is not a file, a folder or a link"),
        ("theirs", theirs, "lib/theirs is not the user's (its owner is uid 12345)"),
    ):
        make(built / "lib" / name)
        with pytest.raises(Refused, match=re.escape(said)):
            copy_sealed(str(built), str(tmp_path / name), max_bytes=1 << 20, owner=0, links=links)
        (built / "lib" / name).unlink()
    with pytest.raises(Refused, match="larger than 10 bytes"):
        copy_sealed(str(built), str(tmp_path / "sealed-big"), max_bytes=10, owner=0, links=links)
