"""The launcher's own CPU per host: H SSH test hosts x 1 CourierNode, launch to the end of teardown (root).

    python bench/scale.py [--hosts 16 64 128 256] [--reps 3] [--baseline DIR] [--rsa] [--out bench/results/scale.json]

For each H: wall time and the launcher process's CPU time (its own and its
children's: ``ssh -G`` processes count) from ``launch()`` to every node
registered, and from ``stop()`` to nothing of the run left on any host, in
ms per host. With ``--baseline DIR`` (a tree holding another ``tlaunch/``
package, e.g. ``git archive main tlaunch | tar -x -C DIR``), the same
launches with that tlaunch, on the same hosts and in the same run,
alternating with this tree's. Each launch runs in a fresh Python process (its
first launch in that process is not counted: imports and key making). The
test hosts share this machine's cores with every host's sshd, tmux,
supervisor and node, so wall times grow with H here; the launcher's CPU is
the figure that carries over to real hosts. With ``--rsa``, the launcher
authenticates with a 3072-bit RSA key (``ssh-keygen``'s default before OpenSSH
9.5) instead of the test hosts' Ed25519 one. Medians; JSON and a plot.
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
ROOT = os.path.dirname(HERE)

INNER = r"""
import json, os, resource, sys, time
from tlaunch import lp_ssh as lp

class Pinger:
    def ping(self):
        return None

def cpu():
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

config, hosts = sys.argv[1], int(sys.argv[2])
for counted in (False, True):
    program = lp.Program(f"scale-{hosts}")
    for i in range(1, hosts + 1):
        program.add_node(lp.CourierNode(Pinger).to_host(f"th{i}"), label=f"p{i}")
    c0, t0 = cpu(), time.perf_counter()
    run = lp.launch(program, wait=False, ssh_config=config)
    if not run.wait_ready(timeout=600):  # one long poll, answered as the last node registers
        sys.exit(f"the run ended before every node was up: {run.stop_reason}")
    c1, t1 = cpu(), time.perf_counter()
    run.stop()
    c2, t2 = cpu(), time.perf_counter()
    if counted:
        print(json.dumps({"launch_s": t1 - t0, "stop_s": t2 - t1, "launch_cpu_s": c1 - c0,
                          "stop_cpu_s": c2 - c1, "phases": dict(run.launch_times)}))
"""


def one(path: str, config: str, hosts: int, timeout: float) -> dict[str, Any]:
    """One counted launch of ``hosts`` nodes with the tlaunch at ``path``, in a fresh process."""
    env = {**os.environ, "PYTHONPATH": path}
    try:
        done = subprocess.run(
            [sys.executable, "-c", INNER, config, str(hosts)],
            env=env, cwd=path, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        said = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        tail = " | ".join(said.strip().splitlines()[-5:])
        return {"error": f"no answer within {timeout:.0f} s: {tail[-800:]}"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        return {"error": tail[-600:]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def rsa_config(test_hosts: Any) -> str:
    """An ssh config for ``test_hosts`` naming a fresh 3072-bit RSA key, authorized on every host."""
    key = os.path.join(test_hosts.state_dir, "id_rsa")
    if not os.path.exists(key):
        subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "3072", "-N", "", "-f", key], check=True)
    with open(key + ".pub") as f:
        public = f.read()
    for host in test_hosts.hosts:
        with open(os.path.join(host.home, ".ssh", "authorized_keys"), "a") as f:
            f.write(public)
    with open(test_hosts.ssh_config) as f:
        text = f.read()
    path = os.path.join(test_hosts.state_dir, "ssh_config_rsa")
    with open(path, "w") as f:
        f.write(text.replace(test_hosts.client_key, key))
    return path


def plot(results: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, cases in results["variants"].items():
        hs = sorted(int(h) for h, c in cases.items() if "cpu_ms_per_host" in c)
        if not hs:
            continue
        ax.plot(hs, [cases[str(h)]["cpu_ms_per_host"] for h in hs], marker="o", label=name)
    ax.axhline(8.0, color="grey", linestyle="--", label="goal (8 ms/host)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("hosts (1 CourierNode each)")
    ax.set_ylabel("launcher CPU per host, launch + teardown (ms)")
    ax.set_title("tlaunch over SSH: the launcher's CPU per host")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[16, 64, 128, 256])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--baseline", help="a folder with another tlaunch/ package, measured alongside")
    parser.add_argument("--baseline-max-hosts", type=int, default=128, help="skip larger H for the baseline")
    parser.add_argument("--rsa", action="store_true", help="authenticate with a 3072-bit RSA key")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "scale.json"))
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    from trees import check_seen, interpreter

    from tlaunch.testing.hosts import SSHTestHosts, hosts_unavailable

    reason = hosts_unavailable()
    if reason:
        print(f"bench/scale.py: {reason}", file=sys.stderr)
        return 1
    variants = {"tlaunch": ROOT}
    if args.baseline:
        variants = {"before": os.path.abspath(args.baseline), **variants}
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {v: {} for v in variants}
    for hosts in args.hosts:
        with SSHTestHosts(hosts, also_expose=list(variants.values())) as test_hosts:
            for path in variants.values():  # a tree they do not see: they would run this checkout's
                check_seen(test_hosts, path)
            config = rsa_config(test_hosts) if args.rsa else test_hosts.ssh_config
            for _ in range(args.reps):
                for name, path in variants.items():
                    if name == "before" and hosts > args.baseline_max_hosts:
                        continue
                    got = one(path, config, hosts, timeout=60 + 3.0 * hosts)
                    raw[name].setdefault(str(hosts), []).append(got)
                    print(name, hosts, json.dumps(got)[:300], flush=True)
    med = statistics.median
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
        "key": "rsa-3072" if args.rsa else "ed25519",
        "interpreter": interpreter(),
        "variants": {},
        "raw": raw,
    }
    for name, by_hosts in raw.items():
        cases: dict[str, Any] = {}
        for h, samples in by_hosts.items():
            ok = [s for s in samples if "error" not in s]
            case: dict[str, Any] = {"runs": len(samples), "failed": len(samples) - len(ok)}
            if ok:
                n = int(h)
                case.update(
                    launch_s=med(s["launch_s"] for s in ok),
                    stop_s=med(s["stop_s"] for s in ok),
                    launch_cpu_ms_per_host=med(1000 * s["launch_cpu_s"] / n for s in ok),
                    stop_cpu_ms_per_host=med(1000 * s["stop_cpu_s"] / n for s in ok),
                    cpu_ms_per_host=med(1000 * (s["launch_cpu_s"] + s["stop_cpu_s"]) / n for s in ok),
                )
            cases[h] = case
        results["variants"][name] = cases
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    plot(results, os.path.splitext(args.out)[0] + ".png")
    for name, cases in results["variants"].items():
        for h, c in cases.items():
            print(name, h, {k: round(v, 2) if isinstance(v, float) else v for k, v in c.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
