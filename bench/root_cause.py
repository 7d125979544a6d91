"""Root cause benchmark: a node is killed with SIGKILL while another sleeps; how soon does the launcher know?

    python bench/root_cause.py [--reps 5] [--reference-python PATH] [--out bench/results/root_cause.json]

For each case (local_mp; over SSH on 2 test hosts when they can be made), the
launcher runs in a process of its own: node ``victim`` prints its pid, node
``sleeper`` sleeps in ``time.sleep`` (it never looks at the stop). The bench
kills the victim with SIGKILL and records, from that moment:

* ``report_s``: the first line on the launcher's terminal naming the root
  cause (``victim/0`` and ``SIGKILL``);
* ``raised_s``: ``launch`` raising ``RunFailedError`` (the launcher prints
  ``RAISED`` the moment it catches it).

With ``--reference-python`` (an interpreter with another tlaunch installed, e.g.
a checkout before a change) the same cases run with it in the same run.
Medians of ``--reps``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import plots  # bench/plots.py, beside this script

LAUNCHER = """
import sys, time
from tlaunch import lp_ssh as lp

def victim():
    import os
    print("PID", os.getpid(), flush=True)
    time.sleep(1000)

def sleeper():
    time.sleep(1000)

hosts = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] else []
p = lp.Program("rootcause")
v = lp.PyNode(victim)
s = lp.PyNode(sleeper)
if hosts:
    v.to_host(hosts[0]); s.to_host(hosts[-1])
p.add_node(v, label="victim")
p.add_node(s, label="sleeper")
options = {"ssh_config": sys.argv[2]} if hosts else {}
try:
    lp.launch(p, **options)
except lp.RunFailedError:
    print("RAISED", flush=True)
"""


def one(python: str, hosts: list[str], ssh_config: str | None, script: str) -> dict[str, float] | None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.Popen(
        [python, script, ",".join(hosts), ssh_config or ""],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=os.path.dirname(script),  # no tlaunch checkout on the nodes' path by accident
    )
    assert proc.stdout is not None
    seen: dict[str, float] = {}
    pid: list[int] = []
    ready = threading.Event()
    t0 = [0.0]

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.perf_counter()
            if "PID" in line and not pid:
                pid.append(int(line.rsplit("PID", 1)[1].split()[0]))
                ready.set()
            elif t0[0] and "report_s" not in seen and "victim/0" in line and "SIGKILL" in line:
                seen["report_s"] = now - t0[0]
            if t0[0] and line.startswith("RAISED"):
                seen["raised_s"] = now - t0[0]
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not ready.wait(60) or not pid:
            return None
        time.sleep(0.5)  # every node is running
        t0[0] = time.perf_counter()
        os.kill(pid[0], 9)  # the test hosts share this machine's process table
        proc.wait(60)
        reader.join(5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return seen if "raised_s" in seen else None


def bench(python: str, reps: int, hosts: list[str], ssh_config: str | None, script: str) -> dict[str, object]:
    samples = [r for r in (one(python, hosts, ssh_config, script) for _ in range(reps)) if r]
    out: dict[str, object] = {"samples": samples}
    for key in ("report_s", "raised_s"):
        values = [s[key] for s in samples if key in s]
        out[f"{key}_median"] = statistics.median(values) if values else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--reference-python", default=None)
    parser.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "root_cause.json")
    )
    args = parser.parse_args()
    pythons = {"tlaunch": sys.executable}
    if args.reference_python:
        pythons["reference"] = args.reference_python
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cases": {}}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        script = os.path.join(tmp, "launcher.py")
        with open(script, "w") as f:
            f.write(LAUNCHER)
        for name, python in pythons.items():
            results["cases"][f"local_mp {name}"] = bench(python, args.reps, [], None, script)
            print(name, "local_mp", json.dumps(results["cases"][f"local_mp {name}"])[-120:], flush=True)
        from tlaunch.testing.hosts import SSHTestHosts, hosts_unavailable

        if hosts_unavailable() is None:
            expose = [os.path.dirname(os.path.dirname(p)) for p in pythons.values()] + [tmp]
            with SSHTestHosts(2, also_expose=expose) as hosts:
                for name, python in pythons.items():
                    case = bench(python, args.reps, ["th1", "th2"], hosts.ssh_config, script)
                    results["cases"][f"ssh {name}"] = case
                    print(name, "ssh", json.dumps(case)[-120:], flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    plots.plot_file(args.out, "root_cause")
    for case, r in results["cases"].items():
        print(f"{case:22s} report {r['report_s_median']}  raised {r['raised_s_median']}")


if __name__ == "__main__":
    main()
