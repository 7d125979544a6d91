"""What the job server's test modules share: a real server process, its users, and small HTTP helpers.

``Server`` runs ``python -m tlaunch.server`` on a free loopback port with three
users (alice, bob, an admin named root); each test module brings its own
fixture around it (``tests/test_server.py``, ``tests/test_server_trust.py``...).
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

ALICE, BOB, ROOT = "alice-token-0123456789", "bob-token-0123456789ab", "admin-token-0123456789"
TOKENS = f"{ALICE} alice\n{BOB} bob\n{ROOT} root admin\n"
"""The token file's lines of the three users."""

TRAINER = """
import argparse, os, time
parser = argparse.ArgumentParser()
parser.add_argument("steps", type=int, nargs="?", default=3)
parser.add_argument("--rank", type=int)  # basic mode gives these after the job's args
parser.add_argument("--world_size", type=int)
steps = parser.parse_args().steps
for i in range(steps):
    print("step", i, "rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], flush=True)
    time.sleep(float(os.environ.get("STEP_TIME", "0.1")))
if os.environ.get("FAIL_AT_END"):
    raise ValueError("the loss is nan at step " + str(steps))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``python -m tlaunch.server`` on a free loopback port, with three users.

    Args:
        home: its ``--home``.
        max_mb: its ``--max-package-mb``.
        db: its ``--db``.
        extra: more options.
        env: its environment (default: this process's).
        tokens: the token file's text (None: no token file).
        scheme: ``https`` when ``extra`` gives it a certificate.
        cwd: the folder it is started from (default: this process's).
    """

    def __init__(
        self,
        home: Path,
        max_mb: int = 4,
        db: str | None = None,
        *,
        extra: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        tokens: str | None = TOKENS,
        scheme: str = "http",
        start: bool = True,
        cwd: Path | None = None,
    ) -> None:
        self.home = home
        self.db = db
        self.cwd = cwd
        self.port = free_port()
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.env = None if env is None else dict(env)
        self.token_file: Path | None = None
        self.argv = [sys.executable, "-m", "tlaunch.server", "--port", str(self.port), "--home", str(home),
                     "--max-package-mb", str(max_mb)]  # fmt: skip
        if tokens is not None:
            self.token_file = home.parent / f"{home.name}-tokens"
            self.token_file.write_text(tokens)
            os.chmod(self.token_file, 0o600)
            self.argv += ["--token-file", str(self.token_file)]
        if db is not None:
            self.argv += ["--db", db]
        self.argv += list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = home.parent / f"{home.name}.log"
        self.verify: Any = True
        if start:
            self.start()

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd
            )
        deadline = time.monotonic() + 30
        try:
            while True:
                try:
                    if httpx.get(f"{self.url}/v1/health", timeout=1, verify=self.verify).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                assert self.proc.poll() is None, self.log.read_text()
                if time.monotonic() > deadline:
                    raise AssertionError(f"the server did not answer: {self.log.read_text()}")
                time.sleep(0.1)
        except BaseException:
            if self.proc.poll() is None:
                self.kill()
            self.proc.wait()
            raise

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        assert "Traceback" not in self.log.read_text(), self.log.read_text()

    def client(self, token: str | None = ALICE) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=90, verify=self.verify)


def zip_of(files: Mapping[str, str | bytes]) -> bytes:
    """A zip archive of ``files`` (name: content)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, text in files.items():
            z.writestr(name, text)
    return buf.getvalue()


def upload(c: Any, files: Mapping[str, str | bytes] | None = None) -> str:
    """Upload ``files`` (default: the trainer) as a package; its id."""
    r = c.post("/v1/package", content=zip_of(files or {"train.py": TRAINER, "requirements.txt": ""}))
    assert r.status_code in (200, 201), r.text
    return str(r.json()["package_id"])


def launched(c: Any, name: str, timeout: float = 60) -> dict[str, Any]:
    """Job ``name`` once its launch has recorded its run (a submit answers before: ``PENDING``)."""
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = c.get(f"/v1/jobs/{name}").json()
        assert "state" in job, job
        if job["refs"].get("run_id"):
            return job
        assert job["state"] == "PENDING" and time.monotonic() < deadline, job
        time.sleep(0.05)


def wait_state(
    c: Any, name: str, states: tuple[str, ...], timeout: float = 90, params: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Job ``name`` once it is in one of ``states``."""
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = c.get(f"/v1/jobs/{name}", params=params).json()
        assert "state" in job, job  # an error answer: say which
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.2)


def events(c: Any, path: str, params: Mapping[str, str] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The server-sent events of ``path``, until the server ends the stream."""
    out, event = [], "message"
    with c.stream("GET", path, params=params) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.read()
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                out.append((event, json.loads(line[6:])))
                event = "message"
    return out


def error_of(r: Any, status: int) -> dict[str, Any]:
    """The error of answer ``r``, checked to be ``status`` in the one error shape."""
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and body["error"]["status"] == status, body
    assert "Traceback" not in r.text
    return dict(body["error"])
