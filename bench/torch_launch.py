"""Distributed PyTorch launch benchmark: tlaunch.torch against torchrunx, torchrun and bare processes.

    python bench/torch_launch.py [--reps 5] [--out bench/results/torch_launch.json]

(Not ``bench/torch.py``: local nodes see their launcher script's folder on
``sys.path``, and a ``torch.py`` there would shadow PyTorch in every worker.)

Same run, same workload (``bench/torch_workload.py``: a gloo all-reduce whose
result comes back to the launcher, or is printed by rank 0):

* ``1x2``: 2 workers on this machine: ``tlaunch.torch.launch``,
  ``torchrunx.Launcher.run`` (0.4.0), ``torchrun --standalone`` and two plain
  ``python`` processes with the rank environment set by hand (the floor);
* ``2x2``: 2 SSH test hosts x 2 workers (when test hosts can be made):
  tlaunch and torchrunx;
* ``raise``: rank 1 raises ``ValueError`` while rank 0 waits in a barrier;
  seconds from the raise to the launcher's exception: tlaunch, and torchrunx
  with ``worker_timeout=20`` and with its default (cut off at ``--cutoff``).

Medians of ``--reps``; the failure case of torchrunx's default runs once.

With ``--backend nccl`` (a GPU machine) only the launch on this machine is
measured, ``--workers`` ranks (default: one per GPU) each reducing on its own
GPU, against ``torchrun --standalone`` and plain processes (and torchrunx where
it is installed); a bar plot is drawn beside the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
LOAD = f"""
import importlib.util, sys, cloudpickle
_spec = importlib.util.spec_from_file_location("torch_workload", {os.path.join(HERE, "torch_workload.py")!r})
torch_workload = importlib.util.module_from_spec(_spec)
sys.modules["torch_workload"] = torch_workload
_spec.loader.exec_module(torch_workload)
cloudpickle.register_pickle_by_value(torch_workload)  # the workers cannot import bench/
"""


def _load_workload() -> Any:
    import importlib.util

    import cloudpickle

    spec = importlib.util.spec_from_file_location("torch_workload", os.path.join(HERE, "torch_workload.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["torch_workload"] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)  # the workers cannot import bench/
    return module


torch_workload = _load_workload()


SAFE = dict(os.environ)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plain(n: int = 2, backend: str = "gloo") -> None:
    port = str(free_port())
    procs = []
    for rank in range(n):
        env = dict(SAFE, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(n))
        env.update(LOCAL_RANK=str(rank))
        argv = [sys.executable, os.path.join(HERE, "torch_workload.py"), backend]
        procs.append(subprocess.Popen(argv, env=env))
    assert all(p.wait() == 0 for p in procs)


def torchrun(n: int = 2, backend: str = "gloo") -> None:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}"]
    subprocess.run(
        [*argv, os.path.join(HERE, "torch_workload.py"), backend], check=True, capture_output=True, env=SAFE
    )


def _launcher(code: str, cwd: str, timeout: float | None) -> tuple[str, str, bool]:
    """Run a launcher script in a session of its own (in ``cwd``: torchrunx logs to ``./torchrunx_logs``).

    Returns its stdout, stderr and whether it ran past ``timeout`` (then it and
    everything it started, its session, got SIGKILL).
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=cwd,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return out, err, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return out, err, True


def in_process(
    kind: str, hosts: list[str], ssh_config: str | None, log_dir: str, workers: int = 2, backend: str = "gloo"
) -> float:
    """Seconds of one launch call (tlaunch or torchrunx) to its result, in a fresh launcher process.

    Each launcher runs in a session of its own: torchrunx's launcher joins its
    agents' process group, and a failed launch may signal its process group.
    """
    code = (
        LOAD
        + f"""
import time
hosts, ssh_config, log_dir, n, backend = {hosts!r}, {ssh_config!r}, {log_dir!r}, {workers!r}, {backend!r}
if {kind!r} == "tlaunch":
    import tlaunch.torch
    start = time.perf_counter()
    result = tlaunch.torch.launch(torch_workload.allreduce, (backend,), hostnames=hosts, workers_per_host=n,
                                  backend=backend, ssh_config_file=ssh_config, log_dir=log_dir, echo_ranks=None)
else:
    import torchrunx
    start = time.perf_counter()
    result = torchrunx.Launcher(hostnames=hosts, workers_per_host=n, backend=backend,
                                ssh_config_file=ssh_config).run(torch_workload.allreduce, backend)
took = time.perf_counter() - start
assert result.rank(0) == sum(range(n * len(hosts))), result.rank(0)
print("TOOK", took, flush=True)
"""
    )
    out, err, _ = _launcher(code, log_dir, 300)
    found = re.search(r"TOOK ([\d.]+)", out)
    if not found:
        raise RuntimeError(f"{kind} on {hosts} failed:\n{(out + err)[-1500:]}")
    return float(found.group(1))


def raise_latency(kind: str, timeout: int, log_dir: str, cutoff: float | None = None) -> dict[str, Any]:
    """Seconds from rank 1's raise to the launcher's exception, and what it raised (a process of its own)."""
    stamp = os.path.join(log_dir, f"raised-{time.time_ns()}")
    code = (
        LOAD
        + f"""
import time
try:
    if {kind!r} == "tlaunch":
        import tlaunch.torch
        tlaunch.torch.launch(torch_workload.raise_at_rank1, ({stamp!r},), hostnames=["localhost"],
                             workers_per_host=2, backend="gloo", log_dir={log_dir!r}, echo_ranks=None)
    else:
        import torchrunx
        torchrunx.Launcher(hostnames=["localhost"], workers_per_host=2, backend="gloo",
                           worker_timeout={timeout}).run(torch_workload.raise_at_rank1, {stamp!r})
except BaseException as exc:
    print("CAUGHT", time.time(), type(exc).__name__, flush=True)
"""
    )
    out, err, timed_out = _launcher(code, log_dir, cutoff)
    if timed_out:
        return {"seconds": None, "raised": f"nothing within {cutoff:.0f} s"}
    caught = re.search(r"CAUGHT ([\d.]+) (\S+)", out)
    if not caught or not os.path.exists(stamp):
        raise RuntimeError(f"{kind}: no exception seen:\n{(out + err)[-2000:]}")
    with open(stamp) as f:
        raised = float(f.read())
    return {"seconds": float(caught.group(1)) - raised, "raised": caught.group(2)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--cutoff", type=float, default=90.0, help="seconds to wait for torchrunx's default")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "torch_launch.json"))
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--workers", type=int, help="ranks on this machine (default: 2; nccl: one per GPU)")
    args = parser.parse_args()
    import importlib.util
    import tempfile

    log_dir = tempfile.mkdtemp(prefix="tlaunch-bench-torch-")
    results: dict[str, Any] = {"reps": args.reps, "python": sys.version.split()[0], "backend": args.backend}
    import torch

    results["torch"] = torch.__version__
    n = args.workers or (torch.cuda.device_count() if args.backend == "nccl" else 2)
    if args.backend == "nccl":
        if n < 1 or n > torch.cuda.device_count():
            sys.exit(f"--backend nccl needs a GPU a rank: {n} ranks, {torch.cuda.device_count()} GPUs here")
        results["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    cases: dict[str, Callable[[], float]] = {
        "plain": lambda: timed(lambda: plain(n, args.backend)),
        "torchrun_standalone": lambda: timed(lambda: torchrun(n, args.backend)),
        "torchrunx": lambda: in_process("torchrunx", ["localhost"], None, log_dir, n, args.backend),
        "tlaunch": lambda: in_process("tlaunch", ["localhost"], None, log_dir, n, args.backend),
    }
    if importlib.util.find_spec("torchrunx") is None:
        del cases["torchrunx"]
        results["skipped"] = ["torchrunx: not installed"]
    one: dict[str, list[float]] = {k: [] for k in cases}
    errors: dict[str, list[str]] = {}
    key = f"1x{n}"
    for _ in range(args.reps):  # interleaved: a noisy moment hits every case alike
        for name, fn in cases.items():
            try:
                one[name].append(fn())
            except Exception as exc:  # counted and said, not hidden
                errors.setdefault(f"{key} {name}", []).append(str(exc)[-300:])
    results[key] = {k: {"median_s": statistics.median(v), "runs_s": v} for k, v in one.items() if v}
    for ref in ("torchrunx", "torchrun_standalone", "plain"):
        if one.get(ref) and one["tlaunch"]:
            results[key][f"tlaunch_vs_{ref}"] = statistics.median(one["tlaunch"]) / statistics.median(
                one[ref]
            )
    print(json.dumps(results[key], indent=1), flush=True)
    if args.backend != "gloo":  # the SSH hosts and the raise case are gloo's (CPU) measures
        results["errors"] = errors
        _write(results, args.out)
        _plot(results[key], f"launch to every rank's result, 1 host x {n} ({args.backend})", args.out)
        return

    from tlaunch.testing.hosts import SSHTestHosts, hosts_unavailable

    if hosts_unavailable() is None:
        with SSHTestHosts(2) as hosts:
            names = [h.name for h in hosts.hosts]
            two: dict[str, list[float]] = {"tlaunch": [], "torchrunx": []}
            for _ in range(args.reps):
                for name, times in two.items():
                    try:
                        times.append(in_process(name, names, hosts.ssh_config, log_dir))
                    except Exception as exc:
                        errors.setdefault(f"2x2 {name}", []).append(str(exc)[-300:])
            results["2x2"] = {k: {"median_s": statistics.median(v), "runs_s": v} for k, v in two.items() if v}
            print(json.dumps(results["2x2"], indent=1), flush=True)
    results["errors"] = errors

    fail: dict[str, list[dict[str, Any]]] = {
        "tlaunch": [raise_latency("tlaunch", 0, log_dir) for _ in range(args.reps)],
        "torchrunx_worker_timeout_20": [raise_latency("torchrunx", 20, log_dir) for _ in range(2)],
        "torchrunx_default": [raise_latency("torchrunx", 600, log_dir, args.cutoff)],
    }
    results["raise"] = {}
    for name, runs in fail.items():
        secs = [r["seconds"] for r in runs if r["seconds"] is not None]
        results["raise"][name] = {
            "median_s": statistics.median(secs) if secs else None,
            "raised": sorted({r["raised"] for r in runs}),
            "runs_s": [r["seconds"] for r in runs],
        }
    results["raise"]["cutoff_s"] = args.cutoff
    print(json.dumps(results["raise"], indent=1), flush=True)
    _write(results, args.out)


def _write(results: dict[str, Any], out: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {out}")


def _plot(cases: dict[str, Any], title: str, out: str) -> None:
    """A bar of each case's median beside ``out`` (``.png``), its runs as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k, v in cases.items() if isinstance(v, dict)]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(names, [cases[k]["median_s"] for k in names], color="tab:blue", alpha=0.6)
    for i, k in enumerate(names):
        ax.plot([i] * len(cases[k]["runs_s"]), cases[k]["runs_s"], "k.", markersize=4)
    ax.set_ylabel("seconds (median; runs as points)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.splitext(out)[0] + ".png", dpi=110)


if __name__ == "__main__":
    main()
