"""The job server with a pool of SSH hosts: 4 test hosts with 2 fake GPUs each, jobs from two users.

The server runs as users run it (``python -m tlaunch.server --pool pool.yaml``); its
jobs' trainers hold their fake GPUs open (as CUDA holds ``/dev/nvidiaN``) and say
their host, ``CUDA_VISIBLE_DEVICES``, CPU set and times in their logs.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.server_helpers import ALICE, BOB, ROOT, Server, error_of, events, upload, wait_state
from tlaunch.pool.journal import overlaps, read_journal

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

FLAKY = """
import os, sys, time
from tlaunch.testing.gpus import open_visible_gpus

held = open_visible_gpus()
mark = "/tmp/flaky-" + sys.argv[1]  # this host's own /tmp
failing = sys.argv[2] == "always" or not os.path.exists(mark)
if failing:
    open(mark, "w").close()
print("visible", os.environ["CUDA_VISIBLE_DEVICES"], "failing" if failing else "passing", flush=True)
if failing:
    time.sleep(float(sys.argv[3]))
    raise SystemExit("failing on purpose")
time.sleep(0.5)
"""

TRAINER = """
import json, os, socket, sys, time
from tlaunch.testing.gpus import open_visible_gpus

start = time.time()
held = open_visible_gpus()  # this trainer uses its GPUs now (the fake nvidia-smi sees it)
info = {"host": socket.gethostname(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cpus": sorted(os.sched_getaffinity(0)), "rank": int(os.environ["RANK"]), "start": start}
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
info["end"] = time.time()
print("POOLCHECK " + json.dumps(info), flush=True)
"""


@pytest.fixture(scope="module")
def pooled(gpu_hosts: Any, tmp_path_factory: Any) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("pool")
    config = folder / "pool.yaml"
    config.write_text(
        f"ssh_config: {gpu_hosts.ssh_config}\nprobe_every: 2\n"
        "pools:\n  lab:\n    hosts: [th1, th2, th3, {name: th4, labels: [solo]}]\n"
    )
    server = Server(folder / "home", extra=["--pool", str(config)])
    yield server
    server.stop()


def _submit(c: Any, package: str, name: str, gpus: int, trainers: int, seconds: float = 1.0) -> Any:
    body = {"job_name": name, "trainer_package": package, "entry_point": "train.py", "args": [str(seconds)],
            "num_trainer": trainers, "use_gpu": True, "gpu_num": gpus}  # fmt: skip
    return c.post("/v1/trainer/job", json=body)


def _trainers(c: Any, name: str) -> list[dict[str, Any]]:
    """What each trainer of job ``name`` said of itself."""
    lines = [d["text"] for e, d in events(c, f"/v1/jobs/{name}/logs") if e == "message"]
    return [json.loads(t.split("POOLCHECK ", 1)[1]) for t in lines if "POOLCHECK " in t]


def _all_free(c: Any, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        pool = c.get("/v1/pool").json()
        busy = [(h["name"], h["jobs"]) for h in pool["hosts"] if h["jobs"] or h["cpus_used"]]
        if not busy and not pool["queue"]:
            return dict(pool)
        assert time.monotonic() < deadline, busy
        time.sleep(0.2)


def test_the_pool_is_probed_and_shown(pooled: Server, gpu_hosts: Any) -> None:
    with pooled.client(ALICE) as c:
        pool = _all_free(c)
    assert pool["pools"] == ["lab"]
    assert [(h["name"], h["up"], len(h["gpus"])) for h in pool["hosts"]] == [
        (f"th{i}", True, 2) for i in range(1, 5)
    ]
    assert all(
        g["name"] == "NVIDIA Fake A100-SXM4-80GB" and g["uuid"].startswith("GPU-")
        for g in pool["hosts"][0]["gpus"]
    )


def test_a_job_asking_more_than_the_pool_has_is_a_400_naming_both(pooled: Server) -> None:
    with pooled.client(ALICE) as c:
        package = upload(c, {"train.py": TRAINER})
        said = error_of(_submit(c, package, "too-big", gpus=4, trainers=1), 400)["message"]
        assert "the job asks for 4 GPUs, 1 CPU" in said
        assert "no host of the pool has that much (the most on one host: 2 GPUs" in said
        assert "th1 (2 GPUs, " in said
        said = error_of(_submit(c, package, "too-many", gpus=1, trainers=5), 400)["message"]
        assert "the job asks for 5 hosts with 1 GPU, 1 CPU each" in said and "only 4 hosts" in said
        assert c.get("/v1/jobs/too-big").status_code == 404  # the name was never taken


def test_twelve_jobs_of_two_users_share_the_pool_fairly_and_never_a_gpu_twice(pooled: Server) -> None:
    sizes = [(1, 1), (2, 1), (2, 2), (1, 1), (2, 1), (2, 2)]  # (GPUs a trainer, trainers): 1, 2 and 4 GPUs
    names: list[tuple[str, str, int, int]] = []
    with pooled.client(ALICE) as alice, pooled.client(BOB) as bob:
        package, bob_package = (
            upload(who, {"train.py": TRAINER}) for who in (alice, bob)
        )  # packages are per user
        for i, (gpus, trainers) in enumerate(sizes):  # alice submits all hers first
            r = _submit(alice, package, f"a{i}", gpus, trainers, seconds=2.0)
            assert r.status_code == 201, r.text
            names.append(("alice", f"a{i}", gpus, trainers))
        for i, (gpus, trainers) in enumerate(sizes):
            r = _submit(bob, bob_package, f"b{i}", gpus, trainers, seconds=2.0)
            assert r.status_code == 201, r.text
            names.append(("bob", f"b{i}", gpus, trainers))
        waiting = [j for j in alice.get("/v1/jobs").json()["jobs"] if j.get("queue")]
        assert waiting, "every job started at once: nothing waited"
        assert all(
            j["state"] == "PENDING" and j["queue"]["reason"].startswith("waiting for ") for j in waiting
        )
        trainers_of: dict[str, list[dict[str, Any]]] = {}
        for user, name, gpus, trainers in names:
            c = alice if user == "alice" else bob
            job = wait_state(c, name, ("SUCCEEDED", "FAILED", "LOST", "STOPPED"), timeout=300)
            assert job["state"] == "SUCCEEDED", job
            assert len(job["placement"]) == trainers and all(len(s["gpus"]) == gpus for s in job["placement"])
            said = trainers_of[name] = _trainers(c, name)
            assert sorted(t["rank"] for t in said) == list(range(trainers))  # every trainer ran
            by_host = {s["host"]: s for s in job["placement"]}
            for t in said:  # each trainer on its placement, seeing its own GPUs and CPUs only
                assert t["host"] in by_host and len(t["visible"].split(",")) == gpus
                assert t["cpus"] == by_host[t["host"]]["cpus"]
        pool = _all_free(alice)
    journal = read_journal(str(pooled.home / "server" / "placements.log"))
    ours = [e for e in journal if e["job"] in {f"{u}/{n}" for u, n, _, _ in names}]  # owner/name
    assert overlaps(ours) == []  # the server's own log: never a GPU held by two jobs
    for user, name, gpus, trainers in names:  # held whole, at once; released host by host, every one
        key = f"{user}/{name}"
        holds = [e for e in ours if e["job"] == key and e["event"] == "hold"]
        assert len(holds) == trainers and len({e["t"] for e in holds}) == 1, holds
        assert sorted(e["host"] for e in ours if e["job"] == key and e["event"] == "release") == sorted(
            e["host"] for e in holds
        )
    uses = sorted(  # what the trainers saw: no GPU used by two jobs at one time
        (uuid, t["start"], t["end"], name) for name, said in trainers_of.items() for t in said
        for uuid in t["visible"].split(",")
    )  # fmt: skip
    for (u1, _, end1, n1), (u2, start2, _, n2) in itertools.pairwise(uses):
        assert u1 != u2 or end1 <= start2, f"GPU {u1} used by {n1} and {n2} at once"
    # Fair share: alice submitted all six first; bob got GPUs while she still had jobs queued.
    first_holds = {e["job"]: e["t"] for e in ours if e["event"] == "hold"}
    last_alice = max(t for n, t in first_holds.items() if n.startswith("alice/"))
    first_bob = min(t for n, t in first_holds.items() if n.startswith("bob/"))
    assert first_bob < last_alice, "bob waited for all of alice's jobs"
    assert all(not g["job"] for h in pool["hosts"] for g in h["gpus"])


def test_a_server_killed_while_jobs_run_and_wait_keeps_their_gpus_and_their_order(pooled: Server) -> None:
    with pooled.client(ROOT) as c:
        package = upload(c, {"train.py": TRAINER})
        for i in range(4):  # the whole pool, for a while
            assert _submit(c, package, f"long{i}", gpus=2, trainers=1, seconds=12).status_code == 201
        for i in range(4):
            assert _submit(c, package, f"next{i}", gpus=1, trainers=1, seconds=0.5).status_code == 201
        deadline = time.monotonic() + 120
        while not all(
            wait_state(c, f"long{i}", ("RUNNING",), timeout=120)["refs"]["run_id"] for i in range(4)
        ):
            assert time.monotonic() < deadline
        before = c.get("/v1/pool").json()
        held = {(h["name"], g["index"]): g["job"] for h in before["hosts"] for g in h["gpus"]}
        order = [q["job"] for q in sorted(before["queue"], key=lambda q: q["position"])]
        assert sorted(set(held.values())) == [f"root/long{i}" for i in range(4)]  # owner/name
        assert order == [f"root/next{i}" for i in range(4)]
        pooled.kill()  # SIGKILL: no goodbye
        pooled.start()
        after = c.get("/v1/pool").json()
        assert {(h["name"], g["index"]): g["job"] for h in after["hosts"] for g in h["gpus"]} == held
        assert [q["job"] for q in sorted(after["queue"], key=lambda q: q["position"])] == order
        for name in [f"long{i}" for i in range(4)] + [f"next{i}" for i in range(4)]:
            assert wait_state(c, name, ("SUCCEEDED", "FAILED", "LOST"), timeout=300)["state"] == "SUCCEEDED"
        _all_free(c)
    journal = read_journal(str(pooled.home / "server" / "placements.log"))
    ours = [e for e in journal if e["job"].startswith(("root/long", "root/next"))]
    assert overlaps(ours) == []
    for name in {e["job"] for e in ours}:  # placed once: one hold per trainer, released once
        assert len([e for e in ours if e["job"] == name and e["event"] == "hold"]) == 1, name
        assert len([e for e in ours if e["job"] == name and e["event"] == "release"]) == 1, name


def test_a_gpu_someone_else_uses_is_not_handed_out_and_the_reason_says_who(
    pooled: Server, gpu_hosts: Any
) -> None:
    from tlaunch.pool.probe import Prober

    notebook = (
        "setsid sh -c 'exec 3</usr/local/sbin/fake-gpu0; exec sleep 300' </dev/null >/dev/null 2>&1 & echo $!"
    )
    with contextlib.closing(Prober(gpu_hosts.ssh_config)) as hosts, pooled.client(ROOT) as c:
        pid = int(hosts.run("th1", notebook))
        try:
            pool = c.post("/v1/pool/probe").json()
            th1 = next(h for h in pool["hosts"] if h["name"] == "th1")
            assert th1["gpus"][0]["job"] is None and th1["gpus"][0]["others"] == [
                {"pid": pid, "name": "/usr/bin/sleep"}
            ]
            package = upload(c, {"train.py": TRAINER})
            assert _submit(c, package, "everything", gpus=2, trainers=4, seconds=0.5).status_code == 201
            time.sleep(1.0)
            job = c.get("/v1/jobs/everything").json()
            assert job["state"] == "PENDING" and job["queue"]["position"] == 1
            assert job["queue"]["reason"] == (
                "waiting for 4 hosts with 2 GPUs each: 2 free on th2, 2 on th3, 2 on th4, "
                f"1 on th1 (GPU 0 used by pid {pid} /usr/bin/sleep, not a job of this server)"
            )
        finally:
            hosts.run("th1", f"kill {pid}")
        c.post("/v1/pool/probe")
        assert wait_state(c, "everything", ("SUCCEEDED", "FAILED"), timeout=120)["state"] == "SUCCEEDED"
        _all_free(c)


def test_the_dashboard_shows_each_host_its_gpus_and_who_holds_them(pooled: Server, tmp_path: Any) -> None:
    import os
    import shutil

    playwright = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(chromium):
        pytest.skip("no chromium (apt-get install chromium)")
    with pooled.client(ROOT) as c:
        package = upload(c, {"train.py": TRAINER})
        for i in range(4):
            assert _submit(c, package, f"fill{i}", gpus=2, trainers=1, seconds=6).status_code == 201
        assert _submit(c, package, "later", gpus=1, trainers=1, seconds=0.5).status_code == 201
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.goto(f"{pooled.url}/dashboard/")
                page.fill("#token", ROOT)
                page.click("#login button")
                page.wait_for_selector("#pool tr[data-host='th4'] span.gpu.held", timeout=30_000)
                assert page.locator("#pool tr").count() == 4 + 1  # a row per host, and the header
                held = page.locator("#pool span.gpu.held").all_inner_texts()
                assert sorted(t.split(": ")[1] for t in held) == sorted(
                    f"root/fill{i}" for i in range(4) for _ in (0, 1)
                )
                waiting = page.locator("#jobs tr[data-job='later']")
                assert "\tPENDING #1\t" in waiting.inner_text()  # its state, with its place in the queue
                assert waiting.get_attribute("title", timeout=5_000).startswith("waiting for 1 GPU")  # type: ignore[union-attr]
                page.wait_for_selector("#pool tr[data-host='th1'] span.gpu.free", timeout=60_000)
                page.screenshot(path=str(tmp_path / "pool.png"), full_page=True)
            finally:
                browser.close()
        for name in [f"fill{i}" for i in range(4)] + ["later"]:
            assert wait_state(c, name, ("SUCCEEDED", "FAILED"), timeout=120)["state"] == "SUCCEEDED"
        _all_free(c)


def _flaky(
    c: Any, package: str, name: str, how: str, restarts: int, seconds: float = 0.5, **more: Any
) -> Any:
    body = {"job_name": name, "trainer_package": package, "entry_point": "flaky.py",
            "args": [name, how, str(seconds)], "use_gpu": True, "gpu_num": 1,
            "restart_policy": "OnFailure", "backoff_limit": restarts, **more}  # fmt: skip
    return c.post("/v1/trainer/job", json=body)


def test_a_job_that_fails_runs_again_on_its_own_gpus_as_many_times_as_it_may(pooled: Server) -> None:
    with pooled.client(BOB) as c:
        package = upload(c, {"flaky.py": FLAKY})
        assert _flaky(c, package, "flaky-once", "once", restarts=2).status_code == 201
        assert _flaky(c, package, "flaky-always", "always", restarts=1).status_code == 201
        once = wait_state(c, "flaky-once", ("SUCCEEDED", "FAILED"), timeout=180)
        assert once["state"] == "SUCCEEDED", once
        assert once["restarts"]["count"] == 1 and once["restarts"]["runs"][0]["state"] == "FAILED"
        always = wait_state(c, "flaky-always", ("SUCCEEDED", "FAILED"), timeout=180)
        assert always["state"] == "FAILED" and always["restarts"]["count"] == 1, always
        assert "failing on purpose" in str(always["failure"]), always
        _all_free(c)
        journal = read_journal(str(pooled.home / "server" / "placements.log"))
        for name in ("flaky-once", "flaky-always"):  # held once, through its restarts: it kept its GPU
            assert [e["event"] for e in journal if e["job"] == f"bob/{name}"] == ["hold", "release"], name
        # Restarted by hand (POST .../restart), a job of the pool is placed again, never started beside it.
        again = c.post("/v1/jobs/flaky-always/restart")
        assert again.status_code == 201 and again.json()["state"] == "PENDING", again.text
        assert wait_state(c, "flaky-always", ("FAILED", "SUCCEEDED"), timeout=180)["state"] == "FAILED"
        _all_free(c)
    journal = read_journal(str(pooled.home / "server" / "placements.log"))
    events = [e["event"] for e in journal if e["job"] == "bob/flaky-always"]
    assert events == ["hold", "release", "hold", "release"], events


def test_every_end_frees_what_a_job_held_and_a_stopped_waiting_job_never_holds(pooled: Server) -> None:
    with pooled.client(ALICE) as c:
        package = upload(c, {"train.py": TRAINER, "flaky.py": FLAKY})
        assert (
            _flaky(
                c, package, "end-fails", "always", restarts=0, seconds=1, restart_policy="Never"
            ).status_code
            == 201
        )
        for name in ("end-stopped", "end-deleted"):
            assert _submit(c, package, name, gpus=2, trainers=1, seconds=60).status_code == 201
        assert _submit(c, package, "end-fills", gpus=1, trainers=2, seconds=8).status_code == 201
        assert _submit(c, package, "end-waits", gpus=2, trainers=4, seconds=1).status_code == 201
        for name in ("end-stopped", "end-deleted"):
            wait_state(c, name, ("RUNNING",), timeout=120)
        assert c.get("/v1/jobs/end-waits").json()["queue"]["position"] == 1
        assert c.post("/v1/jobs/end-waits/stop").json()["state"] == "STOPPED"  # out of the queue
        assert c.post("/v1/jobs/end-stopped/stop").status_code == 202
        assert c.delete("/v1/jobs/end-deleted", params={"force": "true"}).status_code == 200
        assert wait_state(c, "end-fails", ("FAILED", "SUCCEEDED"), timeout=120)["state"] == "FAILED"
        assert wait_state(c, "end-stopped", ("STOPPED",), timeout=120)["state"] == "STOPPED"
        assert wait_state(c, "end-fills", ("SUCCEEDED",), timeout=120)["state"] == "SUCCEEDED"
        _all_free(c)
        assert c.get("/v1/jobs/end-waits").json()["state"] == "STOPPED"
    journal = read_journal(str(pooled.home / "server" / "placements.log"))
    assert not [e for e in journal if e["job"] == "alice/end-waits"]  # never placed
    for name in ("end-fails", "end-stopped", "end-deleted", "end-fills"):
        key = f"alice/{name}"
        holds = [e["host"] for e in journal if e["job"] == key and e["event"] == "hold"]
        released = [e["host"] for e in journal if e["job"] == key and e["event"] == "release"]
        assert holds and sorted(holds) == sorted(released), (name, holds, released)


def test_a_job_whose_host_went_down_waits_for_it_in_its_place_and_runs_again(
    pooled: Server, gpu_hosts: Any
) -> None:
    with pooled.client(BOB) as c:
        package = upload(c, {"flaky.py": FLAKY})
        # Its first run holds th4 (the only host labelled solo) for a long time; th4 then goes.
        r = _flaky(c, package, "lonely", "once", restarts=1, seconds=120, gpu_label="solo")
        assert r.status_code == 201, r.text
        job = wait_state(c, "lonely", ("RUNNING",), timeout=120)
        assert [s["host"] for s in job["placement"]] == ["th4"]
        # Its trainer has marked th4 (its next run there passes) before th4 goes: RUNNING is its node's
        # state, which comes before the trainer's first line. A trainer that had not marked th4 when
        # its head ended the run (15 s after its launcher was cut off) left the next run to fail on
        # purpose, 120 s later.
        deadline = time.monotonic() + 120
        while not any("failing" in d["text"] for e, d in events(c, "/v1/jobs/lonely/logs") if e == "message"):
            assert time.monotonic() < deadline, "its trainer never marked th4"
            time.sleep(0.2)
        gpu_hosts.set_link("th4", False)
        try:
            deadline = time.monotonic() + 120
            while "th4 down" not in ((job := c.get("/v1/jobs/lonely").json()).get("queue") or {}).get(
                "reason", ""
            ):
                assert job["state"] not in ("SUCCEEDED", "FAILED", "LOST", "STOPPED"), job
                assert time.monotonic() < deadline, job
                time.sleep(0.5)
            assert job["state"] == "PENDING" and job["placement"] is None and job["restarts"]["count"] == 1
        finally:
            gpu_hosts.set_link("th4", True)
        job = wait_state(c, "lonely", ("SUCCEEDED", "FAILED"), timeout=180)
        assert job["state"] == "SUCCEEDED" and [s["host"] for s in job["placement"]] == ["th4"], job
        _all_free(c)
    first = job["restarts"]["runs"][0]["run_id"]
    assert gpu_hosts.wait_no_leftovers(first, timeout=30) == {}  # nothing of its first run stayed


def test_the_cli_shows_the_pool_and_the_queue_and_an_admin_moves_a_job_up(pooled: Server) -> None:
    import os
    import subprocess
    import sys

    def cli(token: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "TLAUNCH_SERVER": pooled.url, "TLAUNCH_TOKEN": token}
        argv = [sys.executable, "-m", "tlaunch.cli.main", "job", *args]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90)

    with pooled.client(ALICE) as c:
        package = upload(c, {"train.py": TRAINER})
        assert _submit(c, package, "cli-fill", gpus=2, trainers=4, seconds=8).status_code == 201
        wait_state(c, "cli-fill", ("RUNNING",), timeout=120)
        for name in ("cli-first", "cli-second"):
            assert _submit(c, package, name, gpus=1, trainers=1, seconds=0.5).status_code == 201
        body = {"job_name": "cli-mine", "trainer_package": package, "priority": 5}
        said = error_of(c.post("/v1/trainer/job", json=body), 403)["message"]
        assert "only an admin sets a job's priority" in said
        shown = cli(ALICE, "pool")
        assert shown.returncode == 0, shown.stderr
        for host in ("th1", "th2", "th3", "th4"):
            assert host in shown.stdout
        assert shown.stdout.count("cli-fill") >= 8 and "cli-second" in shown.stdout, shown.stdout
        listed = cli(ALICE, "ls")
        assert "#2 waiting for 1 GPU" in listed.stdout, listed.stdout
        refused = cli(ALICE, "priority", "cli-second", "5")
        assert refused.returncode == 1 and "403" in refused.stderr, refused
        moved = cli(ROOT, "priority", "cli-second", "5")
        assert moved.returncode == 0 and "job cli-second: priority 5, #1 waiting for 1 GPU" in moved.stdout, (
            moved
        )
        assert c.get("/v1/jobs/cli-first").json()["queue"]["position"] == 2
        for name in ("cli-fill", "cli-first", "cli-second"):
            assert wait_state(c, name, ("SUCCEEDED", "FAILED"), timeout=120)["state"] == "SUCCEEDED"
        _all_free(c)
