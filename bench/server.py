"""Job server benchmark: its API under 50 concurrent clients, SQLite and PostgreSQL side by side.

    python bench/server.py [--clients 50] [--seconds 30] [--jobs 5] [--out bench/results/server.json]

For each database (SQLite; PostgreSQL when Debian's is installed, started
privately by tlaunch.testing.postgres), a real server process on 127.0.0.1:
``--jobs`` jobs are submitted (each a real run: one trainer on this machine),
then ``--clients`` threads call ``GET /v1/jobs``, ``GET /v1/jobs/<name>``,
``POST /v1/trainer/job`` (a new name each time, for a package that does not
exist: the whole submit path up to the package check, without starting a
process per request) and the dashboard's ``GET /v1/runs`` for ``--seconds``; requests/s, p50 and p99 latency and
the errors (any 5xx, or a transport error) are reported. Then the time from
``POST`` to the job's first log line is measured against a plain ``tlaunch
basic`` launch of the same script, ``--reps`` times each, in the same run.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from typing import Any

import httpx
import plots  # bench/plots.py, beside this script

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOKEN = "bench-token-0123456789abcdef"
TRAINER = 'import os\nprint("first line from rank", os.environ["RANK"], flush=True)\n'


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, home: str, db: str | None) -> None:
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "tlaunch.server", "--port", str(self.port), "--home", home]
        if db:
            argv += ["--db", db]
        env = {**os.environ, "TLAUNCH_SERVER_TOKEN": TOKEN, "PYTHONPATH": ROOT}
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("the server did not start")
            time.sleep(0.1)

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _package() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("train.py", TRAINER)
    return buf.getvalue()


def _first_line_via_server(c: httpx.Client, pkg: str, name: str) -> float:
    t0 = time.perf_counter()
    r = c.post("/v1/trainer/job", json={"job_name": name, "trainer_package": pkg})
    r.raise_for_status()
    with c.stream("GET", f"/v1/jobs/{name}/logs", params={"follow": "true"}) as s:
        for line in s.iter_lines():
            if line.startswith("data: ") and "first line from rank" in line:
                return time.perf_counter() - t0
    raise RuntimeError(f"job {name} printed nothing")


def _first_line_plain(folder: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tlaunch.cli.main", "basic", "--num-trainer", "1", "train.py"],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if "first line from rank" in line:
                return time.perf_counter() - t0
        raise RuntimeError("the plain launch printed nothing")
    finally:
        proc.wait(60)
        proc.stdout.close()


def _load(server: Server, names: list[str], clients: int, seconds: float) -> dict[str, Any]:
    latencies: dict[str, list[float]] = {"list": [], "status": [], "submit": [], "runs": []}
    errors: list[str] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def worker(i: int) -> None:
        n = 0
        with server.client() as c:
            while time.monotonic() < stop_at:
                kind = ("list", "status", "submit", "runs")[n % 4]
                t0 = time.perf_counter()
                try:
                    if kind == "list":
                        r = c.get("/v1/jobs", params={"limit": 20})
                    elif kind == "status":
                        r = c.get(f"/v1/jobs/{names[n % len(names)]}")
                    elif kind == "runs":
                        r = c.get("/v1/runs", params={"limit": 20})
                    else:
                        body = {"job_name": f"load-{i}-{n}", "trainer_package": "0" * 64}
                        r = c.post("/v1/trainer/job", json=body)
                    ok = r.status_code < 500 and (kind == "submit" or r.status_code == 200)
                    if not ok:
                        with lock:
                            errors.append(f"{kind}: {r.status_code}")
                except httpx.TransportError as exc:
                    with lock:
                        errors.append(f"{kind}: {exc}")
                with lock:
                    latencies[kind].append(time.perf_counter() - t0)
                n += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    total = sum(len(v) for v in latencies.values())
    out: dict[str, Any] = {"requests": total, "requests_per_s": total / elapsed, "errors": len(errors)}
    out["error_samples"] = errors[:5]
    for kind, values in latencies.items():
        values.sort()
        if values:
            out[kind] = {
                "n": len(values),
                "p50_ms": 1000 * values[len(values) // 2],
                "p99_ms": 1000 * values[min(len(values) - 1, int(len(values) * 0.99))],
            }
    return out


def bench_db(label: str, db: str | None, args: argparse.Namespace, folder: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as home:
        server = Server(home, db)
        try:
            with server.client() as c:
                pkg = c.post("/v1/package", content=_package()).json()["package_id"]
                names = []
                for i in range(args.jobs):
                    name = f"seed-{i}"
                    c.post(
                        "/v1/trainer/job", json={"job_name": name, "trainer_package": pkg}
                    ).raise_for_status()
                    names.append(name)
                result = {"db": label, "load": _load(server, names, args.clients, args.seconds)}
                via_server, plain = [], []
                for rep in range(args.reps):
                    via_server.append(_first_line_via_server(c, pkg, f"first-{rep}"))
                    plain.append(_first_line_plain(folder))
                result["post_to_first_log_s"] = statistics.median(via_server)
                result["plain_launch_to_first_log_s"] = statistics.median(plain)
                result["ratio"] = result["post_to_first_log_s"] / result["plain_launch_to_first_log_s"]
                deadline = time.monotonic() + 60  # the jobs end before the server goes
                while any(j["state"] not in ("SUCCEEDED", "FAILED", "STOPPED", "LOST")
                          for j in c.get("/v1/jobs", params={"limit": 500}).json()["jobs"]):  # fmt: skip
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
            return result
        finally:
            server.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--jobs", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default=os.path.join(HERE, "results", "server.json"))
    args = p.parse_args()
    sys.path.insert(0, ROOT)
    from tlaunch.testing.postgres import PostgresTestServer, postgres_bin

    results = {"machine": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()}
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "train.py"), "w") as f:
            f.write(TRAINER)
        runs = [bench_db("sqlite", None, args, folder)]
        if postgres_bin() is not None:
            with PostgresTestServer() as pg:
                runs.append(bench_db("postgres", pg.create_database("bench"), args, folder))
    results["runs"] = runs
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    plots.plot_file(args.out, "server")
    for r in runs:
        load = r["load"]
        print(
            f"{r['db']:8} {load['requests_per_s']:7.1f} req/s, errors {load['errors']}; "
            + ", ".join(
                f"{k} p50 {load[k]['p50_ms']:.1f} ms p99 {load[k]['p99_ms']:.1f} ms"
                for k in ("list", "status", "submit", "runs")
                if k in load
            )
            + f"; POST->first log {r['post_to_first_log_s']:.2f} s vs plain {r['plain_launch_to_first_log_s']:.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
