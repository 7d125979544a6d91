"""What a run of H hosts x 1 node costs while it idles: the launcher, the head, a host (root).

    python bench/footprint.py [--hosts 256] [--idle 10] [--out bench/results/footprint.json]

Launches one CourierNode on each of H SSH test hosts (the head on th1), calls
every node once, lets the run idle, then reads from ``/proc``: the
launcher's and the head's memory (RSS and PSS), threads, file descriptors
and sockets, and their CPU per second while idle; the median supervisor and
node process of the hosts; and the bytes per second through th1's network
interface while idle (the heartbeats and the launcher's lease: nothing else
runs there). ``docs/scale.md`` extrapolates these to 1000 and 10,000 hosts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import sys
import time
from typing import Any

import plots  # bench/plots.py, beside this script

HERE = os.path.dirname(os.path.abspath(__file__))


class Echo:
    def name(self) -> str:
        return socket.gethostname()


def proc(pid: int) -> dict[str, float]:
    """Memory (MiB), threads, descriptors, sockets and CPU seconds of process ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        status = f.read().splitlines()

    def field(name: str) -> int:
        return int(next(line.split()[1] for line in status if line.startswith(name + ":")))

    with open(f"/proc/{pid}/smaps_rollup") as f:
        pss = int(next(line.split()[1] for line in f if line.startswith("Pss:")))
    fds = os.listdir(f"/proc/{pid}/fd")
    sockets = 0
    for fd in fds:
        with contextlib.suppress(OSError):
            sockets += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    with open(f"/proc/{pid}/stat") as f:
        ticks = f.read().rsplit(")", 1)[1].split()
    return {
        "rss_mib": field("VmRSS") / 1024,
        "pss_mib": pss / 1024,
        "threads": field("Threads"),
        "fds": len(fds),
        "sockets": sockets,
        "cpu_s": (int(ticks[11]) + int(ticks[12])) / os.sysconf("SC_CLK_TCK"),
    }


def comm(pid: int) -> str:
    """The process's name (``/proc/PID/comm``); "" once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def pids_of(*needles: str) -> list[int]:
    """Python processes whose command line holds every one of ``needles``."""
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        line = b" ".join(argv).decode(errors="replace")
        if b"python" in argv[0] and all(n in line for n in needles):
            found.append(int(p))
    return found


def eth0_bytes(pid: int) -> int:
    """Bytes in and out of eth0 in the network namespace of ``pid``."""
    with open(f"/proc/{pid}/net/dev") as f:
        for line in f.read().splitlines()[2:]:
            name, rest = line.split(":", 1)
            if name.strip() == "eth0":
                cols = rest.split()
                return int(cols[0]) + int(cols[8])
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=256)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "footprint.json"))
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(HERE))
    from tlaunch import lp_ssh as lp
    from tlaunch.testing.hosts import SSHTestHosts, hosts_unavailable

    reason = hosts_unavailable()
    if reason:
        print(f"bench/footprint.py: {reason}", file=sys.stderr)
        return 1
    with SSHTestHosts(args.hosts) as hosts:
        before = proc(os.getpid())
        program = lp.Program("footprint")
        handles = [
            program.add_node(lp.CourierNode(Echo).to_host(f"th{i}"), label=f"n{i}")
            for i in range(1, args.hosts + 1)
        ]
        run = lp.launch(program, wait=False, ssh_config=hosts.ssh_config)
        try:
            for h in handles:
                h.dereference().name()
            time.sleep(3.0)  # settle
            head = pids_of("tlaunch.runtime.head", run.run_id)[-1]
            # A node forked from its supervisor has its command line, and the name tlaunch-node.
            under = pids_of("tlaunch.runtime.supervisor", run.run_id)
            sups = [p for p in under if comm(p) != "tlaunch-node"]
            nodes = [p for p in under if comm(p) == "tlaunch-node"]
            nodes += pids_of("tlaunch.runtime.node_main", run.run_id)
            me0, head0, net0, t0 = proc(os.getpid()), proc(head), eth0_bytes(head), time.monotonic()
            time.sleep(args.idle)
            me1, head1, net1 = proc(os.getpid()), proc(head), eth0_bytes(head)
            dt = time.monotonic() - t0

            def median(pids: list[int]) -> dict[str, float]:
                rows = [proc(p) for p in pids[:25]]
                return {
                    k: statistics.median(r[k] for r in rows) for k in ("rss_mib", "pss_mib", "threads", "fds")
                }

            result: dict[str, Any] = {
                "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                "hosts": args.hosts,
                "launcher_before": before,
                "launcher": me1,
                "launcher_idle_cpu_ms_per_s": 1000 * (me1["cpu_s"] - me0["cpu_s"]) / dt,
                "head": head1,
                "head_idle_cpu_ms_per_s": 1000 * (head1["cpu_s"] - head0["cpu_s"]) / dt,
                "head_host_bytes_per_s": (net1 - net0) / dt,
                "supervisor": median(sups),
                "node": median(nodes),
                "processes": {"supervisors": len(sups), "nodes": len(nodes)},
            }
        finally:
            run.stop()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    plots.plot_file(args.out, "footprint")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
