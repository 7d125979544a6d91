"""Helpers of the Kubernetes suites: the real operator on the stand-in API server, and waiting on it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kopf.testing import KopfRunner

from tlaunch.k8s.crd import GROUP, PLURAL, VERSION, crd
from tlaunch.testing.kube import StandInAPIServer


@contextlib.contextmanager
def operator_running(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandInAPIServer]:
    """The stand-in server with the LPJob CRD installed, and the operator (kopf) running against it.

    ``$KUBECONFIG`` points at it; ``$TLAUNCH_SERVICE_ACCOUNT_DIR`` at no folder
    (whatever machine runs the tests, tlaunchrun is not in a pod unless a test says so).
    """
    monkeypatch.setenv("TLAUNCH_SERVICE_ACCOUNT_DIR", str(tmp_path / "no-service-account"))
    with StandInAPIServer() as api:
        monkeypatch.setenv("KUBECONFIG", api.kubeconfig)
        kubernetes.config.load_kube_config(api.kubeconfig)
        kubernetes.client.ApiextensionsV1Api().create_custom_resource_definition(crd())
        with KopfRunner(["run", "--standalone", "--all-namespaces", "-m", "tlaunch.k8s.operator"]) as runner:
            until(lambda: api.requests > 5, "the operator did not start")
            yield api
        assert runner.exception is None, runner.stdout
        assert "Traceback" not in runner.stdout, runner.stdout  # no handler of the operator crashed


def until(ok: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    """``ok()``'s first true value (polled), failing with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := ok()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return value


def stays(ok: Callable[[], Any], what: str, seconds: float = 1.0) -> None:
    """``ok()`` holds all along ``seconds`` (what the operator must not do, given time to do it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert ok(), what
        time.sleep(0.05)


def job_status(api: StandInAPIServer, name: str = "ppo", ns: str = "default") -> dict[str, Any]:
    """An LPJob's status as the server holds it (``{}`` before the operator wrote one)."""
    return (api.get(GROUP, VERSION, PLURAL, ns, name) or {}).get("status") or {}


def wait_phase(api: StandInAPIServer, want: str, name: str = "ppo", ns: str = "default") -> dict[str, Any]:
    """Wait until the LPJob's phase is ``want``; its status."""
    return until(  # type: ignore[no-any-return]
        lambda: job_status(api, name, ns) if job_status(api, name, ns).get("phase") == want else None,
        f"{name} never {want}: {job_status(api, name, ns)}",
    )


def tlaunchrun(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``tlaunchrun ARGS`` in a process of its own (``kw``: ``cwd``, ``env``...)."""
    return subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.tlaunchrun", *args],
        capture_output=True,
        text=True,
        timeout=60,
        **kw,
    )


def free_port() -> int:
    """A free port of this machine (a coordinator's, in a pod the stand-in kubelet runs here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pods_end(kubelet: Any, timeout: float = 10.0) -> bool:
    """Whether every process of the stand-in kubelet's pods has ended within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while kubelet.pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not kubelet.pids()
