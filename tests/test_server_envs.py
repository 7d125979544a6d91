"""What a job of the server gets, against a real server process: an environment keyed by what it
installs, and its package, nothing of the server's own folder.

An edited package (one comment in ``train.py``) runs in the environment the
first one built; a changed requirement (the wheel it names rebuilt) builds
another; a submit's ``pip: [...]`` with the same lines is the same
environment; a requirements file of the package named by ``requirements:``
(a lock, with hashes) is refused when a hash does not match. Environments
nobody uses are removed past their age or the size bound; one a job holds
stays. An SSH job of a server started in a folder of ``.py`` files ships none
of them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from server_helpers import ROOT, Server, events, upload, wait_state
from test_runtime_env import wheel_bytes

WHEEL = "tinyrt-0.1-py3-none-any.whl"
TRAINER = """
import os, tinyrt
print("rank", os.environ["RANK"], "tinyrt", tinyrt.VALUE, flush=True)
"""
ENDED = ("SUCCEEDED", "FAILED", "STOPPED", "LOST")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("envs") / "home"
    srv = Server(home)
    try:
        yield srv
    finally:
        with srv.client(ROOT) as c:
            for job in c.get("/v1/jobs", params={"limit": 500}).json()["jobs"]:
                if job["state"] not in ENDED:
                    c.post(f"/v1/jobs/{job['name']}/stop")
                    wait_state(c, job["name"], ENDED)
        srv.stop()


def _run(c: Any, name: str, package: str, **fields: Any) -> tuple[dict[str, Any], list[str], list[str]]:
    """Submit, follow to the end: the job, its lines, its environment's build log."""
    r = c.post("/v1/trainer/job", json={"job_name": name, "trainer_package": package, **fields})
    assert r.status_code == 201, r.text
    lines = [d["text"] for k, d in events(c, f"/v1/jobs/{name}/logs?follow=true") if k == "message"]
    job = wait_state(c, name, ENDED)
    built = [d["text"] for k, d in events(c, f"/v1/jobs/{name}/logs?node=runtime-env") if k == "message"]
    return job, lines, built


def _envs(server: Server) -> list[str]:
    root = server.home / "envs"
    return (
        sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        if root.is_dir()
        else []
    )


def test_an_edited_package_reuses_its_environment_and_a_changed_requirement_builds_another(
    server: Server,
) -> None:
    wheel = wheel_bytes(42)
    with server.client() as c:
        first = upload(c, {"train.py": TRAINER, WHEEL: wheel, "requirements.txt": f"./{WHEEL}\n"})
        job, lines, built = _run(c, "env-first", first)
        assert job["state"] == "SUCCEEDED" and "rank 0 tinyrt 42" in lines, (job, lines)
        assert any("built the runtime environment" in line for line in built), built
        assert len(_envs(server)) == 1
        # One comment more in train.py: another package, the same requirements: the same environment.
        edited = upload(c, {"train.py": TRAINER + "# tuned the learning rate\n", WHEEL: wheel,
                            "requirements.txt": f"./{WHEEL}\n"})  # fmt: skip
        assert edited != first
        job, lines, built = _run(c, "env-edited", edited)
        assert job["state"] == "SUCCEEDED" and "rank 0 tinyrt 42" in lines, (job, lines)
        assert any("using the runtime environment" in line for line in built), built
        assert not any("Successfully installed" in line for line in built), built
        assert len(_envs(server)) == 1
        # The same lines given in the submit (pip: [...]), the package without a requirements file.
        bare = upload(c, {"train.py": TRAINER, WHEEL: wheel})
        job, lines, built = _run(c, "env-pip", bare, pip=[f"./{WHEEL}"])
        assert job["state"] == "SUCCEEDED" and "rank 0 tinyrt 42" in lines, (job, lines)
        assert any("using the runtime environment" in line for line in built), built
        assert len(_envs(server)) == 1
        # The wheel the requirement names, rebuilt under the same name: another environment.
        changed = upload(c, {"train.py": TRAINER, WHEEL: wheel_bytes(43), "requirements.txt": f"./{WHEEL}\n"})
        job, lines, built = _run(c, "env-changed", changed)
        assert job["state"] == "SUCCEEDED" and "rank 0 tinyrt 43" in lines, (job, lines)
        assert any("built the runtime environment" in line for line in built), built
        assert len(_envs(server)) == 2


def test_a_lock_with_hashes_is_checked_and_bad_requirements_are_refused_before_anything_starts(
    server: Server,
) -> None:
    wheel = wheel_bytes(7)
    digest = hashlib.sha256(wheel).hexdigest()
    with server.client() as c:
        lock = f"./{WHEEL} --hash=sha256:{digest}\n"
        locked = upload(c, {"train.py": TRAINER, WHEEL: wheel, "requirements.lock": lock})
        job, lines, _ = _run(c, "env-locked", locked, requirements="requirements.lock")
        assert job["state"] == "SUCCEEDED" and "rank 0 tinyrt 7" in lines, (job, lines)
        wrong = f"./{WHEEL} --hash=sha256:{'0' * 64}\n"
        tampered = upload(c, {"train.py": TRAINER, WHEEL: wheel, "requirements.lock": wrong})
        job, _, _ = _run(c, "env-tampered", tampered, requirements="requirements.lock")
        assert job["state"] == "FAILED" and job["failure"]["node"] == "runtime-env", job
        assert "hash" in json.dumps(job["failure"]).lower(), job["failure"]
        for body, said in (
            ({"requirements": "nope.txt"}, "requirements 'nope.txt' is not a file of the package"),
            ({"requirements": "../x.txt"}, "requirements '../x.txt' is not a file of the package"),
            ({"pip": ["tinyrt"], "requirements": "requirements.lock"}, "give pip or requirements, not both"),
            ({"pip": ["a\nb"]}, "pip[0]"),
        ):
            r = c.post("/v1/trainer/job", json={"job_name": "env-bad", "trainer_package": locked, **body})
            assert r.status_code == 400 and said in r.json()["error"]["message"], (body, r.text)


def test_environments_nobody_uses_are_removed_and_a_held_one_stays(tmp_path: Path) -> None:
    from tlaunch.runtime.envgc import collect
    from tlaunch.runtime.pyenv import MARKER

    root = tmp_path / "envs"
    now = time.time()
    made = {}
    for name, age_days, size in (("old", 40, 10), ("recent", 0, 10), ("big-a", 2, 60), ("big-b", 1, 60)):
        env = root / name
        env.mkdir(parents=True)
        (env / MARKER).write_text(json.dumps({"key": name, "bytes": size}))
        os.utime(env / MARKER, (now - age_days * 86400, now - age_days * 86400))
        made[name] = env
    done = collect(str(root), MARKER, keep_bytes=100, keep_days=30, now=now)
    # 'old' is past its age; then 130 bytes are over 100: the least recently used of the rest goes.
    assert sorted(Path(p).name for p in done.removed) == ["big-a", "old"], done
    assert done.kept_bytes == 70 and sorted(p.name for p in root.iterdir() if p.is_dir()) == [
        "big-b",
        "recent",
    ]
    # A job holds big-b (its launcher's shared lock, as pyenv.hold takes it): it stays, whatever its age.
    os.utime(made["big-b"] / MARKER, (now - 90 * 86400, now - 90 * 86400))
    fd = os.open(str(made["big-b"]) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        assert collect(str(root), MARKER, keep_bytes=0, keep_days=30, now=now).removed == ()
    finally:
        os.close(fd)
    assert [
        Path(p).name for p in collect(str(root), MARKER, keep_bytes=0, keep_days=30, now=now).removed
    ] == ["big-b"]


HELPER_PROBE = """
import importlib.util, os, sys
print("helper", importlib.util.find_spec("secret_helper") is not None, flush=True)
shipped = sorted(n for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) if d and os.path.isdir(d)
                 for n in os.listdir(d) if n.endswith(".py"))
print("shipped", shipped, flush=True)
"""


@pytest.mark.ssh
def test_an_ssh_job_of_a_server_started_in_a_folder_of_py_files_ships_none_of_them(
    tmp_path: Path, ssh_hosts: Any
) -> None:
    where = tmp_path / "server-folder"  # the folder an admin started the server from
    where.mkdir()
    (where / "secret_helper.py").write_text("TOKEN = 'the server folder'\n")
    (where / "deploy_notes.py").write_text("# nothing for jobs\n")
    server = Server(tmp_path / "home", cwd=where)
    try:
        with server.client() as c:
            pkg = upload(c, {"train.py": HELPER_PROBE})
            body = {"job_name": "probe", "trainer_package": pkg, "hosts": ["th1"],
                    "ssh_config": ssh_hosts.ssh_config}  # fmt: skip
            assert c.post("/v1/trainer/job", json=body).status_code == 201
            lines = [d["text"] for k, d in events(c, "/v1/jobs/probe/logs?follow=true") if k == "message"]
            job = wait_state(c, "probe", ENDED)
        assert job["state"] == "SUCCEEDED", job
        assert "helper False" in lines, lines
        shipped = next(line for line in lines if line.startswith("shipped"))
        assert "secret_helper.py" not in shipped and "deploy_notes.py" not in shipped, shipped
        assert ssh_hosts.wait_no_leftovers(job["refs"]["run_id"], 10) == {}
    finally:
        server.stop()
