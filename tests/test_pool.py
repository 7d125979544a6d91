"""The pool's pure core: resources, pool.yaml, placement, holdings, the fair queue, the reasons."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from tlaunch.pool import (
    Gpu,
    GpuProcess,
    HoldingConflict,
    Holdings,
    Host,
    HostFacts,
    Limits,
    Placement,
    PoolConfigError,
    Request,
    Slot,
    Waiting,
    free_view,
    never_fits,
    parse_pool,
    place,
    schedule,
    waiting_reason,
)
from tlaunch.pool.placement import pick
from tlaunch.pool.resources import format_cpus, format_memory, parse_cpu_list, parse_memory

GiB = 2**30


def host(name: str, gpus: int = 2, cpus: int = 8, memory: int = 64 * GiB, **kw: object) -> Host:
    devices = tuple(Gpu(i, f"GPU-{name}-{i}", "NVIDIA A100-SXM4-80GB", 81920) for i in range(gpus))
    return Host(name, tuple(range(cpus)), memory, devices, **kw)  # type: ignore[arg-type]


def job(name: str, user: str, seq: float, gpus: int = 1, trainers: int = 1, **kw: object) -> Waiting:
    priority = int(kw.pop("priority", 0))  # type: ignore[call-overload]
    return Waiting(name, user, Request(trainers, gpus, **kw), seq, priority)  # type: ignore[arg-type]


# -- resources ----------------------------------------------------------------------------


def test_quantities_and_cpu_lists() -> None:
    assert parse_memory("16Gi") == 16 * GiB
    assert parse_memory("1.5G") == 1_500_000_000
    assert parse_memory(1024) == 1024
    assert format_memory(int(7.6 * GiB)) == "7.6Gi"
    assert format_memory(512 * 2**20) == "512Mi"
    for bad in ("16GB", "x", "", -1, True, "1.5.2Gi"):
        with pytest.raises(ValueError, match=r"memory quantity|negative"):
            parse_memory(bad)
    assert parse_cpu_list("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpus((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
    with pytest.raises(ValueError, match="not a CPU list"):
        parse_cpu_list("0-a")


def test_a_request_is_checked() -> None:
    with pytest.raises(ValueError, match="trainers=0 must be a whole number >= 1"):
        Request(trainers=0)
    with pytest.raises(ValueError, match="gpus=-1"):
        Request(gpus=-1)
    assert Request(1, 4).describe() == "4 GPUs, 1 CPU"
    assert (
        Request(2, 2, 4, 16 * GiB, "a100").describe() == "2 hosts with 2 a100 GPUs, 4 CPUs, 16Gi memory each"
    )


def test_labels_match_host_labels_and_gpu_model_words() -> None:
    h = host("g1", labels=frozenset({"nvlink"}))
    assert h.has_label("a100") and h.has_label("NVLink") and h.has_label(None)
    assert not h.has_label("a10")  # a word, not a substring of a100
    assert h.visible_devices([1, 0]) == "GPU-g1-1,GPU-g1-0"
    assert Host("x", (0,), 0, (Gpu(0), Gpu(1))).visible_devices([1]) == "1"


# -- pool.yaml -----------------------------------------------------------------------------


def test_pool_yaml_forms() -> None:
    config = parse_pool(
        {
            "ssh_config": "/etc/ssh_config",
            "probe_every": 5,
            "limits": {"gpus": 4, "users": {"alice": 8, "ci": None}},
            "pools": {
                "lab": {
                    "hosts": [
                        "gpu1",
                        {"name": "gpu2", "gpus": 8, "cpus": 64, "memory": "512Gi", "labels": ["a100"]},
                    ]
                },
                "cpu": {"hosts": ["cpu1"]},
            },
        }
    )
    assert [(h.name, h.pool) for h in config.hosts] == [("gpu1", "lab"), ("gpu2", "lab"), ("cpu1", "cpu")]
    assert config.pools == ("lab", "cpu")
    assert config.hosts[1].declared and config.hosts[1].memory == 512 * GiB
    assert config.limits.gpus_of("alice") == 8 and config.limits.gpus_of("bob") == 4
    assert config.limits.gpus_of("ci") is None
    assert config.probe_every == 5.0
    assert parse_pool({"hosts": ["a", "b"]}).pools == ("default",)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ([], "the file must be a mapping"),
        ({"hosts": ["a"], "pools": {}}, "give either `hosts:`"),
        ({}, "give either `hosts:`"),
        ({"hosts": []}, "hosts: give a list of hosts"),
        ({"hostz": ["a"]}, "unknown key 'hostz'; valid keys are"),
        (
            {"hosts": [{"name": "a", "gpu": 2}]},
            r"hosts\[0\]: unknown key 'gpu'; valid keys are \['name', 'gpus'",
        ),
        (
            {"hosts": [{"name": "a", "memory": "512GB"}]},
            r"hosts\[0\].memory: '512GB' is not a memory quantity",
        ),
        ({"hosts": [{"name": "a", "gpus": -1}]}, r"hosts\[0\].gpus: -1 must be a whole number >= 0"),
        ({"hosts": [{"name": "a", "cpus": "8"}]}, r"hosts\[0\].cpus: '8' must be a whole number"),
        ({"hosts": ["a b"]}, r"hosts\[0\].name: invalid host 'a b'"),
        ({"hosts": ["localhost"]}, "is this machine"),
        ({"hosts": [{"name": "a", "labels": [1]}]}, "labels: \\[1\\] must be a list of words"),
        (
            {"pools": {"x": {"hosts": ["a"]}, "y": {"hosts": ["a"]}}},
            "host 'a' is given twice \\(in pools 'x' and 'y'\\)",
        ),
        ({"hosts": ["a"], "probe_every": 0}, "probe_every: 0 must be seconds from 1 to 3600"),
        ({"hosts": ["a"], "limits": {"gpus": -2}}, "limits.gpus: -2 must be a number of GPUs"),
        ({"hosts": ["a"], "limits": {"users": {"al": "x"}}}, "limits.users.al: 'x'"),
    ],
)
def test_pool_yaml_mistakes_are_named(data: object, said: str) -> None:
    with pytest.raises(PoolConfigError, match=said):
        parse_pool(data, where="pool.yaml")


def test_declared_resources_win_over_the_probe() -> None:
    decl = parse_pool({"hosts": [{"name": "g", "gpus": 1, "cpus": 2}]}).hosts[0]
    facts = HostFacts((4, 5, 6, 7), 8 * GiB, (Gpu(0, "GPU-a"), Gpu(1, "GPU-b")))
    h = decl.host(facts, up=True)
    assert h.cpus == (4, 5) and h.memory == 8 * GiB and h.gpus == (Gpu(0, "GPU-a"),)
    never = decl.host(None, up=False, reason="connection refused")
    assert not never.known and not never.up and never.reason == "connection refused"
    whole = parse_pool({"hosts": [{"name": "g", "gpus": 2, "cpus": 4, "memory": "1Gi"}]}).hosts[0]
    assert whole.host(None, up=False, reason="timed out").known  # declared: counts for "ever fits"


# -- placement -----------------------------------------------------------------------------


def test_pick_takes_the_smallest_contiguous_run() -> None:
    assert pick([0, 1, 2, 3], 2) == (0, 1)
    assert pick([0, 2, 3, 5, 6, 7], 2) == (2, 3)  # the 2-run, not the 3-run: the 3-run stays whole
    assert pick([0, 2, 4, 6], 2) == (0, 2)  # no run: the lowest
    assert pick([0, 1, 2, 3, 4, 5], 2, prefer=[3, 4]) == (3, 4)
    assert pick([1, 2], 0) == ()


def test_placement_packs_a_host_before_breaking_into_a_free_one() -> None:
    hosts = [host("a", gpus=4), host("b", gpus=4)]
    holdings = Holdings()
    holdings.hold("x", "u", Placement((Slot("b", (0,), (0,)),)))
    p = place(Request(1, 2), free_view(hosts, holdings))
    assert p == Placement((Slot("b", (1, 2), (1,)),))  # b has 3 free: the best fit for 2; a stays whole
    big = place(Request(1, 4), free_view(hosts, holdings))
    assert big is not None and big.hosts == ("a",) and big.slots[0].gpus == (0, 1, 2, 3)


def test_a_gang_is_placed_whole_on_distinct_hosts_or_not_at_all() -> None:
    hosts = [host(n) for n in ("a", "b", "c")]
    free = free_view(hosts, Holdings())
    p = place(Request(3, 2), free)
    assert p is not None and sorted(p.hosts) == ["a", "b", "c"]
    assert all(s.gpus == (0, 1) for s in p.slots)
    assert place(Request(4, 1), free) is None  # 4 trainers, 3 hosts: nothing, not three of them
    holdings = Holdings()
    holdings.hold("x", "u", Placement((Slot("c", (0,)),)))
    assert place(Request(3, 2), free_view(hosts, holdings)) is None


def test_label_pool_memory_and_down_hosts_narrow_the_choice() -> None:
    hosts = [
        host("a", labels=frozenset({"big"}), pool="lab"),
        host("b", memory=8 * GiB, pool="lab"),
        host("c", up=False, reason="timed out", pool="lab"),
        Host("d", (0, 1), GiB, (Gpu(0, "GPU-d", "NVIDIA H100"),), pool="other"),
    ]
    free = free_view(hosts, Holdings())
    assert place(Request(1, 1, label="big"), free) == Placement((Slot("a", (0,), (0,)),))
    assert place(Request(1, 1, label="h100"), free) == Placement((Slot("d", (0,), (0,)),))
    assert place(Request(1, 1, memory=16 * GiB, pool="lab"), free).hosts == ("a",)  # type: ignore[union-attr]
    assert place(Request(3, 1, pool="lab"), free) is None  # c is down


def test_a_gpu_with_a_process_nobody_holds_is_not_handed_out() -> None:
    stranger = GpuProcess("GPU-a-0", 4242, "python", 2048)
    hosts = [host("a", gpu_processes=(stranger,))]
    free = free_view(hosts, Holdings())
    assert free["a"].gpus == [1] and free["a"].foreign == {0: (stranger,)}
    assert place(Request(1, 2), free) is None
    reason = waiting_reason(Request(1, 2), free)
    assert reason == (
        "waiting for 2 GPUs: 1 free on a (GPU 0 used by pid 4242 python, not a job of this server)"
    )
    holdings = Holdings()  # the same process on a GPU a job holds is that job's
    holdings.hold("mine", "u", Placement((Slot("a", (0,)),)))
    assert free_view(hosts, holdings)["a"].foreign == {}


# -- holdings --------------------------------------------------------------------------------


def test_holdings_never_give_a_gpu_or_cpu_twice() -> None:
    h = Holdings()
    h.hold("x", "alice", Placement((Slot("a", (0, 1), (0, 1), GiB), Slot("b", (0,), (0,)))))
    with pytest.raises(HoldingConflict, match="GPU 1 of a is held by job 'x'; job 'y' cannot have it"):
        h.hold("y", "bob", Placement((Slot("c", (0,)), Slot("a", (1,)))))
    assert "y" not in h and h.on("c").gpus == {}  # nothing of y was held
    with pytest.raises(HoldingConflict, match="CPU 3 of c"):
        h.hold("z", "bob", Placement((Slot("c", (), (3,)), Slot("c", (), (3,)))))
    with pytest.raises(HoldingConflict, match="already holds"):
        h.hold("x", "alice", Placement((Slot("d", (0,)),)))
    assert h.user_gpus() == {"alice": 3}
    assert h.release("x", "a") == (Slot("a", (0, 1), (0, 1), GiB),)
    assert h.on("a").gpus == {} and h.get("x").placement.hosts == ("b",)  # type: ignore[union-attr]
    h.release("x")
    assert "x" not in h and len(h) == 0 and h.release("x") == ()


# -- reasons ----------------------------------------------------------------------------------


def test_the_waiting_reason_names_what_is_free_where() -> None:
    hosts = [host("gpu1", gpus=4), host("gpu2", gpus=4), host("gpu3", up=False, reason="no answer in 10 s")]
    holdings = Holdings()
    holdings.hold("x", "u", Placement((Slot("gpu1", (0, 1), (0, 1, 2, 3)), Slot("gpu2", (0, 1, 2, 3)))))
    free = free_view(hosts, holdings)
    assert waiting_reason(Request(1, 4), free) == (
        "waiting for 4 GPUs: 2 free on gpu1, 0 on gpu2, gpu3 down (no answer in 10 s)"
    )
    assert waiting_reason(Request(2, 2, cpus=8), free) == (
        "waiting for 2 hosts with 2 GPUs, 8 CPUs each: gpu1 has 2 GPUs, 4 CPUs free, "
        "gpu2 has 0 GPUs, 8 CPUs free, gpu3 down (no answer in 10 s)"
    )
    assert waiting_reason(Request(1, 0, memory=100 * GiB), free) == (
        "waiting for 100Gi memory: 64Gi free on gpu1, 64Gi on gpu2, gpu3 down (no answer in 10 s)"
    )


def test_never_fits_names_what_was_asked_and_what_the_pool_has() -> None:
    hosts = [host(f"th{i}", cpus=2, memory=8 * GiB) for i in (1, 2, 3, 4)]
    assert never_fits(Request(4, 2), hosts) is None
    said = never_fits(Request(1, 4), hosts)
    assert said is not None
    assert said.startswith("the job asks for 4 GPUs, 1 CPU; no host of the pool has that much")
    assert "the most on one host: 2 GPUs, 2 CPUs, 8Gi" in said and "th1 (2 GPUs, 2 CPUs, 8Gi)" in said
    said = never_fits(Request(5, 1), hosts)
    assert said is not None and "only 4 hosts of the pool (th1, th2, th3, th4) can hold one" in said
    said = never_fits(Request(1, 1, label="h100"), hosts)
    assert said is not None and "no host has label 'h100'" in said and "NVIDIA A100-SXM4-80GB" in said
    said = never_fits(Request(1, 1, pool="gpu"), hosts)
    assert said is not None and "pool 'gpu', which is not one of the server's pools ['default']" in said
    said = never_fits(Request(2, 2), hosts, gpu_limit=2)
    assert said is not None and "(4 GPUs in all), more than its user's limit of 2 GPUs" in said
    down = [host("th1", up=False)]  # a host down now may come back: the job waits
    assert never_fits(Request(1, 2), down) is None


# -- the fair queue ---------------------------------------------------------------------------


def started(round_: object) -> list[str]:
    return [s.job for s in round_.starts]  # type: ignore[attr-defined]


def test_fifo_within_a_user() -> None:
    hosts = [host("a", gpus=1)]
    r = schedule(hosts, Holdings(), [job("late", "alice", 2.0), job("early", "alice", 1.0)])
    assert started(r) == ["early"]
    assert r.wait_of("late") is not None and r.wait_of("late").position == 1  # type: ignore[union-attr]


def test_fair_share_a_user_holding_gpus_does_not_block_another_users_first_job() -> None:
    hosts = [host("a", gpus=2), host("b", gpus=2)]
    holdings = Holdings()
    holdings.hold("a1", "alice", Placement((Slot("a", (0, 1), (0,)),)))
    waiting = [job("a2", "alice", 1.0), job("a3", "alice", 2.0), job("b1", "bob", 3.0)]
    r = schedule(hosts, holdings, waiting)
    assert started(r) == ["b1", "a2"]  # bob holds nothing: his first job goes before alice's next
    assert [w.job for w in r.waits] == ["a3"]
    # Two users with nothing running take turns, oldest first.
    five = [job(f"a{i}", "alice", i) for i in (1, 2, 3)] + [job(f"b{i}", "bob", 3 + i) for i in (1, 2)]
    r = schedule([host("c", gpus=4)], Holdings(), five)
    assert started(r) == ["a1", "b1", "a2", "b2"]
    assert [(w.job, w.position) for w in r.waits] == [("a3", 1)]


def test_priority_goes_first() -> None:
    r = schedule(
        [host("a", gpus=1)], Holdings(), [job("old", "alice", 1), job("urgent", "bob", 9, priority=5)]
    )
    assert started(r) == ["urgent"]


def test_a_user_limit_holds_that_user_only() -> None:
    hosts = [host("a", gpus=4)]
    holdings = Holdings()
    holdings.hold("a1", "alice", Placement((Slot("a", (0, 1)),)))
    limits = Limits(gpus=2, users={"bob": None})
    r = schedule(hosts, holdings, [job("a2", "alice", 1), job("b1", "bob", 2, gpus=2)], limits)
    assert started(r) == ["b1"]
    assert r.wait_of("a2").reason == "waiting for 1 GPUs: alice holds 2 of their 2 GPUs at once"  # type: ignore[union-attr]


def test_backfill_runs_a_small_job_beside_a_waiting_large_one_but_never_on_what_is_kept_for_it() -> None:
    hosts = [host("a", gpus=4), host("b", gpus=2)]
    holdings = Holdings()
    holdings.hold("run", "carol", Placement((Slot("a", (0, 1)),)))
    waiting = [
        job("large", "alice", 1, gpus=4),
        job("small", "bob", 2, gpus=2),
        job("tiny", "bob", 3, gpus=1),
    ]
    r = schedule(hosts, holdings, waiting)
    # large waits for host a; a's two free GPUs are kept for it; small runs on b (backfill)
    assert r.reserved is not None and r.reserved[0] == "large" and r.reserved[1].hosts == ("a",)
    assert started(r) == ["small"]
    large, tiny = r.wait_of("large"), r.wait_of("tiny")
    assert large is not None and large.position == 1
    assert large.reason == "waiting for 4 GPUs: 2 free on a, 0 on b; next to start, on a"
    assert tiny is not None and tiny.reason.endswith("what is free is kept for large, ahead in the queue")


def test_a_job_that_never_fits_waits_with_its_reason_and_holds_up_nobody() -> None:
    r = schedule([host("a", gpus=2)], Holdings(), [job("huge", "alice", 1, gpus=8), job("ok", "bob", 2)])
    assert started(r) == ["ok"]
    assert r.wait_of("huge").reason.startswith("never fits: the job asks for 8 GPUs")  # type: ignore[union-attr]


# -- the queue over time: a simulation ---------------------------------------------------------


def _simulate(seed: int, hosts: Sequence[Host], jobs: list[Waiting]) -> dict[str, tuple[float, float]]:
    """Run ``jobs`` on ``hosts`` with random durations; (start, end) of each; checks every round."""
    rng = random.Random(seed)
    holdings = Holdings()
    waiting = list(jobs)
    running: dict[str, float] = {}
    times: dict[str, tuple[float, float]] = {}
    now = 0.0
    for _ in range(10_000):
        r = schedule(hosts, holdings, waiting)
        for s in r.starts:
            holdings.hold(s.job, s.user, s.placement, now)  # raises if anything were given twice
            w = next(w for w in waiting if w.job == s.job)
            assert len(s.placement.slots) == w.request.trainers  # whole: every trainer
            assert len(set(s.placement.hosts)) == w.request.trainers  # a host each
            assert all(len(sl.gpus) == w.request.gpus for sl in s.placement.slots)
            waiting.remove(w)
            running[s.job] = now + rng.uniform(1, 10)
            times[s.job] = (now, 0.0)
        if not running:
            assert not waiting, [w.reason for w in r.waits]
            return times
        now, done = min((end, name) for name, end in running.items())
        del running[done]
        holdings.release(done)
        times[done] = (times[done][0], now)
    raise AssertionError("the queue did not drain")


def test_random_workloads_drain_with_no_gpu_given_twice_and_no_half_placed_job() -> None:
    hosts = [host(f"th{i}", gpus=2, cpus=4) for i in range(1, 5)]
    for seed in range(20):
        rng = random.Random(seed)
        jobs = []
        for n in range(30):
            trainers, gpus = rng.choice([(1, 1), (1, 2), (2, 2), (2, 1), (4, 1), (3, 2)])
            jobs.append(job(f"j{n}", rng.choice(["alice", "bob", "carol"]), float(n), gpus, trainers))
        times = _simulate(seed, hosts, jobs)
        assert set(times) == {j.job for j in jobs}


def _timeline(
    hosts: Sequence[Host],
    running: dict[str, tuple[Placement, float]],
    jobs: list[tuple[Waiting, float, float]],
) -> dict[str, float]:
    """Each job's start: ``running`` jobs end at their given time; ``jobs`` arrive, then run so long."""
    holdings = Holdings()
    ends: dict[str, float] = {}
    for name, (placement, end) in running.items():
        holdings.hold(name, "carol", placement)
        ends[name] = end
    starts: dict[str, float] = {}
    now = 0.0
    while True:
        waiting = [w for w, arrives, _ in jobs if arrives <= now and w.job not in starts]
        for s in schedule(hosts, holdings, waiting).starts:
            holdings.hold(s.job, s.user, s.placement)
            starts[s.job] = now
            ends[s.job] = now + next(d for w, _, d in jobs if w.job == s.job)
        events = [t for t in ends.values() if t > now] + [a for w, a, _ in jobs if a > now]
        if not events:
            return starts
        now = min(events)
        for name in [n for n, t in ends.items() if t <= now]:
            holdings.release(name)
            del ends[name]


def test_backfill_never_delays_the_reserved_job() -> None:
    """The large job starts when the job on the host kept for it ends, however many small jobs come."""
    hosts = [host("a", gpus=2), host("b", gpus=2)]
    running = {"x": (Placement((Slot("a", (0,)),)), 5.0), "y": (Placement((Slot("b", (0,)),)), 8.0)}
    large = (job("large", "alice", 1, gpus=2), 0.0, 10.0)
    alone = _timeline(hosts, running, [large])
    assert alone == {"large": 5.0}
    smalls = [(job(f"small{i}", "bob", 2 + i, gpus=1), 0.5 * i, 100.0) for i in range(10)]
    crowded = _timeline(hosts, running, [large, *smalls])
    assert crowded["large"] == 5.0  # not delayed
    assert crowded["small0"] == 0.0  # and a small one ran beside it meanwhile (b's free GPU)


def test_the_public_api_is_sorted_and_complete() -> None:
    import tlaunch.pool

    assert list(tlaunch.pool.__all__) == sorted(tlaunch.pool.__all__)
    assert all(hasattr(tlaunch.pool, name) for name in tlaunch.pool.__all__)


# -- the probe's answer ------------------------------------------------------------------------

_PROBED = """@nproc
4
@cpus
Cpus_allowed_list:\t0-1,4-5
@memory
MemTotal:       16384000 kB
@gpus
0, NVIDIA A100-SXM4-80GB, 81920, GPU-aaaa
1, NVIDIA A100-SXM4-80GB, 81920, GPU-bbbb
@apps
GPU-bbbb, 4242, /usr/bin/python3, 1024
GPU-bbbb, 4243, jupyter, [N/A]
"""


def test_the_probes_answer_is_read() -> None:
    from tlaunch.pool.probe import parse_probe

    facts = parse_probe(_PROBED)
    assert facts.cpus == (0, 1, 4, 5) and facts.memory == 16384000 * 1024
    assert [(g.index, g.uuid, g.memory_mib) for g in facts.gpus] == [
        (0, "GPU-aaaa", 81920),
        (1, "GPU-bbbb", 81920),
    ]
    assert facts.gpu_processes == (
        GpuProcess("GPU-bbbb", 4242, "/usr/bin/python3", 1024),
        GpuProcess("GPU-bbbb", 4243, "jupyter", 0),
    )
    plain = parse_probe("@nproc\n2\n@cpus\n@memory\nMemTotal: 1000 kB\n")  # no nvidia-smi: no GPUs
    assert plain.cpus == (0, 1) and plain.gpus == () and plain.memory == 1024000
    none = parse_probe("@nproc\n2\n@memory\nMemTotal: 1 kB\n@gpus\nNo devices were found\n@failed 6\n@apps\n")
    assert none.gpus == ()
    with pytest.raises(
        ValueError, match=r"nvidia-smi --query-gpu failed \(exit status 9\): NVIDIA-SMI has failed"
    ):
        parse_probe(
            "@nproc\n2\n@memory\nMemTotal: 1 kB\n@gpus\nNVIDIA-SMI has failed because...\n@failed 9\n"
        )
    with pytest.raises(ValueError, match="not understood"):
        parse_probe("bash: nproc: command not found")


def test_a_slot_is_read_for_its_own_host_only() -> None:
    from tlaunch.runtime.slots import SLOTS, slot_of

    env = {SLOTS: '{"th1": {"gpus": "GPU-a,GPU-b", "cpus": "0-1,4"}, "th2": {"gpus": "", "cpus": ""}}'}
    assert slot_of(env, "th1") == (
        {
            "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "TLAUNCH_POOL_CPUS": "0-1,4",
        },
        {0, 1, 4},
    )
    assert slot_of(env, "th2") == (
        {"CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        None,
    )  # no GPU
    assert slot_of(env, "th3") == ({}, None) and slot_of({}, "th1") == ({}, None)
    with pytest.raises(ValueError, match="TLAUNCH_POOL_SLOTS is not JSON"):
        slot_of({SLOTS: "{"}, "th1")
