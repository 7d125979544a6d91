"""The seed's own commands, unchanged but for the image, in a user's TPod: dry run, then submitted.

``examples/test_k8s/torchrun/MNIST/run.sh`` and ``examples/test_k8s/basic/MNIST/run.sh``
of the original TLaunch (TARTRL/TLaunch) are run as their authors wrote them,
from the TPod's code folder, against the stand-in API server with the real
operator: this process plays the TPod's development pod (its service account
folder, ``$POD_NAME``, its ``/TData/alice`` under ``$TLAUNCH_MOUNT_ROOT``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

pytest.importorskip("kopf")
kubernetes = pytest.importorskip("kubernetes")

from kube_helpers import operator_running, tlaunchrun, until, wait_phase  # noqa: E402

from tlaunch.k8s.crd import lpjob_schema  # noqa: E402
from tlaunch.k8s.deploy import tpod_manifests  # noqa: E402
from tlaunch.testing.kube import StandInAPIServer  # noqa: E402


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandInAPIServer]:
    """The stand-in server with the LPJob CRD installed, and the operator running against it."""
    with operator_running(monkeypatch, tmp_path) as api:
        yield api


TORCHRUN_RUN_SH = """#!/bin/bash
tlaunchrun --lpjob_name mnist --image repo/mnist:1 --gpu 4 --gpu_memory 10000 \\
        --gpu_cores 100 --set_save_path torchrun --nnodes 2 --nproc_per_node 4 \\
\ttrain.py --save-model
"""
BASIC_RUN_SH = """#!/bin/bash
tlaunchrun --lpjob_name mnist --image repo/mnist:1 --gpu 1 --gpu_memory 10000 \\
        --gpu_cores 100 --set_save_path basic --num_trainer 2 --set_share_file \\
        train.py"""
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop"


def _args(run_sh: str) -> list[str]:
    """The arguments of the run.sh's ``tlaunchrun`` line (as bash reads it: ``\\`` newline joins lines)."""
    words = shlex.split(run_sh.split("\n", 1)[1].replace("\\\n", " "))
    assert words[0] == "tlaunchrun"
    return words[1:]


@pytest.fixture
def tpod(kube: StandInAPIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Alice's TPod on the stand-in server, and this process as if in its pod: its code folder in /TData."""
    text = "---\n".join(yaml.safe_dump(d) for d in tpod_manifests("alice", KEY, "repo/tlaunch:1"))
    done = subprocess.run(
        ["kubectl", "apply", "--validate=false", "-f", "-"], input=text, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    account = tmp_path / "serviceaccount"  # the pod's /var/run/secrets/kubernetes.io/serviceaccount
    account.mkdir()
    (account / "namespace").write_text("tpod-alice")
    monkeypatch.setenv("TLAUNCH_SERVICE_ACCOUNT_DIR", str(account))
    monkeypatch.setenv("POD_NAME", "dev")  # (the TPod sets it from the downward API)
    monkeypatch.setenv("TLAUNCH_MOUNT_ROOT", str(tmp_path / "root"))  # the pod's /TData/alice is here
    code = tmp_path / "root" / "TData" / "alice" / "code" / "mnist"
    code.mkdir(parents=True)
    return code


def _dry_run(run_sh: str, cwd: Path) -> list[dict[str, Any]]:
    done = tlaunchrun("--dry-run", "-o", "yaml", "--show-children", *_args(run_sh), cwd=cwd)
    assert done.returncode == 0, done.stderr
    docs = list(yaml.safe_load_all(done.stdout))
    jsonschema.validate(docs[0], lpjob_schema())
    for manifest in docs[1:]:
        manifest["metadata"]["ownerReferences"][0]["uid"] = "6b1d4e2a-0000-4000-8000-000000000001"
        kubernetes_validate.validate(manifest, "1.32.0", strict=True)
    return docs


def _submit_run_sh(kube: StandInAPIServer, run_sh: str, cwd: Path) -> list[dict[str, Any]]:
    """``bash run.sh`` as the user would, in the TPod's code folder; the job's pods, once made."""
    (cwd / "run.sh").write_text(run_sh)
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]  # tlaunchrun, installed
    done = subprocess.run(
        ["bash", "run.sh"],
        cwd=cwd,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "lpjob.tlaunch.io/mnist created in namespace tpod-alice"
    return until(  # type: ignore[no-any-return]
        lambda: (
            len(kube.list("", "pods", "tpod-alice", "tlaunch.io/job=mnist")) == 2
            and kube.list("", "pods", "tpod-alice", "tlaunch.io/job=mnist")
        ),
        "the job's pods were not made",
    )


def _kubectl_shows_it_running(kube: StandInAPIServer) -> None:
    for i in range(2):
        kube.set_pod_phase("tpod-alice", f"mnist-trainer-{i}", "Running")
    wait_phase(kube, "Running", "mnist", "tpod-alice")
    shown = subprocess.run(
        ["kubectl", "get", "lpjobs", "-n", "tpod-alice"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert shown[0].split() == ["NAME", "STATE", "ROLES", "RESTARTS", "AGE"]
    assert shown[1].split()[:4] == ["mnist", "Running", "2/2", "0"]


def test_the_seeds_torchrun_command_runs_unchanged_in_a_tpod(kube: StandInAPIServer, tpod: Path) -> None:
    """It was refused ("raise num_trainer to 2"): torchrun's pods follow --nnodes; /TData is the TPod's."""
    docs = _dry_run(TORCHRUN_RUN_SH, tpod)
    spec = docs[0]["spec"]
    assert docs[0]["metadata"] == {"name": "mnist", "namespace": "tpod-alice"}
    assert (spec["tdataClaim"], spec["workingDir"], spec["savePath"]) == (
        "tdata-alice",
        "/TData/code/mnist",
        "/TData/models/mnist",
    )
    assert spec["torchrun"]["nnodes"] == "2" and spec["torchrun"]["nprocPerNode"] == 4
    assert spec["roles"][0]["replicas"] == 2
    assert spec["roles"][0]["resources"] == {"gpu": 4, "gpuMemory": 10000, "gpuCores": 100}
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert len(pods) == 2
    container = pods[1]["spec"]["containers"][0]
    assert container["workingDir"] == "/TData/code/mnist"
    assert "exec torchrun --nnodes=2 --nproc-per-node=4 " in container["command"][2]
    assert container["command"][2].endswith("train.py --save-model --save_path /TData/models/mnist")
    assert container["resources"]["limits"] == {
        "nvidia.com/gpu": "4",
        "nvidia.com/gpumem": "10000",
        "nvidia.com/gpucores": "100",
    }
    made = _submit_run_sh(kube, TORCHRUN_RUN_SH, tpod)
    assert all(p["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "tdata-alice" for p in made)
    _kubectl_shows_it_running(kube)


def test_the_seeds_basic_command_runs_unchanged_in_a_tpod(kube: StandInAPIServer, tpod: Path) -> None:
    """It was refused ("pass tdata_claim="): in a TPod, tlaunchrun finds its namespace and claim itself."""
    docs = _dry_run(BASIC_RUN_SH, tpod)
    spec = docs[0]["spec"]
    assert docs[0]["metadata"]["namespace"] == "tpod-alice" and spec["tdataClaim"] == "tdata-alice"
    assert spec["shareFile"] == "/TData/models/mnist/share_file" and spec["roles"][0]["replicas"] == 2
    pods = [d for d in docs if d["kind"] == "Pod"]
    env = {e["name"]: e.get("value") for e in pods[1]["spec"]["containers"][0]["env"]}
    assert (env["RANK"], env["WORLD_SIZE"], env["TLAUNCH_SHARE_FILE"]) == ("1", "2", spec["shareFile"])
    assert pods[1]["spec"]["containers"][0]["command"][2].endswith(  # the arguments its train.py reads
        "exec python train.py --save_path /TData/models/mnist --rank 1 --world_size 2 "
        "--share_file /TData/models/mnist/share_file"
    )
    made = _submit_run_sh(kube, BASIC_RUN_SH, tpod)
    assert all(p["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "tdata-alice" for p in made)
    _kubectl_shows_it_running(kube)


def test_in_a_pod_the_claim_comes_from_the_pod_else_from_the_tpod_convention(
    kube: StandInAPIServer, tpod: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    claim = {"name": "t", "persistentVolumeClaim": {"claimName": "alice-scratch"}}
    mount = {"name": "t", "mountPath": "/TData"}
    body = {
        "metadata": {"name": "dev2"},
        "spec": {"volumes": [claim], "containers": [{"name": "c", "image": "i", "volumeMounts": [mount]}]},
    }
    kubernetes.client.CoreV1Api().create_namespaced_pod("tpod-alice", body)
    monkeypatch.setenv("POD_NAME", "dev2")  # a pod that mounts another claim at /TData itself
    spec = _dry_run(BASIC_RUN_SH, tpod)[0]["spec"]
    assert (spec["tdataClaim"], spec["workingDir"]) == ("alice-scratch", "/TData/alice/code/mnist")
    monkeypatch.setenv("POD_NAME", "nosuch")  # the API cannot say: the TPod's naming convention
    spec = _dry_run(BASIC_RUN_SH, tpod)[0]["spec"]
    assert (spec["tdataClaim"], spec["workingDir"]) == ("tdata-alice", "/TData/code/mnist")
    other = tlaunchrun("--namespace", "team", "--dry-run", *_args(BASIC_RUN_SH), cwd=tpod)
    assert other.returncode == 2 and "pass tdata_claim=" in other.stderr  # (the claim is tpod-alice's)


def test_outside_a_pod_tlaunchrun_asks_for_the_claim(kube: StandInAPIServer, tmp_path: Path) -> None:
    done = tlaunchrun("--dry-run", *_args(BASIC_RUN_SH), cwd=tmp_path)
    assert done.returncode == 2
    assert "put files under /TData, which needs a persistent volume: pass tdata_claim=" in done.stderr
    assert "or run tlaunchrun inside your TPod" in done.stderr


def test_in_a_pod_without_a_kubeconfig_the_client_uses_its_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tlaunch.k8s.incluster import load_config

    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("t0ken")
    (account / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("TLAUNCH_SERVICE_ACCOUNT_DIR", str(account))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(kubernetes.config.ConfigException, match=r"not in a pod .* set KUBECONFIG"):
        load_config(kubernetes)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    before = kubernetes.client.Configuration.get_default_copy()
    try:
        load_config(kubernetes)
        now = kubernetes.client.Configuration.get_default_copy()
        assert now.host == "https://10.96.0.1:443" and now.api_key["BearerToken"] == "bearer t0ken"
        assert now.ssl_ca_cert == str(account / "ca.crt")
    finally:
        kubernetes.client.Configuration.set_default(before)
