"""Launchpad programs on Kubernetes (lp_k8s): the stand-in API server, the operator and a stand-in kubelet.

The operator (kopf) and the clients are real; pods run as processes of this
machine (``tlaunch.testing.kube.kubelet``), the coordinator in its own pod, each
node in its own, talking over the run's mutually authenticated RPC.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

pytest.importorskip("kopf")
kubernetes = pytest.importorskip("kubernetes")

from tlaunch import lp_k8s  # noqa: E402
from tlaunch import lp_ssh as lp  # noqa: E402
from tlaunch.errors import LaunchError  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_helpers import free_port as _free_port  # noqa: E402
from kube_helpers import pods_end as _ends  # noqa: E402
from programs import consumer_producers  # noqa: E402


def test_the_consumer_producer_program_runs_in_pods(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    api, kubelet = cluster
    out = str(tmp_path / "out.txt")
    run = lp_k8s.launch(
        consumer_producers(out, 3), image="repo/img:1", coordinator_port=_free_port(), timeout=60
    )
    with open(out) as f:
        assert f.read() == "[0, 2, 4]"
    pods = {p["metadata"]["name"]: p for p in api.list("", "pods", "default")}
    assert sorted(pods) == sorted(
        [f"{run.name}-coordinator-0", f"{run.name}-consumer-0"]
        + [f"{run.name}-producer-{i}" for i in range(3)]
    )
    assert all(p["status"]["phase"] == "Succeeded" for p in pods.values())
    job = api.get("tlaunch.io", "v1alpha1", "lpjobs", "default", run.name)
    assert job is not None and job["status"]["phase"] == "Succeeded"
    secret = api.get("", "v1", "secrets", "default", f"tlaunch-run-{run.name}")
    assert secret is not None and secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert _ends(kubelet)
    run.stop()  # deleting the LPJob takes its pods and its Secret (the run's keys) with it
    deadline = time.monotonic() + 10
    while api.list("", "secrets", "default") or api.list("", "pods", "default"):
        assert time.monotonic() < deadline, "the run's Secret or pods stayed"
        time.sleep(0.1)


def _fails() -> None:
    time.sleep(0.3)
    raise ValueError("bad batch on purpose")


def _idles() -> None:
    while not lp.wait_for_stop(0.05):
        pass


def test_a_failing_node_raises_its_own_exception_with_its_pod(cluster) -> None:  # type: ignore[no-untyped-def]
    _, kubelet = cluster
    program = lp.Program("failing")
    program.add_node(lp.PyNode(_idles), label="idle")
    program.add_node(lp.PyNode(_fails), label="learner")
    with pytest.raises(ValueError) as caught:
        lp_k8s.launch(program, image="repo/img:1", coordinator_port=_free_port(), timeout=60)
    err = caught.value
    assert err.node == "learner/0" and err.host.endswith("-learner-0")  # type: ignore[attr-defined]
    assert "ValueError: bad batch on purpose" in err.remote_traceback  # type: ignore[attr-defined]
    assert _ends(kubelet), "the idle node kept running"


def test_nodes_placed_on_hosts_are_refused(cluster) -> None:  # type: ignore[no-untyped-def]
    program = lp.Program("placed")
    program.add_node(lp.PyNode(_idles).to_host("gpu1"), label="idle")
    with pytest.raises(LaunchError, match="on Kubernetes every node gets a pod of its own"):
        lp_k8s.launch(program, image="repo/img:1")
