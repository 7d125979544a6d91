"""On a real Kubernetes cluster only (skipped by default): the operator runs a job to Succeeded and to Failed.

    TLAUNCH_K8S_KUBECONFIG=~/.kube/config pytest -m k8s_real tests/test_k8s_real.py

The CRD must be installed (``tlaunch k8s manifests | kubectl apply -f -``, or
just its CRD); the operator runs here, against the cluster of that kubeconfig,
in namespace ``TLAUNCH_K8S_NAMESPACE`` (default ``default``). The pods use
``TLAUNCH_K8S_IMAGE`` (default ``python:3.11-slim``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

KUBECONFIG = os.environ.get("TLAUNCH_K8S_KUBECONFIG")
pytestmark = [
    pytest.mark.k8s_real,
    pytest.mark.skipif(not KUBECONFIG, reason="no real cluster: set TLAUNCH_K8S_KUBECONFIG"),
]


def _wait_phase(
    custom: Any, ns: str, name: str, phases: tuple[str, ...], timeout: float = 300
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = custom.get_namespaced_custom_object("tlaunch.io", "v1alpha1", ns, "lpjobs", name)
        if (job.get("status") or {}).get("phase") in phases:
            return job  # type: ignore[no-any-return]
        time.sleep(1)
    raise AssertionError(f"LPJob {name} never reached {phases}")


@pytest.mark.parametrize(("code", "phase"), [("print('ok')", "Succeeded"), ("raise SystemExit(3)", "Failed")])
def test_a_job_on_a_real_cluster(monkeypatch: pytest.MonkeyPatch, code: str, phase: str) -> None:
    kubernetes = pytest.importorskip("kubernetes")
    from kopf.testing import KopfRunner

    from tlaunch.jobs import JobSpec

    monkeypatch.setenv("KUBECONFIG", os.path.expanduser(KUBECONFIG or ""))
    kubernetes.config.load_kube_config(os.environ["KUBECONFIG"])
    ns = os.environ.get("TLAUNCH_K8S_NAMESPACE", "default")
    image = os.environ.get("TLAUNCH_K8S_IMAGE", "python:3.11-slim")
    name = f"tlaunch-real-{phase.lower()}-{int(time.time())}"
    custom = kubernetes.client.CustomObjectsApi()
    with KopfRunner(["run", "--standalone", "--namespace", ns, "-m", "tlaunch.k8s.operator"]):
        lpjob = JobSpec(
            lpjob_name=name, script=["python", "-c", code], image=image, namespace=ns, num_trainer=2
        )
        custom.create_namespaced_custom_object("tlaunch.io", "v1alpha1", ns, "lpjobs", lpjob.to_lpjob())
        try:
            job = _wait_phase(custom, ns, name, ("Succeeded", "Failed"))
            assert job["status"]["phase"] == phase, job["status"]
        finally:
            custom.delete_namespaced_custom_object("tlaunch.io", "v1alpha1", ns, "lpjobs", name)
