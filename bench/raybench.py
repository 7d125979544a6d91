"""Ray Jobs for ``bench/server.py --against-ray``: its own venv, a head on 127.0.0.1, its REST API.

Ray goes in a virtualenv of the bench's own (default
``~/.cache/tlaunch-bench/ray-<version>``; ``pip install 'ray[default]==<version>'``),
never the project's. The head (``ray start --head --block``, GCS, raylet,
dashboard with the job API) listens on 127.0.0.1 only, in a session of its
own, and is killed with its whole process group when the bench ends; its
temp folder is the bench's.

Jobs go through the same REST API Ray's SDK uses: a package is ``PUT`` at
``/api/packages/gcs/_ray_pkg_<sha>.zip`` (its working_dir), a job ``POST``
at ``/api/jobs/`` with ``runtime_env.working_dir`` ``gcs://...``; status is
``GET /api/jobs/<id>``, the list ``GET /api/jobs/`` (no pages: every job),
logs ``GET /api/jobs/<id>/logs`` (the whole log: followed here by asking again).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

__all__ = ["RAY_VERSION", "RayHead", "ray_venv"]

RAY_VERSION = "2.60.0"
_ENDED = ("SUCCEEDED", "FAILED", "STOPPED")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ray_venv(path: str | None = None, version: str = RAY_VERSION) -> str:
    """The bench's Ray virtualenv (made and filled the first time); its ``bin`` folder.

    Raises:
        RuntimeError: Ray cannot be installed here (pip's output says why).
    """
    path = path or os.path.join(os.path.expanduser("~"), ".cache", "tlaunch-bench", f"ray-{version}")
    ray = os.path.join(path, "bin", "ray")
    if os.path.exists(ray):
        return os.path.dirname(ray)
    subprocess.run([sys.executable, "-m", "venv", path], check=True)
    done = subprocess.run(
        [os.path.join(path, "bin", "pip"), "install", "-q", f"ray[default]=={version}"],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0 or not os.path.exists(ray):
        said = (done.stdout + done.stderr)[-3000:]
        raise RuntimeError(f"pip install 'ray[default]=={version}' failed: {said}")
    return os.path.dirname(ray)


class RayHead:
    """A Ray head of the bench's own on 127.0.0.1 (see the module docstring)."""

    def __init__(self, venv_bin: str, cpus: int) -> None:
        self.temp = tempfile.mkdtemp(prefix="ray-bench-", dir="/tmp")  # Ray's socket paths must be short
        self.port = _port()
        self.dashboard = _port()
        self.url = f"http://127.0.0.1:{self.dashboard}"
        argv = [
            os.path.join(venv_bin, "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
            "--port", str(self.port), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard),
            "--include-dashboard", "true", "--num-cpus", str(cpus), "--temp-dir", self.temp,
            "--disable-usage-stats",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTHON", "VIRTUAL_ENV"))}
        env["PATH"] = f"{venv_bin}:{env.get('PATH', '')}"
        self.log = open(os.path.join(self.temp, "head.out"), "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{self.url}/api/version", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                with open(os.path.join(self.temp, "head.out"), errors="replace") as f:
                    raise RuntimeError(f"the Ray head did not start: {f.read()[-3000:]}")
            time.sleep(0.5)
        self.client = httpx.Client(base_url=self.url, timeout=120)

    def upload(self, data: bytes) -> str:
        """A package (a zip of a working_dir), stored by content; its ``gcs://`` URI."""
        name = f"_ray_pkg_{hashlib.sha256(data).hexdigest()[:32]}.zip"
        r = self.client.put(f"/api/packages/gcs/{name}", content=data)
        r.raise_for_status()
        return f"gcs://{name}"

    def submit(self, c: httpx.Client, uri: str, entrypoint: str) -> str:
        r = c.post("/api/jobs/", json={"entrypoint": entrypoint, "runtime_env": {"working_dir": uri}})
        r.raise_for_status()
        return str(r.json()["submission_id"])

    def status(self, submission_id: str) -> str:
        return str(self.client.get(f"/api/jobs/{submission_id}").json()["status"])

    def states(self) -> dict[str, str]:
        """Every job's state by submission id."""
        return {j["submission_id"]: j["status"] for j in self.client.get("/api/jobs/").json()}

    def first_line(self, submission_id: str, text: str, timeout: float = 120) -> None:
        """Wait until the job's log holds ``text`` (asked every 20 ms)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.client.get(f"/api/jobs/{submission_id}/logs")
            if r.status_code == 200 and text in r.json().get("logs", ""):
                return
            time.sleep(0.02)
        raise RuntimeError(f"Ray job {submission_id} printed no {text!r}")

    def stop(self, submission_id: str) -> None:
        self.client.post(f"/api/jobs/{submission_id}/stop")

    def wait_all(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while any(s not in _ENDED for s in self.states().values()) and time.monotonic() < deadline:
            time.sleep(0.3)

    def pids(self) -> list[int]:
        """Ray's own processes (its session: GCS, raylet, dashboard and its agents, idle workers)."""
        out = subprocess.run(["ps", "-o", "pid=", "-s", str(self.proc.pid)], capture_output=True, text=True,
                             check=False)  # fmt: skip
        return [int(p) for p in out.stdout.split()]

    def close(self) -> None:
        if getattr(self, "client", None) is not None:
            self.client.close()
        for sig in (signal.SIGTERM, signal.SIGKILL):  # its session's processes, by pid (started here)
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(15)
            time.sleep(1.0)
        self.log.close()
        subprocess.run(["rm", "-rf", self.temp], check=False)
