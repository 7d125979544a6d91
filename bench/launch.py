"""SSH launch benchmark on the namespace test hosts (needs root).

    python bench/launch.py [--reps 3] [--out bench/results/launch.json]

For H = 1, 4, 16 hosts x 1 and 4 nodes per host: wall time from ``launch()``
to every node registered with the coordinator, and from ``stop()`` to nothing
of the run left on any host. The floor, measured in the same run: one fresh
OpenSSH handshake + ``true`` per host, all hosts in parallel.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

from tlaunch import lp_ssh as lp
from tlaunch.testing.hosts import SSHTestHosts, hosts_unavailable


class Pinger:
    def ping(self) -> None:
        return None


def openssh_floor(hosts: SSHTestHosts, h: int) -> float:
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(["ssh", "-F", hosts.ssh_config, "-o", "BatchMode=yes", f"th{i}", "true"])
        for i in range(1, h + 1)
    ]
    for p in procs:
        p.wait()
    return time.perf_counter() - t0


def one_launch(hosts: SSHTestHosts, h: int, per_host: int) -> tuple[float, float]:
    program = lp.Program(f"bench-{h}x{per_host}")
    with program.group("pinger"):
        for i in range(1, h + 1):
            for _ in range(per_host):
                program.add_node(lp.CourierNode(Pinger).to_host(f"th{i}"))
    t0 = time.perf_counter()
    run = lp.launch(program, wait=False, ssh_config=hosts.ssh_config)
    while not all(rec["address"] for rec in run.status().values()):
        time.sleep(0.002)
    launched = time.perf_counter() - t0
    t1 = time.perf_counter()
    run.stop()  # returns once each host has confirmed its processes and tmux session gone
    return launched, time.perf_counter() - t1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "launch.json"))
    args = parser.parse_args()
    reason = hosts_unavailable()
    if reason:
        raise SystemExit(f"bench/launch.py: {reason}")
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "cases": {}}
    with SSHTestHosts(16) as hosts:
        for h in (1, 4, 16):
            floor = statistics.median(openssh_floor(hosts, h) for _ in range(args.reps))
            for per_host in (1, 4):
                samples = [one_launch(hosts, h, per_host) for _ in range(args.reps)]
                case = {
                    "hosts": h,
                    "nodes_per_host": per_host,
                    "launch_s": statistics.median(s[0] for s in samples),
                    "teardown_s": statistics.median(s[1] for s in samples),
                    "openssh_floor_s": floor,
                }
                results["cases"][f"{h}x{per_host}"] = case
                print(json.dumps(case), flush=True)
    c = results["cases"]
    results["ratio_launch_H16_over_H1"] = {
        n: c[f"16x{n}"]["launch_s"] / c[f"1x{n}"]["launch_s"] for n in (1, 4)
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(json.dumps(results["ratio_launch_H16_over_H1"]))


if __name__ == "__main__":
    main()
