"""The benchmark program, runnable unchanged under tlaunch and dm-launchpad.

    BENCH_IMPL=tlaunch|launchpad python bench/local_program.py launch N OUT
    BENCH_IMPL=tlaunch|launchpad python bench/local_program.py rpc|futures OUT

Only the import differs between the two implementations.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time

import numpy as np

if os.environ.get("BENCH_IMPL") == "launchpad":
    import launchpad as lp
else:
    from tlaunch import lp_ssh as lp


class Pinger:
    def ping(self) -> None:
        return None

    def echo(self, x: object) -> object:
        return x

    def pid(self) -> int:
        return os.getpid()


def _cpu_s(pid: int) -> float:
    """CPU time (user + system) of process ``pid`` so far, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def probe(handles: list, out: str, t0: float) -> None:
    futures = [h.futures.ping() for h in handles]
    for f in futures:
        f.result()
    with open(out, "w") as f:
        json.dump({"launch_s": time.time() - t0}, f)
    lp.stop()


def _median_s(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _continuous_8(server, seconds: float) -> float:
    """calls/s keeping 8 futures in flight: a new call as soon as the oldest completes."""
    done = 0
    t0 = time.perf_counter()
    t_end = t0 + seconds
    window = [server.futures.ping() for _ in range(8)]
    while time.perf_counter() < t_end:
        window.pop(0).result()
        done += 1
        window.append(server.futures.ping())
    for f in window:
        f.result()
        done += 1
    return done / (time.perf_counter() - t0)


def _batch_8(server, seconds: float) -> float:
    """calls/s in Launchpad's consumer pattern: send 8 futures, wait for all 8, repeat."""
    done = 0
    t0 = time.perf_counter()
    t_end = t0 + seconds
    while time.perf_counter() < t_end:
        futures = [server.futures.ping() for _ in range(8)]
        for f in futures:
            f.result()
        done += 8
    return done / (time.perf_counter() - t0)


def measure(server, out: str, numpy_args: bool, bulk_too: bool = True) -> None:
    result: dict[str, object] = {}
    for _ in range(200):
        server.ping()
    lat = []
    for _ in range(3000):
        t = time.perf_counter()
        server.ping()
        lat.append(time.perf_counter() - t)
    lat.sort()
    result["latency_us_median"] = lat[len(lat) // 2] * 1e6
    result["latency_us_p99"] = lat[int(len(lat) * 0.99)] * 1e6

    # calls/s with 8 futures in flight, 3 s of each pattern, alternating the two patterns in
    # 0.5 s slices so that both see the same load of the machine; and the CPU time both
    # processes spent per call (what a loaded machine's throughput depends on)
    pids = (os.getpid(), server.pid())
    rates: dict[str, list[float]] = {"continuous": [], "batch": []}
    cpu = {"continuous": 0.0, "batch": 0.0}
    calls = {"continuous": 0.0, "batch": 0.0}
    for _ in range(6):
        for name, pattern in (("continuous", _continuous_8), ("batch", _batch_8)):
            cpu0, t0 = sum(_cpu_s(p) for p in pids), time.perf_counter()
            rate = pattern(server, 0.5)
            calls[name] += rate * (time.perf_counter() - t0)
            cpu[name] += sum(_cpu_s(p) for p in pids) - cpu0
            rates[name].append(rate)
    result["calls_per_s_8_futures"] = statistics.median(rates["continuous"])
    result["calls_per_s_batch_8"] = statistics.median(rates["batch"])
    result["cpu_us_per_call_8_futures"] = cpu["continuous"] / calls["continuous"] * 1e6
    result["cpu_us_per_call_batch_8"] = cpu["batch"] / calls["batch"] * 1e6
    if not bulk_too:
        with open(out, "w") as f:
            json.dump(result, f)
        lp.stop()
        return

    bulk = {}
    for mib in (1, 64, 256):
        payload = bytes(mib << 20)
        reps = 5 if mib < 256 else 3
        s = _median_s(lambda p=payload: server.echo(p), reps)
        bulk[f"bytes_{mib}MiB"] = {"round_trip_s": s, "MiB_per_s": mib / s}
        if numpy_args:
            arr = np.ones(mib << 18, dtype=np.float32)
            s = _median_s(lambda a=arr: server.echo(a), reps)
            bulk[f"numpy_{mib}MiB"] = {"round_trip_s": s, "MiB_per_s": mib / s}
        with open(out, "w") as f:  # partial results survive a hang later on
            json.dump({**result, "bulk": bulk}, f)
    result["bulk"] = bulk
    with open(out, "w") as f:
        json.dump(result, f)
    lp.stop()


def numpy_probe(server, out: str) -> None:
    """Whether a numpy argument round-trips within 20 s."""
    box: dict[str, object] = {}

    def call() -> None:
        box["value"] = server.echo(np.arange(10))

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(20)
    with open(out, "w") as f:
        json.dump({"numpy_arg_ok": "value" in box}, f)
    lp.stop()


def _launch(program) -> None:
    kwargs = {"launch_type": "local_mp", "terminal": "output_to_files"}
    run = lp.launch(program, **kwargs)
    if hasattr(run, "wait"):
        run.wait()


def main(argv: list[str]) -> None:
    mode = argv[1]
    program = lp.Program("bench")
    if mode == "launch":
        n, out = int(argv[2]), argv[3]
        t0 = time.time()
        with program.group("pinger"):
            handles = [program.add_node(lp.CourierNode(Pinger)) for _ in range(n)]
        program.add_node(lp.PyNode(probe, handles, out, t0), label="probe")
    elif mode in ("rpc", "futures", "numpy"):
        out = argv[2]
        server = program.add_node(lp.CourierNode(Pinger), label="server")
        if mode in ("rpc", "futures"):
            numpy_ok = os.environ.get("BENCH_IMPL") != "launchpad"
            program.add_node(lp.PyNode(measure, server, out, numpy_ok, mode == "rpc"), label="measure")
        else:
            program.add_node(lp.PyNode(numpy_probe, server, out), label="measure")
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    _launch(program)


if __name__ == "__main__":
    main(sys.argv)
