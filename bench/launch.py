"""SSH launch benchmark on the namespace test hosts (needs root).

    python bench/launch.py [--reps 3] [--out bench/results/launch.json] [--exec-too]

For H = 1, 4, 16 hosts x 1 and 4 nodes per host: wall time from ``launch()``
to every node registered with the coordinator, and from ``stop()`` to nothing
of the run left on any host. The floor, measured in the same run: one fresh
OpenSSH handshake + ``true`` per host, all hosts in parallel. Also recorded:
the launcher's phases, the launcher process's CPU time and the whole
machine's CPU time during the launch (``cpu_bound_s`` = that / cores: the
launch can be no faster than this on this machine).

``--exec-too``: each case also with every node's first process exec'd rather
than forked from its supervisor (``TLAUNCH_FORK_NODES=0``), the two
alternating, as ``exec_*`` keys beside the default's.

``--baseline DIR`` (a folder holding another ``tlaunch/`` package, e.g.
``git archive COMMIT tlaunch | tar -x -C DIR``): only the ``--cases`` given
(default 16x1), each launch in a fresh process (its first launch there not
counted), this tree's and the baseline's alternating (the hosts run the
launcher's tlaunch: its folder goes on their ``PYTHONPATH``), as ``base_*``
keys beside this tree's. Beside the OpenSSH floor, each round also measures
the least launcher that runs a Python node on every host (``python_floor_*``,
:func:`python_floor`): what this machine allows a design like tlaunch's.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from trees import check_seen, interpreter

from tlaunch import lp_ssh as lp
from tlaunch.ssh import pmap
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


# A node of the least launcher (python_floor): an interpreter that imports what a tlaunch node
# needs at the least (ssl, cloudpickle), makes one TLS connection back and ends.
PYTHON_NODE = (
    "import socket, ssl, sys, cloudpickle\n"
    "c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)\n"
    "c.check_hostname = False\n"
    "c.load_verify_locations(sys.argv[1])\n"
    "c.load_cert_chain(sys.argv[1])\n"
    "s = c.wrap_socket(socket.create_connection((sys.argv[2], int(sys.argv[3]))))\n"
    "s.recv(1)\n"
)


def python_floor(hosts: SSHTestHosts, h: int) -> tuple[float, float]:
    """The least a launcher that runs a Python node on each host could take here.

    From one process, as tlaunch's launcher: an SSH connection (paramiko) and one
    exec a host, which starts a tmux session whose interpreter imports ssl and
    cloudpickle and makes one TLS connection back (no head, no supervisor, no
    files shipped, no checks). Returns the wall time from the first connection to
    the last TLS connection back, and the machine's CPU seconds meanwhile.
    """
    import shlex
    import socket
    import tempfile
    import threading

    from tlaunch.rpc.security import RunKeys
    from tlaunch.ssh import connect_all

    keys = RunKeys.generate()
    server = keys.context(server=True)
    folder = tempfile.mkdtemp(prefix="tlaunch-floor-", dir="/var/tmp")  # the hosts see /var/tmp
    pem = os.path.join(folder, "run.pem")
    with open(os.open(pem, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
        f.write(keys.cert_pem + keys.key_pem)
    bridge = hosts.bridge_address
    listener = socket.create_server((bridge, 0))
    port = listener.getsockname()[1]
    arrived: list[float] = []

    def accept() -> None:
        for _ in range(h):
            raw, _ = listener.accept()
            with server.wrap_socket(raw, server_side=True):
                arrived.append(time.perf_counter())

    taker = threading.Thread(target=accept, daemon=True)
    taker.start()
    c0, t0 = cpu_seconds(), time.perf_counter()
    conns = connect_all([f"th{i}" for i in range(1, h + 1)], ssh_config=hosts.ssh_config)
    try:
        session = f"floor-{os.urandom(3).hex()}"
        node = shlex.join([sys.executable, "-c", PYTHON_NODE, pem, bridge, str(port)])
        start = lambda host: conns[host].run(["tmux", "new-session", "-d", "-s", session, node])  # noqa: E731
        pmap(start, list(conns), conns)
        taker.join(60)
        wall, cpu = max(arrived) - t0, cpu_seconds() - c0
    finally:
        for conn in conns.values():
            conn.close()
        listener.close()
        os.unlink(pem)
        os.rmdir(folder)
    return wall, cpu


def cpu_seconds() -> float:
    """CPU seconds (user + system, all cores) this machine has spent since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields[:3]) + sum(fields[5:8])  # user nice system, irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def one_launch(hosts: SSHTestHosts, h: int, per_host: int, env: dict[str, str]) -> dict[str, float]:
    program = lp.Program(f"bench-{h}x{per_host}")
    with program.group("pinger"):
        for i in range(1, h + 1):
            for _ in range(per_host):
                program.add_node(lp.CourierNode(Pinger).to_host(f"th{i}"))
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    c0, t0 = cpu_seconds(), time.perf_counter()
    run = lp.launch(program, wait=False, ssh_config=hosts.ssh_config, env=env)
    returned = time.perf_counter() - t0
    # One long poll, answered as the last node registers (a tree without ``Run.wait_ready``,
    # before 2026-11-27: its status every 2 ms, each poll a call to the head).
    if hasattr(run, "wait_ready"):
        assert run.wait_ready(timeout=300), run.status()
    else:
        while not all(rec["address"] for rec in run.status().values()):
            time.sleep(0.002)
    launched = time.perf_counter() - t0
    cpu = cpu_seconds() - c0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    launcher_cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    phases = dict(run.launch_times)
    t1 = time.perf_counter()
    run.stop()  # returns once each host has confirmed its processes and tmux session gone
    return {
        "launch_s": launched,
        "teardown_s": time.perf_counter() - t1,
        "launch_returned_s": returned,
        "machine_cpu_s": cpu,
        "launcher_cpu_s": launcher_cpu,
        **{f"phase_{k}_s": v for k, v in phases.items()},
    }


CHILD = r"""
import json, os, sys, types
sys.path.insert(0, sys.argv[1])
import tlaunch
assert os.path.dirname(os.path.dirname(tlaunch.__file__)) == sys.argv[5], (tlaunch.__file__, sys.path)
from launch import one_launch
hosts = types.SimpleNamespace(ssh_config=sys.argv[2])
h, n = int(sys.argv[3]), int(sys.argv[4])
one_launch(hosts, h, n, {})  # not counted: imports, keys
print(json.dumps(one_launch(hosts, h, n, {})))
"""


def launch_in(tree: str, hosts: SSHTestHosts, h: int, per_host: int) -> dict[str, float]:
    """One counted launch with the tlaunch in ``tree``, in a fresh process."""
    env = {**os.environ, "PYTHONPATH": tree}
    argv = [sys.executable, "-c", CHILD, os.path.dirname(os.path.abspath(__file__)), hosts.ssh_config]
    done = subprocess.run(
        [*argv, str(h), str(per_host), tree],
        env=env, capture_output=True, text=True, timeout=300, check=True,
        # Not the checkout: `-c` puts the working directory first on sys.path (and on the hosts'
        # PYTHONPATH, which follows the launcher's), before the tree asked for. Until this was
        # found, a run from the checkout measured the checkout's tlaunch in both columns.
        cwd=os.path.dirname(tree),
    )  # fmt: skip
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def against(args: argparse.Namespace) -> None:
    """``--baseline``: this tree and the baseline, alternating, each launch in a fresh process."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"": here, "base_": os.path.abspath(args.baseline)}
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "cases": {}}
    results["baseline"] = trees["base_"]
    results["interpreter"] = interpreter()
    for tree in trees.values():  # a process that may write no bytecode would compile a tree anew
        compileall.compile_dir(os.path.join(tree, "tlaunch"), quiet=1)
    with SSHTestHosts(16, also_expose=list(trees.values())) as hosts:
        for tree in trees.values():  # a tree they do not see: they would run this checkout's
            check_seen(hosts, tree)
        for case in args.cases:
            h, per_host = (int(x) for x in case.split("x"))
            floors, least, samples = [], [], {v: [] for v in trees}  # type: ignore[var-annotated]
            for _ in range(args.reps):
                floors.append(openssh_floor(hosts, h))
                least.append(python_floor(hosts, h))
                for v, tree in trees.items():
                    samples[v].append(launch_in(tree, hosts, h, per_host))
            got: dict = {"hosts": h, "nodes_per_host": per_host, "openssh_floor_s": statistics.median(floors)}
            got["python_floor_s"] = statistics.median(w for w, _ in least)
            got["python_floor_machine_cpu_s"] = statistics.median(c for _, c in least)
            got["python_floor_ratio_to_floor"] = got["python_floor_s"] / got["openssh_floor_s"]
            for v, runs in samples.items():
                for key in runs[0]:
                    got[v + key] = statistics.median(s[key] for s in runs)
                got[v + "samples_launch_s"] = [s["launch_s"] for s in runs]
                got[v + "ratio_to_floor"] = got[v + "launch_s"] / got["openssh_floor_s"]
            results["cases"][case] = got
            print(json.dumps(got), flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    plot(results, os.path.splitext(args.out)[0] + ".png")


def plot(results: dict, path: str) -> None:
    """A PNG of ``results``: each case's launch against its OpenSSH floor (and, with
    ``--baseline``, the baseline tree and the least Python launcher), the goal at 1.2x the floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = results["cases"]
    fig, ax = plt.subplots(figsize=(7, 4))
    if "baseline" in results:
        bars = [
            ("OpenSSH floor", "openssh_floor_s", None),
            ("least Python launcher", "python_floor_s", None),
            ("baseline tree", "base_launch_s", "base_samples_launch_s"),
            ("this tree", "launch_s", "samples_launch_s"),
        ]
        bars = [b for b in bars if all(b[1] in c for c in cases.values())]  # older results lack some
        width = 0.8 / len(bars)
        for i, (label, key, samples) in enumerate(bars):
            xs = [j + (i - (len(bars) - 1) / 2) * width for j in range(len(cases))]
            ax.bar(xs, [c[key] for c in cases.values()], width, label=label)
            if samples and all(samples in c for c in cases.values()):
                for x, c in zip(xs, cases.values(), strict=True):
                    ax.plot([x] * len(c[samples]), c[samples], "k.", markersize=3)
        for j, c in enumerate(cases.values()):
            ax.hlines(1.2 * c["openssh_floor_s"], j - 0.45, j + 0.45, colors="grey", linestyles="--")
        ax.set_xticks(range(len(cases)), [f"{k} (hosts x nodes)" for k in cases])
        ax.set_title(
            "SSH launch to every node registered\n(medians; dots: rounds; dashes: the goal, 1.2x the floor)",
            fontsize=10,
        )
    else:
        for n in (1, 4):
            hs = [c["hosts"] for c in cases.values() if c["nodes_per_host"] == n]
            ax.plot(
                hs,
                [c["launch_s"] for c in cases.values() if c["nodes_per_host"] == n],
                "o-",
                label=f"{n}/host",
            )
        hs = sorted({c["hosts"] for c in cases.values()})
        floor = {c["hosts"]: c["openssh_floor_s"] for c in cases.values()}
        ax.plot(hs, [floor[h] for h in hs], "k--", label="OpenSSH floor")
        ax.plot(hs, [1.2 * floor[h] for h in hs], ":", color="grey", label="1.2x floor")
        ax.set_xlabel("hosts")
        ax.set_title("SSH launch to every node registered (medians)")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "launch.json"))
    parser.add_argument("--exec-too", action="store_true", help="also exec each node (no fork), alternating")
    parser.add_argument("--baseline", help="a folder with another tlaunch/ package, measured alongside")
    parser.add_argument("--cases", nargs="+", default=["16x1"], help="with --baseline: HOSTSxNODES")
    parser.add_argument("--replot", metavar="JSON", help="only draw the plot of results written before")
    args = parser.parse_args()
    if args.replot:
        with open(args.replot) as f:
            plot(json.load(f), os.path.splitext(args.replot)[0] + ".png")
        return None
    variants = {"": {}, "exec_": {"TLAUNCH_FORK_NODES": "0"}} if args.exec_too else {"": {}}
    reason = hosts_unavailable()
    if reason:
        raise SystemExit(f"bench/launch.py: {reason}")
    if args.baseline:
        return against(args)
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "cases": {}}
    results["interpreter"] = interpreter()
    with SSHTestHosts(16) as hosts:
        for h in (1, 4, 16):
            floor = statistics.median(openssh_floor(hosts, h) for _ in range(args.reps))
            for per_host in (1, 4):
                samples: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
                for _ in range(args.reps):
                    for v, env in variants.items():
                        samples[v].append(one_launch(hosts, h, per_host, env))
                case: dict = {"hosts": h, "nodes_per_host": per_host, "openssh_floor_s": floor}
                for v, got in samples.items():
                    for key in got[0]:
                        case[v + key] = statistics.median(s[key] for s in got)
                    # All cores busy for the whole launch would take this long: CPU is the bound
                    # where it is close to launch_s.
                    case[v + "cpu_bound_s"] = case[v + "machine_cpu_s"] / (os.cpu_count() or 1)
                results["cases"][f"{h}x{per_host}"] = case
                print(json.dumps(case), flush=True)
    c = results["cases"]
    results["ratio_launch_H16_over_H1"] = {
        n: c[f"16x{n}"]["launch_s"] / c[f"1x{n}"]["launch_s"] for n in (1, 4)
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    plot(results, os.path.splitext(args.out)[0] + ".png")
    print(json.dumps(results["ratio_launch_H16_over_H1"]))


if __name__ == "__main__":
    main()
