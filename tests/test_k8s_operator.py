"""The LPJob operator for real (kopf, the kubernetes client) against the stand-in API server.

No real API server exists on these machines: ``tlaunch.testing.kube`` stands in
for one (the tests play the kubelet with ``set_pod_phase``). ``kubectl`` talks
to it through the same kubeconfig.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("kopf")
kubernetes = pytest.importorskip("kubernetes")

from kopf.testing import KopfRunner  # noqa: E402

from tlaunch.jobs import JobSpec  # noqa: E402
from tlaunch.k8s.crd import crd  # noqa: E402
from tlaunch.testing.kube import StandInAPIServer  # noqa: E402

GROUP, VERSION, PLURAL = "tlaunch.io", "v1alpha1", "lpjobs"


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInAPIServer]:
    """The stand-in server with the LPJob CRD installed, and the operator running against it."""
    with StandInAPIServer() as api:
        monkeypatch.setenv("KUBECONFIG", api.kubeconfig)
        kubernetes.config.load_kube_config(api.kubeconfig)
        kubernetes.client.ApiextensionsV1Api().create_custom_resource_definition(crd())
        with KopfRunner(["run", "--standalone", "--all-namespaces", "-m", "tlaunch.k8s.operator"]) as runner:
            _until(lambda: api.requests > 5, "the operator did not start")
            yield api
        assert runner.exception is None, runner.stdout


def _until(ok: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := ok()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return value


def _submit(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"lpjob_name": "ppo", "script": ["train.py"], "image": "img:1", "num_trainer": 2}
    lpjob = JobSpec(**{**base, **kw}).to_lpjob()
    return kubernetes.client.CustomObjectsApi().create_namespaced_custom_object(  # type: ignore[no-any-return]
        GROUP, VERSION, "default", PLURAL, lpjob
    )


def _status(api: StandInAPIServer) -> dict[str, Any]:
    return (api.get(GROUP, VERSION, PLURAL, "default", "ppo") or {}).get("status") or {}


def _phase(api: StandInAPIServer, phase: str) -> dict[str, Any]:
    return _until(
        lambda: _status(api) if _status(api).get("phase") == phase else None, f"never {phase}: {_status(api)}"
    )  # type: ignore[no-any-return]


def test_an_lpjob_becomes_its_pods_and_service(kube: StandInAPIServer) -> None:
    _submit(method="torchrun", nnodes="2", nproc_per_node=4, gpu=4, gpu_memory=16000)
    pods = _until(
        lambda: len(kube.list("", "pods", "default")) == 2 and kube.list("", "pods", "default"), "no pods"
    )
    assert [p["metadata"]["name"] for p in pods] == ["ppo-trainer-0", "ppo-trainer-1"]
    container = pods[1]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["TLAUNCH_JOB"] == "ppo"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "4", "nvidia.com/gpumem": "16000"}
    assert "--rdzv-endpoint=ppo-trainer-0.ppo.default.svc:29400" in container["command"]
    uid = kube.get(GROUP, VERSION, PLURAL, "default", "ppo")["metadata"]["uid"]  # type: ignore[index]
    assert all(p["metadata"]["ownerReferences"][0]["uid"] == uid for p in pods)
    (service,) = kube.list("", "services", "default")
    assert service["spec"]["clusterIP"] == "None"
    status = _phase(kube, "Created")
    assert status["roles"]["trainer"]["total"] == 2 and status["rolesReady"] == "0/2"


def test_pod_phases_drive_the_lpjob_to_running_and_succeeded(kube: StandInAPIServer) -> None:
    _submit()
    _until(lambda: len(kube.list("", "pods", "default")) == 2, "no pods")
    for i in range(2):
        kube.set_pod_phase("default", f"ppo-trainer-{i}", "Running")
    assert _phase(kube, "Running")["rolesReady"] == "2/2"
    shown = subprocess.run(["kubectl", "get", "lpjobs"], capture_output=True, text=True, check=True).stdout
    assert shown.split("\n")[0].split() == ["NAME", "STATE", "ROLES", "RESTARTS", "AGE"]
    assert shown.split("\n")[1].split()[:4] == ["ppo", "Running", "2/2", "0"]
    for i in range(2):
        kube.set_pod_phase("default", f"ppo-trainer-{i}", "Succeeded")
    status = _phase(kube, "Succeeded")
    assert {c["type"]: c["status"] for c in status["conditions"]}["Succeeded"] == "True"


def test_a_failed_pod_fails_the_lpjob_with_its_reason(kube: StandInAPIServer) -> None:
    _submit()
    _until(lambda: len(kube.list("", "pods", "default")) == 2, "no pods")
    kube.set_pod_phase("default", "ppo-trainer-0", "Running")
    kube.set_pod_phase("default", "ppo-trainer-1", "Failed", exit_code=3, reason="Error")
    status = _phase(kube, "Failed")
    assert status["reason"] == "pod ppo-trainer-1 failed: exit code 3 (Error)"
    # nothing of a failed job keeps running
    _until(lambda: kube.get("", "v1", "pods", "default", "ppo-trainer-0") is None, "the running pod stayed")


def test_on_failure_restarts_a_failed_pod_until_the_backoff_limit(kube: StandInAPIServer) -> None:
    _submit(restart_policy="OnFailure", backoff_limit=1)
    _until(lambda: len(kube.list("", "pods", "default")) == 2, "no pods")
    first = kube.get("", "v1", "pods", "default", "ppo-trainer-1")["metadata"]["uid"]  # type: ignore[index]
    kube.set_pod_phase("default", "ppo-trainer-1", "Failed", exit_code=1)
    status = _phase(kube, "Restarting")
    assert status["restarts"] == 1 and "restart 1: pod ppo-trainer-1 failed" in status["reason"]
    again = _until(lambda: kube.get("", "v1", "pods", "default", "ppo-trainer-1"), "not recreated")
    assert again["metadata"]["uid"] != first
    kube.set_pod_phase("default", "ppo-trainer-1", "Failed", exit_code=1)
    assert _phase(kube, "Failed")["restarts"] == 1


def test_deleting_an_lpjob_runs_its_finalizer_and_removes_its_children(kube: StandInAPIServer) -> None:
    _submit(method="deepspeed", nproc_per_node=2, gang=True, gpu=1, gpu_stack="volcano")
    _until(lambda: len(kube.list("", "pods", "default")) == 2, "no pods")
    assert len(kube.list("", "configmaps", "default")) == 1
    assert kube.list("scheduling.volcano.sh", "podgroups", "default")[0]["spec"]["minMember"] == 2
    assert (
        "tlaunch.io/cleanup" in kube.get(GROUP, VERSION, PLURAL, "default", "ppo")["metadata"]["finalizers"]
    )  # type: ignore[index]
    done = subprocess.run(
        ["kubectl", "delete", "lpjob", "ppo", "--wait=false"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    _until(lambda: kube.get(GROUP, VERSION, PLURAL, "default", "ppo") is None, "the LPJob stayed")
    for plural in ("pods", "services", "configmaps"):
        assert kube.list("", plural, "default") == [], plural
    assert kube.list("scheduling.volcano.sh", "podgroups", "default") == []


def test_kubectl_reads_the_crd_and_lpjobs(kube: StandInAPIServer) -> None:
    _submit()
    _phase(kube, "Created")
    out = subprocess.run(["kubectl", "get", "crd"], capture_output=True, text=True, check=True).stdout
    assert "lpjobs.tlaunch.io" in out
    out = subprocess.run(
        ["kubectl", "get", "lpjob", "ppo", "-o", "jsonpath={.status.phase}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == "Created"
    assert os.environ["KUBECONFIG"] == kube.kubeconfig


def _tlaunchrun(*args: str) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.tlaunchrun", *args], capture_output=True, text=True, timeout=60
    )


def test_tlaunchrun_submits_follows_and_deletes_a_job(kube: StandInAPIServer) -> None:
    done = _tlaunchrun(
        "--lpjob_name", "ppo", "--image", "img:1", "--gpu", "1",
        "torchrun", "--num_trainer", "2", "--nproc_per_node", "1", "train.py", "--lr", "0.1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "lpjob.tlaunch.io/ppo created in namespace default" in done.stdout
    _until(lambda: len(kube.list("", "pods", "default")) == 2, "no pods")
    for i in range(2):
        kube.set_pod_phase("default", f"ppo-trainer-{i}", "Running")
        kube.set_pod_log("default", f"ppo-trainer-{i}", f"step 1 on rank {i}\n")
    _phase(kube, "Running")
    listed = _tlaunchrun("ls").stdout.splitlines()
    assert listed[1].split() == ["default", "ppo", "Running", "2/2", "0"], listed
    status = _tlaunchrun("status", "ppo").stdout
    assert "ppo: Running (2/2 ready, 0 restarts)" in status and "pod ppo-trainer-1: Running" in status
    logs = _tlaunchrun("logs", "ppo").stdout
    assert "[ppo-trainer-0] step 1 on rank 0" in logs and "[ppo-trainer-1] step 1 on rank 1" in logs
    assert _tlaunchrun("delete", "ppo").returncode == 0
    _until(lambda: kube.get(GROUP, VERSION, PLURAL, "default", "ppo") is None, "the LPJob stayed")
    assert kube.list("", "pods", "default") == []
