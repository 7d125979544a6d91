"""Job server benchmark: its hot paths under 50 concurrent clients, against Ray Jobs in the same run.

    python bench/server.py [--clients 50] [--seconds 8] [--out bench/results/server.json]
    python bench/server.py --against-ray [--rounds 2] [--out bench/results/server_vs_ray.json]

Everything listens on 127.0.0.1; every server, job and Ray process is the bench's
own and goes when it ends. The clients are ``--clients`` threads spread over
four processes (``bench/loadgen.py``), each with its own kept-alive connection.

**The floor** (both modes), for SQLite and PostgreSQL (Debian's, started
privately by ``tlaunch.testing.postgres``): a real server with 1,000 jobs in
its table (written before it starts, as finished jobs with their nodes) and
one running job. For ``--seconds`` each, the clients ask ``GET /v1/health``
(the framework's own floor), a finished job's status, the running job's
status, and a page of the list (50 jobs); what each costs is health's
requests/s over its own (target: at most 2x), with p50/p99; then the same
from one client (an idle server: target p99 under 100 ms), and every dropped
connection or error.

**Against Ray Jobs** (``--against-ray``: Ray 2.60 in a venv of the bench's own,
``bench/raybench.py``; a head on 127.0.0.1 with ``--num-cpus`` this machine's),
in ``--rounds`` alternating rounds (tlaunch then Ray, then Ray then tlaunch),
after one job through each (a fresh server's and head's first requests are not
a round's):

- submit: the 50 clients each submit a job (of one package, uploaded once)
  that prints a line and ends, all at once (latency of the submit's answer:
  target p50 under 50 ms, p99 under 200 ms for tlaunch), then every job's
  submit to SUCCEEDED; then 20 submits from one client, one after the other;
- submit to the first log line at a follower, ``--reps`` jobs one at a time
  (tlaunch: its SSE stream; Ray: its logs asked again every 20 ms);
- under 50 clients: a running job's status (target: 2x Ray's requests/s),
  the whole list (tlaunch ``limit=500``; Ray's has no pages), a page of the
  list (tlaunch ``limit=20``; Ray's whole list again), the cheapest GET of each
  (health; Ray's ``/api/version``);
- memory: the server's RSS against every process of Ray's session, idle.

Results: JSON (``--out``) and a plot beside it (``.png``).
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
import time
import zipfile
from typing import Any

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]
import plots  # noqa: E402
from loadgen import Request, load  # noqa: E402

TOKEN = "bench-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FIRST = "first line from the job"
TRAINER = f'import time\nprint("{FIRST}", flush=True)\ntime.sleep(float(__import__("os").environ.get("HOLD", "0")))\n'
RAY_ENTRY = "python train.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _package() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("train.py", TRAINER)
    return buf.getvalue()


def _rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


class Server:
    """``python -m tlaunch.server`` of this tree on a free loopback port, one admin token."""

    def __init__(self, home: str, db: str | None = None) -> None:
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "tlaunch.server", "--port", str(self.port), "--home", home,
                "--max-streams-per-user", "1000"]  # fmt: skip
        if db:
            argv += ["--db", db]
        env = {**os.environ, "TLAUNCH_SERVER_TOKEN": TOKEN, "PYTHONPATH": ROOT}
        self.log = open(os.path.join(home, "server.log"), "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                with open(self.log.name, errors="replace") as f:
                    raise RuntimeError(f"the server did not start: {f.read()[-2000:]}")
            time.sleep(0.1)
        self.client = httpx.Client(base_url=self.url, headers=AUTH, timeout=120)

    def close(self) -> None:
        if getattr(self, "client", None) is not None:
            self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def stop_all(self) -> None:
        jobs = self.client.get("/v1/jobs", params={"limit": 500}).json()["jobs"]
        for j in jobs:
            if j["state"] not in ("SUCCEEDED", "FAILED", "STOPPED", "LOST"):
                self.client.post(f"/v1/jobs/{j['name']}/stop")
        self.wait_all()

    def wait_all(self, timeout: float = 300) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            jobs = {j["name"]: j for j in self.client.get("/v1/jobs", params={"limit": 500}).json()["jobs"]}
            if all(j["state"] in ("SUCCEEDED", "FAILED", "STOPPED", "LOST") for j in jobs.values()):
                return jobs
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "jobs still running: "
                    + ", ".join(n for n, j in jobs.items() if j["state"] not in ("SUCCEEDED",))
                )
            time.sleep(0.2)


# -- the floor: 1,000 jobs in the table ------------------------------------------------------


def _fill(db_url: str, n: int) -> None:
    """``n`` finished jobs in a new table (what a server that ran them keeps of them)."""
    from tlaunch.server.store import JobRow, JobStore

    store = JobStore(db_url)
    now = time.time() - n
    for i in range(n):
        node = {"key": "trainer/0", "host": "localhost", "state": "done", "pid": 1000 + i, "exit_code": 0,
                "reason": None, "restarts": 0, "started_at": now + i, "finished_at": now + i + 1}  # fmt: skip
        final = {"state": "SUCCEEDED", "message": "every node ended", "exit_code": 0,
                 "refs": {"run_id": f"done-{i:04d}-run"}, "nodes": [node], "failure": None, "results": None}  # fmt: skip
        spec = {"job_name": f"done-{i:04d}", "trainer_package": "0" * 64, "entry_point": "train.py",
                "args": [], "launch_method": "basic", "num_trainer": 1}  # fmt: skip
        store.add(JobRow(f"done-{i:04d}", "admin", spec, {"batch": str(i % 10)}, f"done-{i:04d}-run",
                         "every node ended", "SUCCEEDED", now + i, final))  # fmt: skip
    store.close()


def floor(label: str, db: str | None, args: argparse.Namespace) -> dict[str, Any]:
    """Health against a status and a list page, with 1,000 jobs in the table (see the docstring)."""
    with tempfile.TemporaryDirectory() as home:
        os.makedirs(os.path.join(home, "server"), mode=0o700)
        _fill(db or os.path.join(home, "server", "jobs.db"), args.store_jobs)
        server = Server(home, db)
        try:
            pkg = server.client.post("/v1/package", content=_package()).json()["package_id"]
            r = server.client.post("/v1/trainer/job", json={"job_name": "running", "trainer_package": pkg,
                                                            "env": {"HOLD": "600"}})  # fmt: skip
            r.raise_for_status()
            _until(lambda: server.client.get("/v1/jobs/running").json()["state"] == "RUNNING", 120)
            kinds = {
                "health": "/v1/health",
                "status of a finished job": f"/v1/jobs/done-{args.store_jobs // 2:04d}",
                "status of a running job": "/v1/jobs/running",
                "list page (50)": "/v1/jobs?limit=50",
            }
            out: dict[str, Any] = {"db": label, "jobs_in_store": args.store_jobs + 1, "under_load": {},
                                   "one_client": {}, "load_average": []}  # fmt: skip
            for _ in range(args.rounds):  # in turns, so that a load the machine has hits each alike
                out["load_average"].append(os.getloadavg())
                for kind, path in kinds.items():
                    got = load(
                        server.url, [Request(kind, "GET", path, headers=AUTH)], args.clients, args.seconds
                    )
                    out["under_load"].setdefault(kind, []).append(got)
            for kind, path in kinds.items():
                times = []
                for _ in range(300):
                    t0 = time.perf_counter()
                    server.client.get(path).raise_for_status()
                    times.append(time.perf_counter() - t0)
                times.sort()
                out["one_client"][kind] = {"p50_ms": 1e3 * times[150], "p99_ms": 1e3 * times[296]}
            rps = {k: statistics.median(r[k]["per_s"] for r in v) for k, v in out["under_load"].items()}
            out["requests_per_s"] = rps
            out["cost_vs_health"] = {k: rps["health"] / v for k, v in rps.items()}
            out["errors"] = sum(r["errors"] for v in out["under_load"].values() for r in v)
            server.stop_all()
            return out
        finally:
            server.close()


def _until(check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(0.1)


# -- against Ray Jobs -------------------------------------------------------------------------


def _submits_tlaunch(server: Server, args: argparse.Namespace, round_no: int) -> dict[str, Any]:
    pkg = server.client.post("/v1/package", content=_package()).json()["package_id"]
    body = {"job_name": f"r{round_no}-c{{client}}-{{n}}", "trainer_package": pkg}
    t0 = time.time()
    got = load(server.url, [Request("submit", "POST", "/v1/trainer/job", body, (201,), AUTH)], args.clients,
               once=True)  # fmt: skip
    jobs = server.wait_all()
    mine = [j for n, j in jobs.items() if n.startswith(f"r{round_no}-")]
    ended = []
    for j in mine:
        nodes = [n["finished_at"] for n in j["nodes"] if n.get("finished_at")]
        if nodes:
            ended.append(max(nodes) - j["created"])
    got["succeeded"] = sum(j["state"] == "SUCCEEDED" for j in mine)
    got["submit_to_end_s_median"] = statistics.median(ended) if ended else None
    got["wall_s"] = time.time() - t0
    return got


def _submits_ray(ray: Any, args: argparse.Namespace) -> dict[str, Any]:
    uri = ray.upload(_package())
    body = {"entrypoint": RAY_ENTRY, "runtime_env": {"working_dir": uri}}
    t0 = time.time()
    got = load(ray.url, [Request("submit", "POST", "/api/jobs/", body, (200,))], args.clients, once=True)
    ray.wait_all()
    jobs = ray.client.get("/api/jobs/").json()
    mine = [j for j in jobs if (j.get("start_time") or 0) / 1000 >= t0 - 1]
    ended = [
        (j["end_time"] - j["start_time"]) / 1000 for j in mine if j.get("end_time") and j.get("start_time")
    ]
    got["succeeded"] = sum(j["status"] == "SUCCEEDED" for j in mine)
    got["submit_to_end_s_median"] = statistics.median(ended) if ended else None
    got["wall_s"] = time.time() - t0
    return got


def _first_line_tlaunch(server: Server, name: str) -> float:
    pkg = server.client.post("/v1/package", content=_package()).json()["package_id"]
    t0 = time.perf_counter()
    server.client.post("/v1/trainer/job", json={"job_name": name, "trainer_package": pkg}).raise_for_status()
    with server.client.stream("GET", f"/v1/jobs/{name}/logs", params={"follow": "true"}) as s:
        for line in s.iter_lines():
            if line.startswith("data: ") and FIRST in line:
                return time.perf_counter() - t0
    raise RuntimeError(f"job {name} printed nothing")


def _first_line_ray(ray: Any) -> float:
    uri = ray.upload(_package())
    t0 = time.perf_counter()
    sid = ray.submit(ray.client, uri, RAY_ENTRY)
    ray.first_line(sid, FIRST)
    return time.perf_counter() - t0


def _api_load(
    url: str, kinds: dict[str, str], headers: dict[str, str], args: argparse.Namespace
) -> dict[str, Any]:
    return {kind: load(url, [Request(kind, "GET", path, headers=headers)], args.clients, args.seconds)
            for kind, path in kinds.items()}  # fmt: skip


def _one_client(submit: Any, n: int = 20) -> dict[str, float]:
    """p50 and p99 (ms) of ``n`` submits one after the other (one client)."""
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        submit(i)
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"p50_ms": 1e3 * times[n // 2], "p99_ms": 1e3 * times[-1]}


def round_tlaunch(server: Server, args: argparse.Namespace, round_no: int) -> dict[str, Any]:
    out: dict[str, Any] = {"load_average": os.getloadavg()}
    out["submit"] = _submits_tlaunch(server, args, round_no)
    out["first_log_line_s"] = [_first_line_tlaunch(server, f"first-{round_no}-{i}") for i in range(args.reps)]
    server.wait_all()
    pkg = server.client.post("/v1/package", content=_package()).json()["package_id"]
    out["submit_one_client"] = _one_client(
        lambda i: server.client.post(
            "/v1/trainer/job", json={"job_name": f"one-{round_no}-{i}", "trainer_package": pkg}
        ).raise_for_status()
    )
    server.wait_all()
    r = server.client.post("/v1/trainer/job", json={"job_name": f"long-{round_no}", "env": {"HOLD": "600"},
                            "trainer_package": server.client.post("/v1/package", content=_package()).json()["package_id"]})  # fmt: skip
    r.raise_for_status()
    _until(lambda: server.client.get(f"/v1/jobs/long-{round_no}").json()["state"] == "RUNNING", 120)
    kinds = {"status of a running job": f"/v1/jobs/long-{round_no}", "list all": "/v1/jobs?limit=500",
             "list page": "/v1/jobs?limit=20", "cheapest GET": "/v1/health"}  # fmt: skip
    out["load"] = _api_load(server.url, kinds, AUTH, args)
    out["jobs_listed"] = server.client.get("/v1/jobs", params={"limit": 1}).json()["total"]
    server.stop_all()
    out["memory_mib"] = _rss_mib([server.proc.pid])
    return out


def round_ray(ray: Any, args: argparse.Namespace, round_no: int) -> dict[str, Any]:
    out: dict[str, Any] = {"load_average": os.getloadavg()}
    out["submit"] = _submits_ray(ray, args)
    out["first_log_line_s"] = [_first_line_ray(ray) for _ in range(args.reps)]
    ray.wait_all()
    uri = ray.upload(_package())
    out["submit_one_client"] = _one_client(lambda i: ray.submit(ray.client, uri, RAY_ENTRY))
    ray.wait_all()
    uri = ray.upload(_package())
    long = ray.client.post("/api/jobs/", json={"entrypoint": RAY_ENTRY, "runtime_env": {"working_dir": uri,
                           "env_vars": {"HOLD": "600"}}}).json()["submission_id"]  # fmt: skip
    _until(lambda: ray.status(long) == "RUNNING", 120)
    kinds = {"status of a running job": f"/api/jobs/{long}", "list all": "/api/jobs/",
             "list page": "/api/jobs/", "cheapest GET": "/api/version"}  # fmt: skip
    out["load"] = _api_load(ray.url, kinds, {}, args)
    out["jobs_listed"] = len(ray.client.get("/api/jobs/").json())
    ray.stop(long)
    ray.wait_all()
    time.sleep(2)
    out["memory_mib"] = _rss_mib(ray.pids())
    return out


def _warm(server: Server, ray: Any) -> None:
    """One job through each system, and a status and a list of it, before the rounds: what a
    fresh server or head does once (FastAPI builds its routes' models at their first request; a
    Ray head's first job starts its job agent's workers) is not measured as a round's."""
    pkg = server.client.post("/v1/package", content=_package()).json()["package_id"]
    server.client.post(
        "/v1/trainer/job", json={"job_name": "warm", "trainer_package": pkg}
    ).raise_for_status()
    server.wait_all()
    server.client.get("/v1/jobs/warm").raise_for_status()
    server.client.get("/v1/jobs").raise_for_status()
    sid = ray.submit(ray.client, ray.upload(_package()), RAY_ENTRY)
    ray.wait_all()
    ray.client.get(f"/api/jobs/{sid}").raise_for_status()
    ray.client.get("/api/jobs/").raise_for_status()


def against_ray(args: argparse.Namespace) -> dict[str, Any]:
    from raybench import RAY_VERSION, RayHead, ray_venv

    try:
        venv_bin = ray_venv(args.ray_venv)
    except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
        print(
            f"Ray cannot be installed here ({exc}); measured against the health floor only", file=sys.stderr
        )
        return {"ray": None, "why": str(exc)}
    home = tempfile.mkdtemp(prefix="tlaunch-bench-")
    server = Server(home)
    ray = RayHead(venv_bin, os.cpu_count() or 2)
    out: dict[str, Any] = {"ray_version": RAY_VERSION, "rounds": []}
    try:
        _warm(server, ray)
        for round_no in range(args.rounds):
            order = ("tlaunch", "ray") if round_no % 2 == 0 else ("ray", "tlaunch")
            got: dict[str, Any] = {}
            for system in order:
                print(f"round {round_no + 1}: {system}", flush=True)
                got[system] = (
                    round_tlaunch(server, args, round_no)
                    if system == "tlaunch"
                    else round_ray(ray, args, round_no)
                )
            out["rounds"].append(got)
    finally:
        ray.close()
        server.close()
        subprocess.run(["rm", "-rf", home], check=False)
    out["summary"] = _summary(out["rounds"])
    return out


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med(system: str, pick: Any) -> float | None:
        values = [v for v in (pick(r[system]) for r in rounds) if v is not None]
        return statistics.median(values) if values else None

    out: dict[str, Any] = {}
    for system in ("tlaunch", "ray"):
        s: dict[str, Any] = {
            "submit_p50_ms": med(system, lambda r: r["submit"]["submit"]["p50_ms"]),
            "submit_p99_ms": med(system, lambda r: r["submit"]["submit"]["p99_ms"]),
            "submit_one_client_p50_ms": med(system, lambda r: r["submit_one_client"]["p50_ms"]),
            "submit_one_client_p99_ms": med(system, lambda r: r["submit_one_client"]["p99_ms"]),
            "submit_to_succeeded_s": med(system, lambda r: r["submit"]["submit_to_end_s_median"]),
            "first_log_line_s": med(system, lambda r: statistics.median(r["first_log_line_s"])),
            "memory_mib": med(system, lambda r: r["memory_mib"]),
            "load_average_1min": med(system, lambda r: r["load_average"][0]),
            "errors": sum(
                r[system]["submit"]["errors"] + sum(x["errors"] for x in r[system]["load"].values())
                for r in rounds
            ),
        }
        for kind in ("status of a running job", "list all", "list page", "cheapest GET"):
            s[f"{kind} per_s"] = med(system, lambda r, k=kind: r["load"][k]["requests_per_s"])
            s[f"{kind} p50_ms"] = med(system, lambda r, k=kind: r["load"][k][k]["p50_ms"])
            s[f"{kind} p99_ms"] = med(system, lambda r, k=kind: r["load"][k][k]["p99_ms"])
        out[system] = s
    t, r = out["tlaunch"], out["ray"]
    out["ratios tlaunch/ray"] = {
        k: (t[k] / r[k]) if (t.get(k) and r.get(k)) else None for k in t if k != "errors"
    }
    out["targets"] = {
        "submit p50 under 50 ms (50 at once)": t["submit_p50_ms"] < 50,
        "submit p99 under 200 ms (50 at once)": t["submit_p99_ms"] < 200,
        "running job's status at least 2x Ray's requests/s": out["ratios tlaunch/ray"]["status of a running job per_s"] >= 2,
        "no errors or dropped connections": t["errors"] == 0,
    }  # fmt: skip
    return out


def _floor_targets(runs: list[dict[str, Any]]) -> dict[str, bool]:
    """The floor's targets, for each database: a status and a page at most 2x health, p99 under
    100 ms from one client, no errors."""
    out = {}
    for run in runs:
        costs, one = run["cost_vs_health"], run["one_client"]
        out[f"{run['db']}: status and a page at most 2x health"] = all(
            v <= 2.0 for k, v in costs.items() if k != "health"
        )
        out[f"{run['db']}: p99 under 100 ms from one client"] = all(v["p99_ms"] < 100 for v in one.values())
        out[f"{run['db']}: no errors"] = run["errors"] == 0
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--seconds", type=float, default=8.0, help="each load phase")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--reps", type=int, default=3, help="jobs followed to their first log line, per round")
    p.add_argument("--store-jobs", type=int, default=1000)
    p.add_argument("--against-ray", action="store_true", help="measure Ray Jobs too, in the same run")
    p.add_argument(
        "--ray-venv", help="the bench's Ray virtualenv (default ~/.cache/tlaunch-bench/ray-2.60.0)"
    )
    p.add_argument("--no-postgres", action="store_true")
    p.add_argument("--out")
    args = p.parse_args()
    args.out = args.out or os.path.join(
        HERE, "results", "server_vs_ray.json" if args.against_ray else "server.json"
    )
    from tlaunch.testing.postgres import PostgresTestServer, postgres_bin

    results: dict[str, Any] = {
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_at_start": os.getloadavg(),
        "clients": args.clients,
        "seconds": args.seconds,
    }
    if args.against_ray:
        results["against_ray"] = against_ray(args)
    runs = [floor("sqlite", None, args)]
    if postgres_bin() is not None and not args.no_postgres:
        with PostgresTestServer() as pg:
            runs.append(floor("postgres", pg.create_database("bench"), args))
    results["floor"] = runs
    results["floor_targets"] = _floor_targets(runs)
    results["load_average_at_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    plots.plot_file(args.out, "server")
    for run in runs:
        print(f"{run['db']:8} ({run['jobs_in_store']} jobs) requests/s: "
              + ", ".join(f"{k} {v:.0f}" for k, v in run["requests_per_s"].items())
              + "; cost vs health: " + ", ".join(f"{k} {v:.2f}x" for k, v in run["cost_vs_health"].items())
              + "; one client p99: " + ", ".join(f"{k} {v['p99_ms']:.1f} ms" for k, v in run["one_client"].items())
              + f"; errors {run['errors']}")  # fmt: skip
    vs = results.get("against_ray") or {}
    if vs.get("summary"):
        print(json.dumps(vs["summary"], indent=1))
    print(json.dumps(results["floor_targets"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
