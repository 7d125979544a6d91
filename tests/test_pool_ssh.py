"""The pool's probe on real SSH test hosts with fake GPUs (a stand-in nvidia-smi on each host's PATH)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tlaunch.pool import Holdings, HostFacts, Request, free_view, parse_pool, place, waiting_reason
from tlaunch.pool.probe import Prober
from tlaunch.pool.state import PoolState

pytestmark = pytest.mark.ssh


@pytest.fixture
def prober(gpu_hosts: Any) -> Iterator[Prober]:
    p = Prober(gpu_hosts.ssh_config, timeout=3.0)
    yield p
    p.close()


def _fake_uuids(hosts: Any, name: str) -> list[str]:
    with open(os.path.join(hosts.state_dir, name, "fake-nvidia", "fake-gpus.json")) as f:
        return [g["uuid"] for g in json.load(f)]


def test_the_probe_finds_each_hosts_cpus_memory_and_gpus(gpu_hosts: Any, prober: Prober) -> None:
    names = [h.name for h in gpu_hosts.hosts]
    found = prober.probe(names)
    for name in names:
        facts = found[name]
        assert isinstance(facts, HostFacts), facts
        assert facts.cpus == tuple(sorted(os.sched_getaffinity(0)))
        assert facts.memory > 2**28
        assert [g.uuid for g in facts.gpus] == _fake_uuids(gpu_hosts, name)  # each host its own
        assert [g.index for g in facts.gpus] == [0, 1] and facts.gpus[0].name == "NVIDIA Fake A100-SXM4-80GB"


def test_a_process_the_server_did_not_start_keeps_its_gpu_from_jobs(gpu_hosts: Any, prober: Prober) -> None:
    config = parse_pool({"hosts": ["th1", "th2"], "ssh_config": gpu_hosts.ssh_config})
    state = PoolState(config)
    state.update(prober.probe(state.names))
    assert place(Request(2, 2), free_view(state.hosts(), Holdings())) is not None
    # someone's notebook on th1's GPU 1
    notebook = (
        "setsid sh -c 'exec 3</usr/local/sbin/fake-gpu1; exec sleep 300' </dev/null >/dev/null 2>&1 & echo $!"
    )
    pid = prober.run("th1", notebook)
    try:
        assert state.update(prober.probe(state.names)) == ["th1"]
        th1 = state.host("th1")
        assert th1 is not None and [(p.pid, p.name) for p in th1.gpu_processes] == [
            (int(pid), "/usr/bin/sleep")
        ]
        free = free_view(state.hosts(), Holdings())
        assert free["th1"].gpus == [0] and free["th2"].gpus == [0, 1]
        assert place(Request(2, 2), free) is None  # a whole job, or nothing
        assert place(Request(1, 2), free).hosts == ("th2",)  # type: ignore[union-attr]
    finally:
        prober.run("th1", f"kill {int(pid)}")
    deadline = time.monotonic() + 10
    while state.update(prober.probe(["th1"])) != ["th1"]:
        assert time.monotonic() < deadline, "the process's end was never seen"
        time.sleep(0.2)
    assert free_view(state.hosts(), Holdings())["th1"].gpus == [0, 1]


def test_a_host_that_does_not_answer_is_down_with_the_reason_and_comes_back(
    gpu_hosts: Any, prober: Prober
) -> None:
    state = PoolState(parse_pool({"hosts": ["th3", "th4"]}))
    assert [h.reason for h in state.hosts()] == ["not probed yet", "not probed yet"]
    state.update(prober.probe(state.names))
    assert all(h.up for h in state.hosts())
    gpu_hosts.set_link("th4", False)
    try:
        started = time.monotonic()
        assert state.update(prober.probe(state.names)) == ["th4"]
        assert time.monotonic() - started < 10
        th4 = state.host("th4")
        assert th4 is not None and not th4.up and th4.known  # it keeps what it had: jobs wait for it
        assert th4.reason in (
            "running the probe failed: Timeout opening channel.",
            "the probe did not finish within 3.0 s",
        )
        said = waiting_reason(Request(2, 1), free_view(state.hosts(), Holdings()))
        assert (
            said.startswith("waiting for 2 hosts with 1 GPU, 1 CPU each (1 host up): ")
            and "th4 down (" in said
        )
    finally:
        gpu_hosts.set_link("th4", True)
    deadline = time.monotonic() + 20
    while not all(h.up for h in state.hosts()):
        assert time.monotonic() < deadline, [h.reason for h in state.hosts()]
        state.update(prober.probe(state.names))
    assert state.last_answer("th4") is not None


def _what_i_got() -> tuple[str | None, str | None, list[int], int]:
    from tlaunch.testing.gpus import open_visible_gpus

    held = open_visible_gpus()  # the fake devices of CUDA_VISIBLE_DEVICES (refused if not this host's)
    for f in held:
        f.close()
    order = os.environ.get("CUDA_DEVICE_ORDER")
    return os.environ.get("CUDA_VISIBLE_DEVICES"), order, sorted(os.sched_getaffinity(0)), len(held)


def test_each_host_of_a_placed_job_gets_its_own_gpus_and_cpu_set(gpu_hosts: Any) -> None:
    """The server's slots reach every trainer through its supervisor, on every method (here: a function)."""
    import tlaunch.torch
    from tlaunch.runtime.slots import SLOTS

    th1, th2 = (_fake_uuids(gpu_hosts, n) for n in ("th1", "th2"))
    cpus = sorted(os.sched_getaffinity(0))
    slots = {
        "th1": {"gpus": th1[1], "cpus": str(cpus[-1])},
        "th2": {"gpus": f"{th2[0]},{th2[1]}", "cpus": "0"},
    }
    result = tlaunch.torch.launch(
        _what_i_got,
        hostnames=["th1", "th2"],
        workers_per_host="gpu",  # as many workers as the slot's GPUs
        ssh_config_file=gpu_hosts.ssh_config,
        backend=None,
        env={SLOTS: json.dumps(slots)},
    )
    assert result.results == {
        "th1": [(th1[1], "PCI_BUS_ID", [cpus[-1]], 1)],
        "th2": [(f"{th2[0]},{th2[1]}", "PCI_BUS_ID", [0], 2)] * 2,
    }


def test_what_is_left_of_a_run_on_a_host_is_found_by_its_marker(gpu_hosts: Any, prober: Prober) -> None:
    """A run's process is found whatever its command line (a trainer's own child), on its host only."""
    run = "pool-check-1a2b"
    start = f"TLAUNCH_RUN_ID={run} setsid sh -c 'exec sleep 300' </dev/null >/dev/null 2>&1 & echo $!"
    pid = int(prober.run("th2", start))
    try:
        deadline = time.monotonic() + 5
        while not (left := prober.left_of("th2", run)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert left == [f"{pid} sleep 300"]
        assert prober.left_of("th1", run) == []  # another host's namespace: not th1's
        assert prober.left_of("th2", run + "0") == []
    finally:
        prober.run("th2", f"kill {pid}")
    deadline = time.monotonic() + 5
    while prober.left_of("th2", run):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_the_service_holds_until_a_jobs_last_process_on_each_host_is_gone(
    gpu_hosts: Any, tmp_path: Any
) -> None:
    """Jobs queued, placed, started (a process per host holding its slot's fake GPUs), ended early:
    each host's GPUs are released only once the job's process there is gone, and never given twice."""
    from tlaunch.pool import Waiting
    from tlaunch.pool.journal import overlaps, read_journal
    from tlaunch.pool.service import PoolService

    started: dict[str, tuple[float, Any]] = {}
    config = parse_pool({"hosts": ["th1", "th2"], "ssh_config": gpu_hosts.ssh_config, "probe_every": 2})
    helper = Prober(gpu_hosts.ssh_config)

    def start(job: str, placement: Any) -> None:
        slots = json.loads(service.slots_of(placement))
        for host, slot in slots.items():
            index = {u: i for i, u in enumerate(_fake_uuids(gpu_hosts, host))}
            opens = " ".join(
                f"{3 + k}</usr/local/sbin/fake-gpu{index[u]}" for k, u in enumerate(slot["gpus"].split(","))
            )
            gpu_job = f"setsid sh -c 'exec {opens}; exec sleep 1.5' </dev/null >/dev/null 2>&1 &"
            helper.run(host, f"TLAUNCH_RUN_ID=run-{job} {gpu_job}")
        started[job] = (time.time(), placement)
        service.ended(job, f"run-{job}")  # its run says it ended; its processes have 1.5 s to go

    service = PoolService(config, start, str(tmp_path / "placements.log"), grace=10.0, check_every=0.1)
    service.open()
    try:
        jobs = [
            ("a1", "alice", 2, 1),
            ("a2", "alice", 1, 1),
            ("b1", "bob", 1, 2),
            ("b2", "bob", 2, 1),
            ("a3", "alice", 1, 1),
        ]
        for seq, (name, user, gpus, trainers) in enumerate(jobs):
            service.enqueue(Waiting(name, user, Request(trainers, gpus), float(seq)))
        deadline = time.monotonic() + 60
        while len(started) < len(jobs) or len(service.holdings):
            assert time.monotonic() < deadline, (sorted(started), service.view()["queue"])
            time.sleep(0.1)
    finally:
        service.close()
        helper.close()
    events = read_journal(str(tmp_path / "placements.log"))
    assert overlaps(events) == []
    for name, (t0, placement) in started.items():
        releases = [e for e in events if e["job"] == name and e["event"] == "release"]
        assert sorted(e["host"] for e in releases) == sorted(placement.hosts)  # every host, once
        assert all(e["t"] >= t0 + 1.4 and e["why"] == "ended" for e in releases), (
            releases
        )  # not before its process
    assert all(not h["jobs"] for h in service.view()["hosts"])


def test_a_job_on_a_host_that_went_down_is_freed_at_once(gpu_hosts: Any, tmp_path: Any) -> None:
    """Its processes there cannot be checked; the host's GPUs come back when a probe sees them free."""
    from tlaunch.pool import Placement, Slot
    from tlaunch.pool.journal import read_journal
    from tlaunch.pool.service import PoolService

    config = parse_pool({"hosts": ["th3"], "ssh_config": gpu_hosts.ssh_config, "probe_every": 3600})
    service = PoolService(
        config, lambda job, placement: None, str(tmp_path / "log"), Prober(gpu_hosts.ssh_config, timeout=2.0)
    )
    try:
        service.probe()
        service.recover("gone", "alice", Placement((Slot("th3", (0, 1), (0,)),)), time.time())
        gpu_hosts.set_link("th3", False)
        try:
            assert service.probe() == ["th3"]
            started = time.monotonic()
            service.ended("gone", "run-of-gone")
            while "gone" in service.holdings:
                assert time.monotonic() - started < 5
                time.sleep(0.05)
        finally:
            gpu_hosts.set_link("th3", True)
    finally:
        service.close()
    [release] = [e for e in read_journal(str(tmp_path / "log")) if e["event"] == "release"]
    assert release["why"] == "ended; its host is down" and release["gpus"] == [0, 1]
