"""What sampling a host's nodes costs: CPU per host per second, against a psutil sampler of the same trees.

    python bench/sampling.py [--nodes 8] [--rounds 7] [--samples 200] [--out bench/results/sampling.json]

Starts ``--nodes`` stand-in nodes on this machine, each a Python process with two
children and ten threads (a small torch job's shape), then measures, in alternating
rounds, the CPU time of one sample of every node (what a host's supervisors spend a
second at one sample a node a second):

* ``tlaunch``: :class:`tlaunch.runtime.sampling.TreeSampler` (``/proc`` files of each
  tree only, children from ``/proc/PID/task/TID/children``);
* ``psutil`` (the reference): ``Process.children(recursive=True)`` (a scan of every
  process of the host) and, per process, ``oneshot()`` of CPU times, memory, threads
  and descriptors: what a sampler written with psutil does.

The result: medians over rounds of the CPU seconds per host-second, as a percentage
of one core (the issue's bound: under 1 %), their ratio, and the host's process count
(the psutil scan grows with it). JSON, and a plot beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

NODE = """
import subprocess, sys, threading, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)]
for _ in range(10):
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
print("up", flush=True)
time.sleep(600)
"""


def _psutil_sample(psutil: Any, root: int) -> tuple[float, int]:
    """CPU seconds and RSS of ``root``'s tree, as a psutil sampler reads them."""
    top = psutil.Process(root)
    cpu, rss = 0.0, 0
    for p in [top, *top.children(recursive=True)]:
        with p.oneshot():
            t = p.cpu_times()
            cpu += t.user + t.system
            rss += p.memory_info().rss
            p.num_threads()
            p.num_fds()
    return cpu, rss


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--samples", type=int, default=200, help="samples of every node per round")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "sampling.json"))
    args = parser.parse_args()
    import psutil

    from tlaunch.runtime.sampling import GpuSampler, TreeSampler

    nodes = [
        subprocess.Popen([sys.executable, "-c", NODE], stdout=subprocess.PIPE, text=True)
        for _ in range(args.nodes)
    ]
    try:
        for n in nodes:
            assert n.stdout is not None and n.stdout.readline() == "up\n"
        gpu = GpuSampler()
        samplers = [TreeSampler(gpu) for _ in nodes]
        rounds: dict[str, list[float]] = {"tlaunch": [], "psutil": []}
        for _ in range(args.rounds):
            for name in ("tlaunch", "psutil"):
                t0 = time.process_time()
                for _ in range(args.samples):
                    for sampler, n in zip(samplers, nodes, strict=True):
                        if name == "tlaunch":
                            sampler.sample(n.pid)
                        else:
                            _psutil_sample(psutil, n.pid)
                per_host_second = (time.process_time() - t0) / args.samples  # every node sampled once
                rounds[name].append(100.0 * per_host_second)  # percent of one core at one sample a second
        result = {
            "what": f"CPU of one sample of each of {args.nodes} nodes (3 processes, 12 threads each), % of a core",
            "nodes": args.nodes,
            "host_processes": len(psutil.pids()),
            "gpu": gpu.available,
            "rounds": rounds,
            "median_percent_of_a_core": {k: statistics.median(v) for k, v in rounds.items()},
            "ratio_psutil_over_tlaunch": statistics.median(rounds["psutil"])
            / statistics.median(rounds["tlaunch"]),
            "python": sys.version.split()[0],
            "date": time.strftime("%Y-%m-%d"),
        }
    finally:
        for n in nodes:
            n.kill()
            n.wait()
            if n.stdout is not None:
                n.stdout.close()
        for p in psutil.Process().children(recursive=True):
            p.kill()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    _plot(result, args.out[: -len(".json")] + ".png")
    print(json.dumps(result, indent=1))


def _plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    names = list(result["rounds"])
    ax.boxplot([result["rounds"][n] for n in names], tick_labels=names)
    ax.axhline(1.0, color="red", linestyle="--", label="the bound: 1 % of a core")
    ax.set_ylabel("% of one core per host")
    ax.set_title(f"sampling {result['nodes']} nodes once a second")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
