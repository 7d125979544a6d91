"""Installing the operator, making TPods: manifests validated offline, applied by kubectl to a stand-in."""

from __future__ import annotations

import os
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from tlaunch.errors import LaunchError
from tlaunch.k8s.deploy import operator_manifests, tpod_manifests
from tlaunch.testing.kube import StandInAPIServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop"


def _tlaunch(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.main", *args], capture_output=True, text=True, **kw
    )  # type: ignore[call-overload, no-any-return]


def test_operator_manifests_validate_and_grant_the_least() -> None:
    docs = operator_manifests("repo/tlaunch:1")
    for doc in docs:
        kubernetes_validate.validate(doc, "1.32.0", strict=True)
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert "secrets" not in rule["resources"]
    claims = [r for r in role["rules"] if "persistentvolumeclaims" in r["resources"]]
    assert claims == [{"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get"]}]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "tlaunch.k8s.operator", "--standalone"]


def test_the_kustomization_is_what_the_package_generates() -> None:
    generated = _tlaunch("k8s", "manifests", check=True).stdout
    with open(os.path.join(ROOT, "deploy", "operator.yaml")) as f:
        assert f.read() == generated, (
            "deploy/operator.yaml is stale: tlaunch k8s manifests > deploy/operator.yaml"
        )
    built = subprocess.run(
        ["kubectl", "kustomize", os.path.join(ROOT, "deploy")], capture_output=True, text=True, check=True
    )
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(built.stdout))
    assert kinds == sorted(d["kind"] for d in yaml.safe_load_all(generated))


def _kubectl_apply(text: str, kubeconfig: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "apply", "--validate=false", "-f", "-"],
        input=text,
        env={**os.environ, "KUBECONFIG": kubeconfig},
        capture_output=True,
        text=True,
    )


def test_install_is_one_command_against_the_stand_in_server() -> None:
    with StandInAPIServer() as api:
        manifests = _tlaunch("k8s", "manifests", check=True).stdout
        done = _kubectl_apply(manifests, api.kubeconfig)
        assert done.returncode == 0, done.stderr
        assert api.get("apiextensions.k8s.io", "v1", "customresourcedefinitions", None, "lpjobs.tlaunch.io")
        assert api.get("apps", "v1", "deployments", "tlaunch-system", "tlaunch-operator")
        tpod = _tlaunch("k8s", "tpod", "create", "alice", "--ssh-key", KEY, "--gpu", "2", check=True).stdout
        done = _kubectl_apply(tpod, api.kubeconfig)
        assert done.returncode == 0, done.stderr
        quota = api.get("", "v1", "resourcequotas", "tpod-alice", "tpod")
        assert quota is not None and quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "2"


def test_tpod_manifests_validate_and_mount_tdata() -> None:
    docs = tpod_manifests("alice", KEY, "repo/tlaunch:1", cpu="16", gpu=4, memory="64Gi", storage="1Ti")
    for doc in docs:
        kubernetes_validate.validate(doc, "1.32.0", strict=True)
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert "/TData/alice" in mounts
    setup = pod["spec"]["containers"][0]["command"][2]
    for folder in ("code", "data", "cache", "models"):
        assert f"/TData/alice/{folder}" in setup
    assert "/usr/sbin/sshd" in setup and "PasswordAuthentication=no" in setup
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert config["data"]["authorized_keys"] == KEY + "\n"


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"user": "Alice"}, "user='Alice' must be a DNS label"),
        ({"ssh_key": "-----BEGIN OPENSSH PRIVATE KEY-----"}, "not an OpenSSH public key"),
        ({"memory": "lots"}, "memory='lots' is not a Kubernetes quantity"),
    ],
)
def test_bad_tpod_arguments_say_what_is_valid(kw: dict[str, str], expected: str) -> None:
    args = {"user": "alice", "ssh_key": KEY, "image": "repo/tlaunch:1", **kw}
    with pytest.raises(LaunchError) as caught:
        tpod_manifests(**args)  # type: ignore[arg-type]
    assert expected in str(caught.value)


def test_a_tpod_lets_its_pod_submit_lpjobs_and_find_its_claim() -> None:
    """tlaunchrun in the TPod reads its own pod (its /TData claim) and makes LPJobs, in its namespace only."""
    docs = tpod_manifests("alice", KEY, "repo/tlaunch:1")
    by_kind = {d["kind"]: d for d in docs}
    claim = by_kind["PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == "tdata-alice"
    assert claim["metadata"]["labels"] == {"tlaunch.io/tpod": "alice"}  # what lets an LPJob mount it
    pod = by_kind["Pod"]["spec"]
    assert pod["serviceAccountName"] == by_kind["ServiceAccount"]["metadata"]["name"] == "tpod"
    env = pod["containers"][0]["env"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in env
    role, binding = by_kind["Role"], by_kind["RoleBinding"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "tpod-alice"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tpod", "namespace": "tpod-alice"}]
    grants = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert grants[("tlaunch.io", "lpjobs")] >= {"create", "get", "list", "delete"}
    assert grants[("", "pods")] == {"get", "list", "watch"}  # pods only through LPJobs (the operator)
    assert not any(r in ("secrets", "*") for _, r in grants)
