"""numpy arrays between two processes of one host: this tree against earlier tlaunch, same run.

    python bench/shm.py [--reps 5] [--sizes 1,64,256] [--out bench/results/shm.json]

One server process echoes what one client process sends (``RPCServer``/``RPCClient``,
the same script for every variant); MiB/s is the array's size over the round trip
(it crosses twice). Also "one way": the array
goes to the server, which answers with its size (the array crosses once, is
not touched there, and nothing large comes back). The variants, interleaved
repetition by repetition so that all see the same load of this shared machine:

* ``sealed`` -- this tree: sealed memory files passed over a Unix socket, mapped;
* ``copied`` -- tlaunch at ``--copied`` (before this change): 0600 files in /dev/shm,
  copied into the receiver's memory;
* ``mapped`` -- tlaunch at ``--mapped`` (the first shared-memory version): the same
  files mapped unsealed, which a sender could change or shrink under the receiver
  (the reference figure of ~2.1 GiB/s; no longer safe, measured for comparison);
* ``tls`` -- this tree with shared memory off: TLS over the loopback;
* ``sealed_before`` -- with ``--before COMMIT``: sealed files at that commit (one file per
  buffer, freed before the reply), the same protocol as this tree's otherwise.

Earlier trees are taken from git (``git archive``) into a temporary folder.
Each measurement is the median of ``--reps`` round trips in one process pair;
the figure reported is the median over the repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PAIR = r"""
import json, os, pickle, statistics, subprocess, sys, time
import numpy as np

if os.environ.get("BENCH_NO_SHM"):
    from tlaunch.rpc import shm
    shm.host_key = lambda: None
from tlaunch.rpc import RPCClient, RPCServer, RunKeys
from tlaunch.rpc.client import fixed_resolver


class Echo:
    def echo(self, x):
        return x

    def size(self, x):
        return x.nbytes


if sys.argv[1] == "serve":
    keys = pickle.loads(bytes.fromhex(sys.stdin.readline()))
    server = RPCServer(Echo(), keys)
    print(server.address, flush=True)
    sys.stdin.readline()
    server.close()
    sys.exit()

keys = RunKeys.generate()
server = subprocess.Popen([sys.executable, __file__, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True)
server.stdin.write(pickle.dumps(keys).hex() + "\n")
server.stdin.flush()
client = RPCClient("echo/0", keys, fixed_resolver(server.stdout.readline().strip()))
out = {}
for mib in [int(x) for x in sys.argv[2].split(",")]:
    arr = np.ones(mib << 18, dtype=np.float32)
    back = client.echo(arr)  # warm: connection, pages
    assert back.shape == arr.shape and back.flags.writeable
    del back
    times = []
    for _ in range(int(sys.argv[3])):
        t = time.perf_counter()
        back = client.echo(arr)
        times.append(time.perf_counter() - t)
        del back
    out[f"{mib}MiB"] = statistics.median(times)
    times = []
    for _ in range(int(sys.argv[3])):
        t = time.perf_counter()
        assert client.size(arr) == arr.nbytes
        times.append(time.perf_counter() - t)
    out[f"{mib}MiB one way"] = statistics.median(times)
client.close()
server.stdin.write("\n")
server.stdin.flush()
server.wait()
print(json.dumps(out))
"""


def tree(commit: str, into: str) -> str:
    """Extract ``tlaunch/`` at ``commit`` into ``into``; the folder to put on PYTHONPATH."""
    os.makedirs(into, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", commit, "tlaunch"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    return into


def measure(path: str, script: str, sizes: str, reps: int, no_shm: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("BENCH_NO_SHM", None)
    if no_shm:
        env["BENCH_NO_SHM"] = "1"
    run = subprocess.run(
        [sys.executable, script, "client", sizes, str(reps)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=os.path.dirname(script),
    )
    if run.returncode != 0:
        raise RuntimeError(f"{path}: {run.stderr[-2000:]}")
    times: dict[str, float] = json.loads(run.stdout.strip().splitlines()[-1])
    return times


def plot(results: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    variants = list(results["MiB_per_s"])
    sizes = list(results["MiB_per_s"][variants[0]])
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(variants)
    for j, v in enumerate(variants):
        ax.bar(
            [i + j * width for i in range(len(sizes))],
            [results["MiB_per_s"][v][s] for s in sizes],
            width,
            label=v,
        )
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(sizes))], sizes)
    ax.set(title="numpy arrays between two processes of one host", ylabel="MiB/s (size / time of the call)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions (process pairs) per variant")
    parser.add_argument("--round-trips", type=int, default=5, help="round trips per size in one pair")
    parser.add_argument("--sizes", default="1,64,256", help="MiB, comma-separated")
    parser.add_argument("--copied", default="c1fbad9", help="commit of the copying version")
    parser.add_argument("--mapped", default="a87948f^", help="commit of the unsealed mapping version")
    parser.add_argument("--before", default=None, help="commit of an earlier sealed version to compare")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "shm.json"))
    args = parser.parse_args()
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tlaunch-bench-shm-") as tmp:
        script = os.path.join(tmp, "pair.py")
        with open(script, "w") as f:
            f.write(PAIR)
        variants = {
            "sealed": (ROOT, False),
            "copied": (tree(args.copied, os.path.join(tmp, "copied")), False),
            "mapped": (tree(args.mapped, os.path.join(tmp, "mapped")), False),
            "tls": (ROOT, True),
        }
        if args.before:
            variants["sealed_before"] = (tree(args.before, os.path.join(tmp, "before")), False)
        samples: dict[str, dict[str, list[float]]] = {v: {} for v in variants}
        for rep in range(args.reps):
            for name, (path, no_shm) in variants.items():
                times = measure(path, script, args.sizes, args.round_trips, no_shm)
                for size, t in times.items():
                    samples[name].setdefault(size, []).append(t)
                print(
                    f"rep {rep + 1}: {name}: " + ", ".join(f"{s} {t * 1e3:.1f} ms" for s, t in times.items())
                )
    mib_per_s = {
        name: {size: int(size.split("MiB")[0]) / statistics.median(ts) for size, ts in by_size.items()}
        for name, by_size in samples.items()
    }
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_at_start": load_at_start,
        },
        "commits": {"copied": args.copied, "mapped": args.mapped, "sealed_before": args.before},
        "round_trip_s": samples,
        "MiB_per_s": mib_per_s,
        "ratios": {
            f"sealed_over_{ref}_{size}": mib_per_s["sealed"][size] / mib_per_s[ref][size]
            for ref in mib_per_s
            if ref != "sealed"
            for size in mib_per_s["sealed"]
        },
    }
    results["machine"]["load_at_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    plot(results, os.path.splitext(args.out)[0] + ".png")
    print(json.dumps({k: {s: round(v) for s, v in d.items()} for k, d in mib_per_s.items()}, indent=2))


if __name__ == "__main__":
    main()
