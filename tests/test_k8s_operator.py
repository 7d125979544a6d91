"""The LPJob operator for real (kopf, the kubernetes client) against the stand-in API server.

No real API server exists on these machines: ``tlaunch.testing.kube`` stands in
for one (the tests play the kubelet with ``set_pod_phase``). ``kubectl`` talks
to it through the same kubeconfig.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kopf")
kubernetes = pytest.importorskip("kubernetes")

from kube_helpers import job_status, operator_running, stays, tlaunchrun, until, wait_phase  # noqa: E402

from tlaunch.jobs import JobSpec  # noqa: E402
from tlaunch.testing.kube import StandInAPIServer  # noqa: E402

GROUP, VERSION, PLURAL = "tlaunch.io", "v1alpha1", "lpjobs"


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandInAPIServer]:
    """The stand-in server with the LPJob CRD installed, and the operator running against it."""
    with operator_running(monkeypatch, tmp_path) as api:
        yield api


def _submit(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"lpjob_name": "ppo", "script": ["train.py"], "image": "img:1", "num_trainer": 2}
    lpjob = JobSpec(**{**base, **kw}).to_lpjob()
    return kubernetes.client.CustomObjectsApi().create_namespaced_custom_object(  # type: ignore[no-any-return]
        GROUP, VERSION, "default", PLURAL, lpjob
    )


def test_an_lpjob_becomes_its_pods_and_service(kube: StandInAPIServer) -> None:
    _submit(method="torchrun", nnodes="2", nproc_per_node=4, gpu=4, gpu_memory=16000)
    pods = until(
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
    status = wait_phase(kube, "Created")
    assert status["roles"]["trainer"]["total"] == 2 and status["rolesReady"] == "0/2"


def test_pod_phases_drive_the_lpjob_to_running_and_succeeded(kube: StandInAPIServer) -> None:
    _submit()
    until(lambda: len(kube.list("", "pods", "default")) == 2, "no pods")
    for i in range(2):
        kube.set_pod_phase("default", f"ppo-trainer-{i}", "Running")
    assert wait_phase(kube, "Running")["rolesReady"] == "2/2"
    shown = subprocess.run(["kubectl", "get", "lpjobs"], capture_output=True, text=True, check=True).stdout
    assert shown.split("\n")[0].split() == ["NAME", "STATE", "ROLES", "RESTARTS", "AGE"]
    assert shown.split("\n")[1].split()[:4] == ["ppo", "Running", "2/2", "0"]
    for i in range(2):
        kube.set_pod_phase("default", f"ppo-trainer-{i}", "Succeeded")
    status = wait_phase(kube, "Succeeded")
    assert {c["type"]: c["status"] for c in status["conditions"]}["Succeeded"] == "True"


def test_a_failed_pod_fails_the_lpjob_with_its_reason(kube: StandInAPIServer) -> None:
    _submit()
    until(lambda: len(kube.list("", "pods", "default")) == 2, "no pods")
    kube.set_pod_phase("default", "ppo-trainer-0", "Running")
    kube.set_pod_phase("default", "ppo-trainer-1", "Failed", exit_code=3, reason="Error")
    status = wait_phase(kube, "Failed")
    assert status["reason"] == "pod ppo-trainer-1 failed: exit code 3 (Error)"
    # nothing of a failed job keeps running
    until(lambda: kube.get("", "v1", "pods", "default", "ppo-trainer-0") is None, "the running pod stayed")


def test_on_failure_restarts_a_failed_pod_until_the_backoff_limit(kube: StandInAPIServer) -> None:
    _submit(restart_policy="OnFailure", backoff_limit=1)
    until(lambda: len(kube.list("", "pods", "default")) == 2, "no pods")
    first = kube.get("", "v1", "pods", "default", "ppo-trainer-1")["metadata"]["uid"]  # type: ignore[index]
    kube.set_pod_phase("default", "ppo-trainer-1", "Failed", exit_code=1)
    status = wait_phase(kube, "Restarting")
    assert status["restarts"] == 1 and "restart 1: pod ppo-trainer-1 failed" in status["reason"]
    again = until(lambda: kube.get("", "v1", "pods", "default", "ppo-trainer-1"), "not recreated")
    assert again["metadata"]["uid"] != first
    kube.set_pod_phase("default", "ppo-trainer-1", "Failed", exit_code=1)
    assert wait_phase(kube, "Failed")["restarts"] == 1


def test_deleting_an_lpjob_runs_its_finalizer_and_removes_its_children(kube: StandInAPIServer) -> None:
    _submit(method="deepspeed", nproc_per_node=2, gang=True, gpu=1, gpu_stack="volcano")
    until(lambda: len(kube.list("", "pods", "default")) == 2, "no pods")
    assert len(kube.list("", "configmaps", "default")) == 1
    assert kube.list("scheduling.volcano.sh", "podgroups", "default")[0]["spec"]["minMember"] == 2
    assert (
        "tlaunch.io/cleanup" in kube.get(GROUP, VERSION, PLURAL, "default", "ppo")["metadata"]["finalizers"]
    )  # type: ignore[index]
    done = subprocess.run(
        ["kubectl", "delete", "lpjob", "ppo", "--wait=false"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    until(lambda: kube.get(GROUP, VERSION, PLURAL, "default", "ppo") is None, "the LPJob stayed")
    for plural in ("pods", "services", "configmaps"):
        assert kube.list("", plural, "default") == [], plural
    assert kube.list("scheduling.volcano.sh", "podgroups", "default") == []


def test_kubectl_reads_the_crd_and_lpjobs(kube: StandInAPIServer) -> None:
    _submit()
    wait_phase(kube, "Created")
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


def test_tlaunchrun_submits_follows_and_deletes_a_job(kube: StandInAPIServer) -> None:
    done = tlaunchrun(
        "--lpjob_name", "ppo", "--image", "img:1", "--gpu", "1",
        "torchrun", "--num_trainer", "2", "--nproc_per_node", "1", "train.py", "--lr", "0.1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "lpjob.tlaunch.io/ppo created in namespace default" in done.stdout
    until(lambda: len(kube.list("", "pods", "default")) == 2, "no pods")
    for i in range(2):
        kube.set_pod_phase("default", f"ppo-trainer-{i}", "Running")
        kube.set_pod_log("default", f"ppo-trainer-{i}", f"step 1 on rank {i}\n")
    wait_phase(kube, "Running")
    listed = tlaunchrun("ls").stdout.splitlines()
    assert listed[1].split() == ["default", "ppo", "Running", "2/2", "0"], listed
    status = tlaunchrun("status", "ppo").stdout
    assert "ppo: Running (2/2 ready, 0 restarts)" in status and "pod ppo-trainer-1: Running" in status
    logs = tlaunchrun("logs", "ppo").stdout
    assert "[ppo-trainer-0] step 1 on rank 0" in logs and "[ppo-trainer-1] step 1 on rank 1" in logs
    assert tlaunchrun("delete", "ppo").returncode == 0
    until(lambda: kube.get(GROUP, VERSION, PLURAL, "default", "ppo") is None, "the LPJob stayed")
    assert kube.list("", "pods", "default") == []


def _pod(name: str, owner: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> str:
    """A pod made by someone else, carrying the job's labels (and, given, an owner reference); its uid."""
    meta: dict[str, Any] = {
        "name": name,
        "labels": {"tlaunch.io/job": "ppo", "tlaunch.io/role": "trainer"} if labels is None else labels,
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    body = {"metadata": meta, "spec": {"containers": [{"name": "x", "image": "someone/else:1"}]}}
    return str(kubernetes.client.CoreV1Api().create_namespaced_pod("default", body).metadata.uid)


def _uid(api: StandInAPIServer, name: str) -> str | None:
    pod = api.get("", "v1", "pods", "default", name)
    return None if pod is None else str(pod["metadata"]["uid"])


def test_a_pod_that_only_carries_the_jobs_label_is_not_the_jobs(kube: StandInAPIServer) -> None:
    """A foreign pod labelled ``tlaunch.io/job=ppo`` failing used to fail the job and end its pods."""
    _submit()
    until(lambda: len(kube.list("", "pods", "default")) == 2, "no pods")
    stale = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LPJob", "name": "ppo", "uid": str(uuid.uuid4())}
    intruder, old = _pod("intruder"), _pod("old-job-pod", owner={**stale, "controller": True})
    kube.set_pod_phase("default", "intruder", "Failed", exit_code=1)
    kube.set_pod_phase("default", "old-job-pod", "Succeeded")
    for i in range(2):
        kube.set_pod_phase("default", f"ppo-trainer-{i}", "Running")
    assert wait_phase(kube, "Running")["rolesReady"] == "2/2"
    stays(lambda: job_status(kube)["phase"] == "Running", "a foreign pod changed the job's state")
    for i in range(2):
        kube.set_pod_phase("default", f"ppo-trainer-{i}", "Succeeded")
    status = wait_phase(kube, "Succeeded")
    assert status["roles"]["trainer"] == {"total": 2, "ready": 0, "succeeded": 2, "failed": 0}
    assert (_uid(kube, "intruder"), _uid(kube, "old-job-pod")) == (intruder, old)


def test_on_failure_neither_restarts_nor_deletes_what_is_not_the_jobs(kube: StandInAPIServer) -> None:
    """With OnFailure a foreign failed pod was deleted (then a KeyError); deleting the job took it too."""
    _submit(restart_policy="OnFailure", backoff_limit=2)
    until(lambda: len(kube.list("", "pods", "default")) == 2, "no pods")
    wait_phase(kube, "Created")
    intruder = _pod("intruder")
    core = kubernetes.client.CoreV1Api()
    labels = {"tlaunch.io/job": "ppo"}
    core.create_namespaced_service("default", {"metadata": {"name": "theirs", "labels": labels}, "spec": {}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "theirs", "labels": labels}})
    kube.set_pod_phase("default", "intruder", "Failed", exit_code=1)
    stays(lambda: _uid(kube, "intruder") == intruder, "the foreign pod was deleted or replaced")
    assert job_status(kube)["phase"] == "Created" and job_status(kube)["restarts"] == 0
    kube.set_pod_phase("default", "ppo-trainer-1", "Failed", exit_code=1)  # the job's own pod: replaced
    assert wait_phase(kube, "Restarting")["restarts"] == 1
    done = subprocess.run(
        ["kubectl", "delete", "lpjob", "ppo", "--wait=false"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    until(lambda: kube.get(GROUP, VERSION, PLURAL, "default", "ppo") is None, "the LPJob stayed")
    assert [p["metadata"]["name"] for p in kube.list("", "pods", "default")] == ["intruder"]
    assert _uid(kube, "intruder") == intruder
    assert [s["metadata"]["name"] for s in kube.list("", "services", "default")] == ["theirs"]
    assert [c["metadata"]["name"] for c in kube.list("", "configmaps", "default")] == ["theirs"]


def test_two_roles_of_one_name_are_refused_with_a_clear_status(kube: StandInAPIServer) -> None:
    """They passed the CRD and made clashing pods (the operator ignored the 409)."""
    lpjob = JobSpec(lpjob_name="ppo", script=["train.py"], image="img:1", num_trainer=2).to_lpjob()
    lpjob["spec"]["roles"].append({**lpjob["spec"]["roles"][0], "replicas": 1})
    kubernetes.client.CustomObjectsApi().create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, lpjob
    )
    status = wait_phase(kube, "Failed")
    assert "role 'trainer' is named more than once" in status["reason"]
    assert {c["type"]: c.get("reason") for c in status["conditions"]}["Failed"] == "Refused"
    stays(lambda: kube.list("", "pods", "default") == [], "pods of a refused job were made")


def test_an_object_of_a_childs_name_that_is_not_the_jobs_fails_it(kube: StandInAPIServer) -> None:
    """A pod named ``ppo-trainer-1`` made by hand was taken for the job's (409 ignored)."""
    theirs = _pod("ppo-trainer-1", labels={})
    _submit()
    status = wait_phase(kube, "Failed")
    assert status["reason"].startswith(
        "a Pod named ppo-trainer-1 already exists in namespace default and is not this job's"
    )
    until(lambda: _uid(kube, "ppo-trainer-0") is None, "the job's own pod stayed")
    assert _uid(kube, "ppo-trainer-1") == theirs and kube.list("", "services", "default") == []


def test_only_a_tpods_claim_is_mounted(kube: StandInAPIServer) -> None:
    """``spec.tdataClaim`` could name any claim of the namespace."""
    core = kubernetes.client.CoreV1Api()
    pvc = {"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    core.create_namespaced_persistent_volume_claim("default", {**pvc, "metadata": {"name": "db-data"}})
    _submit(set_save_path=True, tdata_claim="db-data")
    status = wait_phase(kube, "Failed")
    assert status["reason"].startswith("tdataClaim 'db-data' is not labelled tlaunch.io/tpod")
    _submit(lpjob_name="ppo2", set_save_path=True, tdata_claim="nosuch")
    assert wait_phase(kube, "Failed", "ppo2")["reason"] == (
        "tdataClaim 'nosuch': no such persistent volume claim in namespace default"
    )
    stays(lambda: kube.list("", "pods", "default") == [], "a pod mounted a claim that is not a TPod's")
    labelled = {"name": "tdata-bob", "labels": {"tlaunch.io/tpod": "bob"}}
    core.create_namespaced_persistent_volume_claim("default", {**pvc, "metadata": labelled})
    _submit(lpjob_name="ppo3", set_save_path=True, tdata_claim="tdata-bob")
    wait_phase(kube, "Created", "ppo3")
    pods = until(lambda: kube.list("", "pods", "default"), "no pods of ppo3")
    assert pods[0]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "tdata-bob"


def _kubeconfig_naming(kube: StandInAPIServer, folder: Path, namespace: str) -> str:
    """A kubeconfig for the stand-in server whose current context names ``namespace``."""
    config = json.loads(Path(kube.kubeconfig).read_text())
    config["contexts"][0]["context"]["namespace"] = namespace
    path = folder / f"kubeconfig-{namespace}"
    path.write_text(json.dumps(config))
    return str(path)


def test_one_namespace_rule_the_credentials_own_unless_one_is_named(
    kube: StandInAPIServer, tmp_path: Path
) -> None:
    """docs/k8s.md's rule, decided in one place: with a kubeconfig whose context names team-rl, tlaunchrun
    submits there and ``status NAME`` (no -n) finds that same LPJob; ``--namespace`` wins; a job server's
    job with ``kubernetes: {}`` lands in its credentials' namespace too."""
    kubernetes.client.CoreV1Api().create_namespace({"metadata": {"name": "team-rl"}})
    env = {**os.environ, "KUBECONFIG": _kubeconfig_naming(kube, tmp_path, "team-rl")}
    job = ("--lpjob_name", "ppo", "--image", "img:1", "basic", "--num_trainer", "1", "train.py")
    done = tlaunchrun(*job, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "lpjob.tlaunch.io/ppo created in namespace team-rl"
    assert kube.get(GROUP, VERSION, PLURAL, "team-rl", "ppo") is not None
    assert kube.get(GROUP, VERSION, PLURAL, "default", "ppo") is None
    status = tlaunchrun("status", "ppo", env=env)
    assert status.returncode == 0 and status.stdout.startswith("ppo: "), status.stdout + status.stderr
    dry = tlaunchrun("--dry-run", "-o", "json", *job, env=env)
    assert json.loads(dry.stdout)["metadata"]["namespace"] == "team-rl", dry.stderr
    named = tlaunchrun("--namespace", "default", *job, env=env)
    assert named.stdout.strip() == "lpjob.tlaunch.io/ppo created in namespace default", named.stderr
    assert "ppo: " in tlaunchrun("status", "ppo", "-n", "default", env=env).stdout
    for ns in ("team-rl", "default"):
        assert tlaunchrun("delete", "ppo", "-n", ns, env=env).returncode == 0
        until(lambda ns=ns: kube.get(GROUP, VERSION, PLURAL, ns, "ppo") is None, f"ppo stayed in {ns}")  # type: ignore[misc]
    pytest.importorskip("fastapi")
    from server_helpers import Server, launched, upload

    server = Server(tmp_path / "server-home", env=env)
    try:
        with server.client() as c:
            body = {
                "job_name": "onk8s",
                "trainer_package": upload(c),
                "base_image": "trainer:1",
                "kubernetes": {},
            }
            r = c.post("/v1/trainer/job", json=body)
            assert r.status_code == 201, r.text
            refs = launched(c, "onk8s")["refs"]  # answered PENDING; its LPJob is created just after
            assert refs["namespace"] == "team-rl", refs
            assert kube.get(GROUP, VERSION, PLURAL, "team-rl", "onk8s") is not None
            assert c.delete("/v1/jobs/onk8s?force=true").status_code == 200
    finally:
        server.stop()
