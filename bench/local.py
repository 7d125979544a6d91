"""Local benchmark: tlaunch against dm-launchpad 0.5.2, same program, same run.

    python bench/local.py [--launchpad-python PATH] [--reps 3] [--only launch|rpc|futures]
                          [--before COMMIT] [--out bench/results/local.json]

Measures, for each implementation: launch of N = 1, 8, 32 local_mp nodes to the
first reply from each; sync no-op RPC latency; calls/s with 8 futures, in two
patterns (8 kept in flight; Launchpad's consumer pattern: send 8, wait for the
batch, repeat) and the CPU time both processes spend per call; 1, 64 and 256 MiB
round trips. The program is bench/local_program.py, run unchanged by both (only
its import differs). The RPC runs alternate between the implementations, so
that both see the same load of a shared machine; ``--before`` adds tlaunch at an
earlier commit to every part. Results are medians; ratios are computed within this run. Build the reference with bench/make_launchpad_env.sh.
"""

from __future__ import annotations

import argparse
import contextlib
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
PROGRAM = os.path.join(HERE, "local_program.py")


# Implementations other than this tree's tlaunch and dm-launchpad: tlaunch at an earlier
# commit (--before), name -> the folder holding its tlaunch/ package.
TREES: dict[str, str] = {}


def run_program(python: str, impl: str, args: list[str], timeout: float) -> dict | None:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        kind = "launchpad" if impl == "launchpad" else "tlaunch"
        path = TREES.get(impl, ROOT)
        env = {**os.environ, "BENCH_IMPL": kind, "PYTHONPATH": path, "LAUNCHPAD_LOGGING_DIR": tmp}
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                [python, PROGRAM, *args, out],
                env=env,
                cwd=tmp,
                timeout=timeout,
                check=False,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        if not os.path.exists(out):
            return None
        with open(out) as f:
            return json.load(f)


def python_version(python: str) -> str:
    return subprocess.run([python, "--version"], capture_output=True, text=True, check=False).stdout.strip()


def bench_launch(python: str, impl: str, reps: int) -> dict:
    launch = {}
    for n in (1, 8, 32):
        times = []
        for _ in range(reps):
            r = run_program(python, impl, ["launch", str(n)], timeout=300)
            if r:
                times.append(r["launch_s"])
        launch[str(n)] = {"median_s": statistics.median(times) if times else None, "samples_s": times}
        print(f"  {impl}: launch N={n}: {launch[str(n)]['median_s']}", flush=True)
    return launch


_FUTURES = (
    "latency_us_median",
    "calls_per_s_8_futures",
    "calls_per_s_batch_8",
    "cpu_us_per_call_8_futures",
    "cpu_us_per_call_batch_8",
)


def bench_rpc(impls: dict[str, str], reps: int, mode: str) -> dict[str, dict]:
    """The RPC measurements (``mode``: rpc, or futures alone), implementations alternating."""
    runs: dict[str, list[dict]] = {impl: [] for impl in impls}
    for rep in range(reps):
        for impl, python in impls.items():
            r = run_program(python, impl, [mode], timeout=400)
            if r:
                runs[impl].append(r)
                print(f"  rep {rep + 1}: {impl}: " + ", ".join(f"{k} {r[k]:.1f}" for k in _FUTURES if k in r))
    out: dict[str, dict] = {}
    for impl, rs in runs.items():
        result: dict = {}
        if rs:
            for key in _FUTURES:
                values = [r[key] for r in rs if key in r]
                if values:
                    result[key] = statistics.median(values)
                    result[f"{key}_samples"] = values
            bulk = {}
            for key in rs[0].get("bulk", {}):
                vals = [r["bulk"][key]["MiB_per_s"] for r in rs if key in r.get("bulk", {})]
                bulk[key] = statistics.median(vals)
            if bulk:
                result["bulk_MiB_per_s"] = bulk
        out[impl] = result
    return out


def ratios(t: dict, lp: dict) -> dict:
    out: dict = {}
    for n in ("1", "8", "32"):
        a = t.get("launch", {}).get(n, {}).get("median_s")
        b = lp.get("launch", {}).get(n, {}).get("median_s")
        if a and b:
            out[f"launch_N{n}_time_fraction_of_launchpad"] = a / b
    if "latency_us_median" in lp and "latency_us_median" in t:
        out["latency_fraction_of_launchpad"] = t["latency_us_median"] / lp["latency_us_median"]
        out["throughput_x_launchpad"] = t["calls_per_s_8_futures"] / lp["calls_per_s_8_futures"]
        out["throughput_batch_8_x_launchpad"] = t["calls_per_s_batch_8"] / lp["calls_per_s_batch_8"]
        out["cpu_per_call_fraction_of_launchpad"] = (
            t["cpu_us_per_call_8_futures"] / lp["cpu_us_per_call_8_futures"]
        )
        out["cpu_per_call_batch_8_fraction_of_launchpad"] = (
            t["cpu_us_per_call_batch_8"] / lp["cpu_us_per_call_batch_8"]
        )
        for key, v in lp.get("bulk_MiB_per_s", {}).items():
            out[f"bulk_{key}_x_launchpad"] = t["bulk_MiB_per_s"][key] / v
            # dm-launchpad hangs on numpy arguments: its bytes figure is the only reference.
            numpy_key = key.replace("bytes_", "numpy_")
            if numpy_key in t["bulk_MiB_per_s"]:
                out[f"bulk_{numpy_key}_x_launchpad_bytes"] = t["bulk_MiB_per_s"][numpy_key] / v
    return out


def plot(results: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    impls = [k for k in ("tlaunch", "tlaunch-before", "launchpad") if k in results["implementations"]]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    ns = ["1", "8", "32"]
    for impl in impls:
        r = results["implementations"][impl]
        if "launch" in r:
            axes[0].plot(
                [int(n) for n in ns], [r["launch"][n]["median_s"] or 0 for n in ns], "o-", label=impl
            )
    axes[0].set(title="launch to first reply from every node", xlabel="nodes", ylabel="seconds")
    axes[0].legend()
    axes[1].bar(impls, [results["implementations"][i].get("latency_us_median", 0) for i in impls])
    axes[1].set(title="sync no-op RPC latency (median)", ylabel="microseconds")
    patterns = (("calls_per_s_8_futures", "8 in flight"), ("calls_per_s_batch_8", "batches of 8"))
    bar = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        r = results["implementations"][impl]
        axes[3].bar([k + j * bar for k in range(2)], [r.get(key, 0) for key, _ in patterns], bar, label=impl)
    axes[3].set_xticks([0.4 - bar / 2, 1.4 - bar / 2], [label for _, label in patterns])
    axes[3].set(title="futures: calls/s", ylabel="calls/s")
    axes[3].legend()
    sizes = ["1MiB", "64MiB", "256MiB"]
    series = [(impl, kind) for impl in impls for kind in ("bytes", "numpy")]
    series = [
        (i, k) for i, k in series if f"{k}_1MiB" in results["implementations"][i].get("bulk_MiB_per_s", {})
    ]
    width = 0.8 / max(1, len(series))
    for j, (impl, kind) in enumerate(series):
        bulk = results["implementations"][impl]["bulk_MiB_per_s"]
        axes[2].bar(
            [i + j * width for i in range(len(sizes))],
            [bulk.get(f"{kind}_{n}", 0) for n in sizes],
            width,
            label=f"{impl} {kind}",
        )
    axes[2].set_xticks([i + 0.4 - width / 2 for i in range(len(sizes))], ["1 MiB", "64 MiB", "256 MiB"])
    axes[2].set(title="round trip (payload / round-trip time)", ylabel="MiB/s")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launchpad-python", default=os.path.join(HERE, ".lp-venv", "bin", "python"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", choices=("launch", "rpc", "futures"), help="one part only")
    parser.add_argument("--before", help="also run tlaunch at this commit (tlaunch-before)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "local.json"))
    args = parser.parse_args()
    load_at_start = os.getloadavg()
    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_at_start": load_at_start,
        },
        "implementations": {},
    }
    with tempfile.TemporaryDirectory(prefix="tlaunch-bench-before-") as tmp:
        impls = {"tlaunch": sys.executable}
        if args.before:
            git = ["git", "-C", ROOT, "archive", args.before, "tlaunch"]
            archive = subprocess.run(git, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            TREES["tlaunch-before"] = tmp
            impls["tlaunch-before"] = sys.executable
        if os.path.exists(args.launchpad_python):
            impls["launchpad"] = args.launchpad_python
        else:
            results["launchpad_missing"] = (
                f"{args.launchpad_python} not found: run bench/make_launchpad_env.sh"
            )
        for impl, python in impls.items():
            results["implementations"][impl] = {"python": python_version(python)}
        if args.before:
            results["implementations"]["tlaunch-before"]["commit"] = args.before
        if args.only in (None, "launch"):
            for impl, python in impls.items():
                print(f"{impl}: launch", flush=True)
                results["implementations"][impl]["launch"] = bench_launch(python, impl, args.reps)
        if args.only in (None, "rpc", "futures"):
            print("RPC, the implementations alternating:", flush=True)
            for impl, r in bench_rpc(impls, args.reps, args.only or "rpc").items():
                results["implementations"][impl].update(r)
        if args.only in (None, "rpc"):
            for impl, python in impls.items():
                numpy = run_program(python, impl, ["numpy"], timeout=120)
                results["implementations"][impl]["numpy_argument_round_trips"] = bool(
                    numpy and numpy.get("numpy_arg_ok")
                )
    if "launchpad" in impls:
        found = results["implementations"]
        results["ratios"] = ratios(found["tlaunch"], found["launchpad"])
        if args.before:
            results["ratios_before"] = ratios(found["tlaunch-before"], found["launchpad"])
    results["machine"]["load_at_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    if args.only is None:
        plot(results, os.path.splitext(args.out)[0] + ".png")
    print(json.dumps(results.get("ratios", {}), indent=2))


if __name__ == "__main__":
    main()
