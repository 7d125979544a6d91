"""The job server's pool: what its scheduler costs, and how soon a freed GPU is used again.

    python bench/pool.py [--rounds 200] [--out bench/results/pool.json]           # the scheduler alone
    python bench/pool.py --e2e [--jobs 24] [--out bench/results/pool_e2e.json]    # a server on test hosts

* ``scheduler`` (no SSH, no server): 32 hosts of 8 GPUs and 64 CPUs, every GPU
  held by running jobs, 100 jobs queued (1, 2, 4 and 8 GPUs a trainer, 1 to 4
  trainers, four users, two priorities). Each round one running job ends, its
  holdings are released and :func:`tlaunch.pool.schedule` decides; the jobs it
  starts are held (and end in a later round), new jobs arrive to keep 100
  queued. Measured: CPU seconds of each ``schedule`` call (``time.process_time``),
  per round and per placement. Reference, on the very same states in the same
  run: a plain FIFO first-fit (the queue's head placed first-fit on what is
  free, stopping at the first job that does not fit: no fair share, no
  reservation, no reasons), the least a scheduler does.
* ``e2e`` (``--e2e``; root, SSH test hosts): a job server with a pool of 4
  test hosts of 2 fake GPUs; ``--jobs`` jobs of one GPU queued at once, each a
  trainer that holds its GPU a random 1-3 s. Measured from the trainers' own
  clocks (the hosts share this machine's): the time from a trainer's exit (its
  last line) to the start of the next trainer on the same GPU (its first
  line). Reference in the same run: a job submitted to an idle pool, from the
  submit to its trainer's first line (what starting a job costs without a queue).

Results: JSON with medians and p99s, and a plot beside it (``.png``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from tlaunch.pool import Gpu, Holdings, Host, Placement, Request, Slot, Waiting, free_view, place, schedule  # noqa: E402


def _hosts(n: int = 32, gpus: int = 8, cpus: int = 64) -> list[Host]:
    return [
        Host(
            f"gpu{i}",
            tuple(range(cpus)),
            512 << 30,
            tuple(Gpu(g, f"GPU-{i}-{g}", "NVIDIA H100") for g in range(gpus)),
        )
        for i in range(1, n + 1)
    ]


def _job(rng: random.Random, seq: int) -> Waiting:
    gpus = rng.choice([1, 1, 1, 2, 2, 4, 8])
    trainers = rng.choice([1, 1, 1, 2, 4]) if gpus >= 4 else rng.choice([1, 1, 2])
    user = rng.choice(["alice", "bob", "carol", "dave"])
    return Waiting(
        f"job{seq}", user, Request(trainers, gpus, cpus=gpus * 4), float(seq), 1 if seq % 17 == 0 else 0
    )


def fifo_first_fit(
    hosts: Sequence[Host], holdings: Holdings, waiting: Sequence[Waiting]
) -> list[tuple[str, Placement]]:
    """The reference: the oldest jobs placed first-fit until one does not fit."""
    free = free_view(hosts, holdings)
    out = []
    for w in sorted(waiting, key=lambda w: w.seq):
        p = place(w.request, free)
        if p is None:
            break
        for slot in p.slots:
            free[slot.host].take(slot)
        out.append((w.job, p))
    return out


def bench_scheduler(rounds: int, queued: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    hosts = _hosts()
    holdings = Holdings()
    # Fill every GPU with running jobs of one host's GPUs each.
    for i, h in enumerate(hosts):
        holdings.hold(
            f"run{i}",
            rng.choice(["alice", "bob", "carol", "dave"]),
            Placement((Slot(h.name, tuple(range(8)), tuple(range(32))),)),
        )
    seq = 0
    waiting: list[Waiting] = []
    while len(waiting) < queued:
        waiting.append(_job(rng, seq))
        seq += 1
    ours, ref, placed, ours_per, ref_per = [], [], 0, [], []
    for _ in range(rounds):
        gone = rng.choice(holdings.jobs())  # a running job ends: its holdings go
        holdings.release(gone.job)
        t0 = time.process_time()
        decided = schedule(hosts, holdings, waiting)
        spent = time.process_time() - t0
        t0 = time.process_time()
        fifo = fifo_first_fit(hosts, holdings, waiting)
        ref_spent = time.process_time() - t0
        ours.append(spent)
        ref.append(ref_spent)
        if decided.starts:
            ours_per.append(spent / len(decided.starts))
        if fifo:
            ref_per.append(ref_spent / len(fifo))
        for s in decided.starts:
            holdings.hold(s.job, s.user, s.placement)
            placed += 1
        started = {s.job for s in decided.starts}
        waiting = [w for w in waiting if w.job not in started]
        while len(waiting) < queued:
            waiting.append(_job(rng, seq))
            seq += 1
    return {
        "hosts": len(hosts),
        "gpus": sum(len(h.gpus) for h in hosts),
        "queued": queued,
        "rounds": rounds,
        "placements": placed,
        "round_cpu_ms": _stats(ours),
        "placement_cpu_ms": _stats(ours_per),
        "reference_fifo_round_cpu_ms": _stats(ref),
        "reference_fifo_placement_cpu_ms": _stats(ref_per),
        "ratio_round_median": statistics.median(ours) / statistics.median(ref),
        "samples_round_cpu_ms": [x * 1e3 for x in ours],
        "samples_reference_round_cpu_ms": [x * 1e3 for x in ref],
    }


_TRAINER = """
import json, os, sys, time
from tlaunch.testing.gpus import open_visible_gpus
held = open_visible_gpus()
start = time.time()
print("BENCH " + json.dumps({"start": start, "visible": os.environ["CUDA_VISIBLE_DEVICES"]}), flush=True)
time.sleep(float(sys.argv[1]))
print("BENCH " + json.dumps({"end": time.time(), "visible": os.environ["CUDA_VISIBLE_DEVICES"]}), flush=True)
"""


def bench_e2e(jobs: int, reference_runs: int = 5, seed: int = 2) -> dict[str, Any]:
    """A server with a pool of 4 test hosts x 2 fake GPUs: freed GPU -> next start (see the docstring)."""
    import io
    import socket
    import subprocess
    import tempfile
    import zipfile

    import httpx

    from tlaunch.pool.journal import read_journal
    from tlaunch.testing.gpus import install_fake_gpus
    from tlaunch.testing.hosts import SSHTestHosts

    rng = random.Random(seed)
    token = "bench-token-0123456789"
    with SSHTestHosts(4) as hosts, tempfile.TemporaryDirectory(prefix="tlaunch-bench-pool-") as tmp:
        install_fake_gpus(hosts, 2)
        with open(os.path.join(tmp, "pool.yaml"), "w") as f:
            f.write(f"ssh_config: {hosts.ssh_config}\nprobe_every: 30\nhosts: [th1, th2, th3, th4]\n")
        with open(os.path.join(tmp, "tokens"), "w") as f:
            f.write(f"{token} bench admin\n")
        os.chmod(os.path.join(tmp, "tokens"), 0o600)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        home = os.path.join(tmp, "home")
        argv = [sys.executable, "-m", "tlaunch.server", "--port", str(port), "--home", home,
                "--token-file", os.path.join(tmp, "tokens"), "--pool", os.path.join(tmp, "pool.yaml")]  # fmt: skip
        with open(os.path.join(tmp, "server.log"), "wb") as log:
            server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            c = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"},
                             timeout=120)  # fmt: skip
            deadline = time.monotonic() + 60
            while True:
                try:
                    if c.get("/v1/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and server.poll() is None, "the server did not start"
                time.sleep(0.1)
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w") as z:
                z.writestr("train.py", _TRAINER)
            package = c.post("/v1/package", content=buf.getvalue()).json()["package_id"]

            def submit(name: str, seconds: float) -> float:
                body = {"job_name": name, "trainer_package": package, "entry_point": "train.py",
                        "args": [str(seconds)], "use_gpu": True, "gpu_num": 1}  # fmt: skip
                t0 = time.time()
                r = c.post("/v1/trainer/job", json=body)
                assert r.status_code == 201, r.text
                return t0

            def wait(names: list[str]) -> None:
                for name in names:
                    while (state := c.get(f"/v1/jobs/{name}").json()["state"]) not in ("SUCCEEDED", "FAILED"):
                        time.sleep(0.2)
                    assert state == "SUCCEEDED", c.get(f"/v1/jobs/{name}").json()

            def said(name: str) -> list[dict[str, Any]]:
                out = []
                with c.stream("GET", f"/v1/jobs/{name}/logs") as r:
                    for line in r.iter_lines():
                        if line.startswith("data: ") and "BENCH " in line:
                            out.append(json.loads(json.loads(line[6:])["text"].split("BENCH ", 1)[1]))
                return out

            reference = []
            for i in range(reference_runs):  # an idle pool: submit -> the trainer's first line
                t0 = submit(f"idle{i}", 0.1)
                wait([f"idle{i}"])
                reference.append(said(f"idle{i}")[0]["start"] - t0)
            names = [f"q{i}" for i in range(jobs)]
            for name in names:
                submit(name, rng.uniform(1.0, 3.0))
            wait(names)
            uses: dict[str, list[tuple[float, float, str]]] = {}
            for name in names:
                lines = said(name)
                start = next(x["start"] for x in lines if "start" in x)
                end = next(x["end"] for x in lines if "end" in x)
                uses.setdefault(lines[0]["visible"], []).append((start, end, name))
            journal = read_journal(os.path.join(home, "server", "placements.log"))
        finally:
            server.terminate()
            server.wait(30)
    holds = {e["job"].partition("/")[2]: e["t"] for e in journal if e["event"] == "hold"}  # owner/name
    releases = {e["job"].partition("/")[2]: e["t"] for e in journal if e["event"] == "release"}
    gaps, seen, placed, launched = [], [], [], []
    for spans in uses.values():  # each GPU: a trainer's end, then the next one's start
        spans.sort()
        for (_, end, first), (start, _, then) in itertools.pairwise(spans):
            gaps.append(start - end)
            seen.append(releases[first] - end)  # its end seen, its processes checked gone: released
            placed.append(holds[then] - releases[first])  # the next job held (a scheduling round)
            launched.append(start - holds[then])  # the next job launched, its trainer started
    return {
        "hosts": 4,
        "gpus": 8,
        "jobs": jobs,
        "freed_to_start_s": _stats(gaps, 1.0),
        "reference_submit_to_start_s": _stats(reference, 1.0),
        "parts_s": {
            "end_to_release": _stats(seen, 1.0),
            "release_to_hold": _stats(placed, 1.0),
            "hold_to_start": _stats(launched, 1.0),
        },
        "samples_freed_to_start_s": gaps,
    }


def _stats(xs: Sequence[float], scale: float = 1e3) -> dict[str, float]:
    if not xs:
        return {"n": 0}
    s = sorted(xs)
    return {
        "n": len(s),
        "median": statistics.median(s) * scale,
        "p99": s[min(len(s) - 1, round(0.99 * (len(s) - 1)))] * scale,
        "max": s[-1] * scale,
    }


def _plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    e = result.get("e2e")
    fig, axes = plt.subplots(1, 2 if e else 1, figsize=(11 if e else 6, 4), squeeze=False)
    ax = axes[0][0]
    s = result["scheduler"]
    data = [s["samples_round_cpu_ms"], s["samples_reference_round_cpu_ms"]]
    ax.boxplot(data, tick_labels=["tlaunch.pool.schedule", "FIFO first-fit\n(reference)"], showfliers=True)
    ax.set_ylabel("CPU ms per scheduling round")
    ax.set_title(f"{s['queued']} queued jobs, {s['hosts']} hosts x 8 GPUs, {s['rounds']} rounds", fontsize=10)
    if e:
        ax = axes[0][1]
        parts = e["parts_s"]
        names = ["end seen, its\nprocesses gone", "placed\n(a round)", "launched, its\nfirst line"]
        values = [parts[k]["median"] for k in ("end_to_release", "release_to_hold", "hold_to_start")]
        left = 0.0
        for name, value in zip(names, values, strict=True):
            ax.barh(["GPU freed ->\nnext start"], [value], left=left, label=f"{name.replace(chr(10), ' ')}")
            left += value
        ax.barh(
            ["submit -> start,\nidle pool (ref.)"], [e["reference_submit_to_start_s"]["median"]], color="grey"
        )
        ax.set_xlabel("seconds (medians)")
        total = e["freed_to_start_s"]
        ax.set_title(f"4 hosts x 2 fake GPUs, {e['jobs']} jobs: median {total['median']:.2f} s, "
                     f"p99 {total['p99']:.2f} s", fontsize=10)  # fmt: skip
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--queued", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--e2e", action="store_true", help="also a job server on SSH test hosts (root)")
    ap.add_argument("--jobs", type=int, default=24)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "pool.json"))
    args = ap.parse_args(argv)
    result: dict[str, Any] = {"python": sys.version.split()[0], "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    result["scheduler"] = bench_scheduler(args.rounds, args.queued, args.seed)
    if args.e2e:
        result["e2e"] = bench_e2e(args.jobs)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    _plot(result, args.out.removesuffix(".json") + ".png")
    s = result["scheduler"]
    print(
        f"scheduler, {s['queued']} queued, {s['hosts']} hosts: {s['round_cpu_ms']['median']:.2f} ms CPU a round "
        f"(p99 {s['round_cpu_ms']['p99']:.2f}), {s['placement_cpu_ms']['median']:.2f} ms a placement; "
        f"FIFO first-fit {s['reference_fifo_round_cpu_ms']['median']:.2f} ms a round "
        f"({s['ratio_round_median']:.1f}x)"
    )
    if "e2e" in result:
        e = result["e2e"]
        parts = ", ".join(f"{k} {v['median']:.3f} s" for k, v in e["parts_s"].items())
        print(
            f"GPU freed -> next start: median {e['freed_to_start_s']['median']:.3f} s, "
            f"p99 {e['freed_to_start_s']['p99']:.3f} s ({parts}); "
            f"submit -> start on an idle pool: {e['reference_submit_to_start_s']['median']:.3f} s"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
