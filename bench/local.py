"""Local benchmark: tlaunch against dm-launchpad 0.5.2, same program, same run.

    python bench/local.py [--launchpad-python PATH] [--reps 3] [--out bench/results/local.json]

Measures, for each implementation: launch of N = 1, 8, 32 local_mp nodes to the
first reply from each; sync no-op RPC latency; calls/s with 8 futures in flight;
1, 64 and 256 MiB round trips. The program is bench/local_program.py, run
unchanged by both (only its import differs). Results are medians; ratios are
computed within this run. Build the reference with bench/make_launchpad_env.sh.
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


def run_program(python: str, impl: str, args: list[str], timeout: float) -> dict | None:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        env = {**os.environ, "BENCH_IMPL": impl, "PYTHONPATH": ROOT, "LAUNCHPAD_LOGGING_DIR": tmp}
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


def bench_impl(python: str, impl: str, reps: int) -> dict:
    result: dict = {
        "python": subprocess.run(
            [python, "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
    }
    launch = {}
    for n in (1, 8, 32):
        times = []
        for _ in range(reps):
            r = run_program(python, impl, ["launch", str(n)], timeout=300)
            if r:
                times.append(r["launch_s"])
        launch[str(n)] = {"median_s": statistics.median(times) if times else None, "samples_s": times}
        print(f"  {impl}: launch N={n}: {launch[str(n)]['median_s']}", flush=True)
    result["launch"] = launch
    rpc_runs = [r for r in (run_program(python, impl, ["rpc"], timeout=400) for _ in range(reps)) if r]
    if rpc_runs:
        result["latency_us_median"] = statistics.median(r["latency_us_median"] for r in rpc_runs)
        result["calls_per_s_8_futures"] = statistics.median(r["calls_per_s_8_futures"] for r in rpc_runs)
        bulk = {}
        for key in rpc_runs[0]["bulk"]:
            vals = [r["bulk"][key]["MiB_per_s"] for r in rpc_runs if key in r.get("bulk", {})]
            bulk[key] = statistics.median(vals)
        result["bulk_MiB_per_s"] = bulk
    print(f"  {impl}: rpc: {json.dumps({k: v for k, v in result.items() if k != 'launch'})}", flush=True)
    numpy = run_program(python, impl, ["numpy"], timeout=120)
    result["numpy_argument_round_trips"] = bool(numpy and numpy.get("numpy_arg_ok"))
    return result


def ratios(t: dict, lp: dict) -> dict:
    out: dict = {}
    for n in ("1", "8", "32"):
        a, b = t["launch"][n]["median_s"], lp["launch"][n]["median_s"]
        if a and b:
            out[f"launch_N{n}_time_fraction_of_launchpad"] = a / b
    if "latency_us_median" in lp:
        out["latency_fraction_of_launchpad"] = t["latency_us_median"] / lp["latency_us_median"]
        out["throughput_x_launchpad"] = t["calls_per_s_8_futures"] / lp["calls_per_s_8_futures"]
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
    impls = [k for k in ("tlaunch", "launchpad") if k in results["implementations"]]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ns = ["1", "8", "32"]
    for impl in impls:
        r = results["implementations"][impl]
        axes[0].plot([int(n) for n in ns], [r["launch"][n]["median_s"] or 0 for n in ns], "o-", label=impl)
    axes[0].set(title="launch to first reply from every node", xlabel="nodes", ylabel="seconds")
    axes[0].legend()
    axes[1].bar(impls, [results["implementations"][i].get("latency_us_median", 0) for i in impls])
    axes[1].set(title="sync no-op RPC latency (median)", ylabel="microseconds")
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
    parser.add_argument("--out", default=os.path.join(HERE, "results", "local.json"))
    args = parser.parse_args()
    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "implementations": {},
    }
    print("tlaunch:", flush=True)
    results["implementations"]["tlaunch"] = bench_impl(sys.executable, "tlaunch", args.reps)
    if os.path.exists(args.launchpad_python):
        print("dm-launchpad 0.5.2:", flush=True)
        results["implementations"]["launchpad"] = bench_impl(args.launchpad_python, "launchpad", args.reps)
        results["ratios"] = ratios(
            results["implementations"]["tlaunch"], results["implementations"]["launchpad"]
        )
    else:
        results["launchpad_missing"] = f"{args.launchpad_python} not found: run bench/make_launchpad_env.sh"
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    plot(results, os.path.splitext(args.out)[0] + ".png")
    print(json.dumps(results.get("ratios", {}), indent=2))


if __name__ == "__main__":
    main()
