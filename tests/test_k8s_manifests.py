"""LPJob manifests: tlaunchrun's arguments to an LPJob, an LPJob to its children, all validated offline.

Core manifests (Pod, Service, ConfigMap, the CRD) against the Kubernetes
schemas with ``kubernetes-validate`` (strict); every LPJob against the CRD's
own ``openAPIV3Schema`` with ``jsonschema``.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tlaunch.errors import LaunchError
from tlaunch.jobs import JobSpec
from tlaunch.k8s.children import children, run_secret_name
from tlaunch.k8s.crd import crd, lpjob_schema
from tlaunch.k8s.incluster import InPod, tdata_claim_of

K8S = "1.32.0"


def _valid(manifest: dict[str, Any]) -> None:
    if manifest["apiVersion"].startswith("scheduling.volcano.sh/"):  # not a Kubernetes schema
        assert manifest["spec"]["minMember"] >= 1
        return
    kubernetes_validate.validate(manifest, K8S, strict=True)


def _job(**kw: Any) -> JobSpec:
    base: dict[str, Any] = {
        "lpjob_name": "ppo",
        "script": ["train.py", "--lr", "3e-4"],
        "image": "pytorch/pytorch:2.4.0",
    }
    return JobSpec(**{**base, **kw})


def _with_uid(lpjob: dict[str, Any]) -> dict[str, Any]:
    lpjob["metadata"]["uid"] = "6b1d4e2a-0000-4000-8000-000000000001"
    return lpjob


def test_the_crd_is_a_valid_custom_resource_definition() -> None:
    _valid(crd())
    version = crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["State", "Roles", "Restarts", "Age"]


@pytest.mark.parametrize(
    "kw",
    [
        {"method": "basic", "num_trainer": 3, "set_share_file": True, "tdata_claim": "tdata-alice"},
        {
            "method": "torchrun",
            "num_trainer": 4,
            "nnodes": "2:4",
            "nproc_per_node": 8,
            "max_restarts": 3,
            "gpu": 8,
        },
        {"method": "deepspeed", "num_trainer": 2, "nproc_per_node": 4, "gpu": 4, "gpu_memory": 20000},
        {
            "gpu": 1,
            "gpu_memory": 8000,
            "gpu_cores": 50,
            "gang": True,
            "gpu_stack": "volcano",
            "num_trainer": 2,
        },
        {
            "set_save_path": True,
            "set_checkpoint_path": True,
            "tdata_claim": "tdata-bob",
            "image_pull_policy": "Always",
        },
    ],
)
def test_jobs_become_lpjobs_and_children_that_validate(kw: dict[str, Any]) -> None:
    lpjob = _job(**kw).to_lpjob()
    jsonschema.validate(lpjob, lpjob_schema())
    made = children(_with_uid(lpjob))
    for manifest in made:
        _valid(manifest)
        assert manifest["metadata"]["ownerReferences"][0]["kind"] == "LPJob"
    pods = [m for m in made if m["kind"] == "Pod"]
    assert len(pods) == kw.get("num_trainer", 1)
    assert [p["metadata"]["name"] for p in pods] == [f"ppo-trainer-{i}" for i in range(len(pods))]
    assert all(p["spec"]["subdomain"] == "ppo" for p in pods)
    (service,) = [m for m in made if m["kind"] == "Service"]
    assert service["spec"]["clusterIP"] == "None"


def test_basic_trainers_get_rank_world_size_and_the_share_file() -> None:
    """A basic pod gets what a basic trainer gets on every backend (docs/torch.md's table)."""
    made = children(_with_uid(_job(num_trainer=2, set_share_file=True, tdata_claim="tdata-alice").to_lpjob()))
    pod = [m for m in made if m["kind"] == "Pod"][1]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    ranks = (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"])
    assert ranks == ("1", "2", "0", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("ppo-trainer-0.ppo.default.svc", "29500")
    assert env["TLAUNCH_NUM_TRAINER"] == "2" and env["TLAUNCH_SHARE_FILE"] == "/TData/models/ppo/share_file"
    command = pod["spec"]["containers"][0]["command"]
    assert command[:2] == ["sh", "-c"] and "/TData/code/setup.sh" in command[2]
    assert command[2].endswith(
        "exec python train.py --lr 3e-4 --rank 1 --world_size 2 --share_file /TData/models/ppo/share_file"
    )
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "tdata-alice"


def test_basic_rank_arguments_and_master_port_are_the_jobs_to_set() -> None:
    lpjob = _job(num_trainer=2, rank_args=False).to_lpjob()
    assert lpjob["spec"]["basic"] == {"rankArgs": False}
    lpjob["spec"]["basic"]["masterPort"] = 23456
    jsonschema.validate(lpjob, lpjob_schema())
    pod = [m for m in children(_with_uid(lpjob)) if m["kind"] == "Pod"][1]
    assert pod["spec"]["containers"][0]["command"] == ["python", "train.py", "--lr", "3e-4"]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["MASTER_PORT"] == "23456"
    assert _job(num_trainer=2).to_lpjob()["spec"]["basic"] == {"rankArgs": True}
    too_high = {**lpjob, "spec": {**lpjob["spec"], "basic": {"masterPort": 70000}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(too_high, lpjob_schema())
    with pytest.raises(LaunchError, match=r"rank_args=False: method torchrun takes no rank_args"):
        _job(method="torchrun", rank_args=False)


def test_save_and_checkpoint_paths_are_added_to_every_trainer() -> None:
    made = children(_with_uid(_job(set_save_path=True, set_checkpoint_path=True, tdata_claim="t").to_lpjob()))
    command = made[-1]["spec"]["containers"][0]["command"][2]
    assert "--save_path /TData/models/ppo --checkpoint_path /TData/models/ppo/last.tar.gz" in command
    assert command.startswith("mkdir -p /TData/models/ppo && ")  # the job's folder exists before it runs


def test_torchrun_rendezvous_through_the_headless_service() -> None:
    made = children(
        _with_uid(_job(method="torchrun", num_trainer=3, nnodes="2:3", nproc_per_node=2).to_lpjob())
    )
    command = made[-1]["spec"]["containers"][0]["command"]
    assert command[:4] == ["torchrun", "--nnodes=2:3", "--nproc-per-node=2", "--max-restarts=0"]
    assert "--rdzv-endpoint=ppo-trainer-0.ppo.default.svc:29400" in command
    assert command[-3:] == ["train.py", "--lr", "3e-4"]


def test_deepspeed_gets_a_hostfile_and_its_per_node_launcher() -> None:
    made = children(_with_uid(_job(method="deepspeed", num_trainer=2, nproc_per_node=4).to_lpjob()))
    (config,) = [m for m in made if m["kind"] == "ConfigMap"]
    assert config["data"]["hostfile"] == (
        "ppo-trainer-0.ppo.default.svc slots=4\nppo-trainer-1.ppo.default.svc slots=4\n"
    )
    command = made[-1]["spec"]["containers"][0]["command"]
    assert command[:3] == ["python", "-m", "deepspeed.launcher.launch"] and "--node_rank=1" in command
    info = next(a for a in command if a.startswith("--world_info="))[len("--world_info=") :]
    assert json.loads(base64.urlsafe_b64decode(info)) == {
        "ppo-trainer-0.ppo.default.svc": [0, 1, 2, 3],
        "ppo-trainer-1.ppo.default.svc": [0, 1, 2, 3],
    }


@pytest.mark.parametrize(
    ("stack", "expected"),
    [
        ("hami", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "30"}),
        (
            "volcano",
            {"volcano.sh/vgpu-number": "2", "volcano.sh/vgpu-memory": "8000", "volcano.sh/vgpu-cores": "30"},
        ),
    ],
)
def test_gpu_resources_follow_the_vgpu_stack(stack: str, expected: dict[str, str]) -> None:
    made = children(_with_uid(_job(gpu=2, gpu_memory=8000, gpu_cores=30, gpu_stack=stack).to_lpjob()))
    assert made[-1]["spec"]["containers"][0]["resources"]["limits"] == expected


def test_gang_scheduling_makes_a_podgroup_of_every_replica() -> None:
    made = children(_with_uid(_job(num_trainer=3, gang=True).to_lpjob()))
    (group,) = [m for m in made if m["kind"] == "PodGroup"]
    assert group["spec"]["minMember"] == 3
    pods = [m for m in made if m["kind"] == "Pod"]
    assert all(p["spec"]["schedulerName"] == "volcano" for p in pods)
    assert all(p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "ppo" for p in pods)


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        (
            {"image_pull_policy": "Sometimes"},
            "image_pull_policy='Sometimes' is not one of ['Always', 'IfNotPresent', 'Never']",
        ),
        ({"lpjob_name": "PPO_run"}, "lpjob_name='PPO_run' is not a valid job name"),
        (
            {"method": "horovod"},
            "method='horovod' is not one of ['basic', 'torchrun', 'deepspeed', 'command', 'program', "
            "'function']",
        ),
        ({"gpu_cores": 150, "gpu": 1}, "gpu_cores=150 must be a percent"),
        ({"gpu_memory": 4000}, "give gpu= (GPUs per pod)"),
        ({"gang": True, "gpu": 1}, "HAMi's admission webhook ignores pods scheduled by Volcano"),
        ({"method": "torchrun", "nnodes": "4:2", "num_trainer": 4}, "MIN is more than MAX"),
        ({"method": "torchrun", "nnodes": "2:8", "num_trainer": 4}, "drop num_trainer, or make it 8"),
        ({"set_save_path": True}, "needs a persistent volume: pass tdata_claim="),
        ({"script": "train.py"}, "must be the program and its arguments, as a list"),
        ({"num_trainer": -1}, "num_trainer=-1 must be a whole number from 1"),
        ({"working_dir": "code"}, "working_dir='code' must be an absolute path in the pods"),
    ],
)
def test_bad_job_arguments_say_what_is_valid(kw: dict[str, Any], expected: str) -> None:
    with pytest.raises(LaunchError) as caught:
        _job(**kw).to_lpjob()  # (files under /TData need a claim: a Kubernetes target's rule)
    assert expected in str(caught.value)


def test_the_lpjob_schema_refuses_what_the_crd_forbids() -> None:
    lpjob = _job().to_lpjob()
    lpjob["spec"]["imagePullPolicy"] = "Sometimes"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(lpjob, lpjob_schema())
    lpjob = _job().to_lpjob()
    lpjob["spec"]["roles"][0]["replicas"] = 0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(lpjob, lpjob_schema())


@pytest.fixture(autouse=True)
def _not_in_a_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Whatever machine runs the tests, tlaunchrun here is not in a pod (no service account folder)."""
    monkeypatch.setenv("TLAUNCH_SERVICE_ACCOUNT_DIR", str(tmp_path / "no-service-account"))


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.tlaunchrun", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "method",
    [
        ["basic", "--num_trainer", "2", "--set_share_file", "train.py"],
        [
            "torchrun",
            "--num_trainer",
            "4",
            "--nnodes",
            "2:4",
            "--nproc_per_node",
            "8",
            "--max_restarts",
            "3",
            "train.py",
        ],
        [
            "deepspeed",
            "--num_trainer",
            "2",
            "--nproc_per_node",
            "4",
            "train.py",
            "--deepspeed_config",
            "ds.json",
        ],
    ],
)
def test_tlaunchrun_dry_run_prints_a_valid_lpjob(method: list[str]) -> None:
    done = _run(
        "--lpjob_name", "ppo", "--image", "repo/img:1", "--tdata_claim", "tdata-alice", "--set_save_path",
        "--dry-run", "-o", "yaml", "--show-children", *method,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    docs = list(yaml.safe_load_all(done.stdout))
    jsonschema.validate(docs[0], lpjob_schema())
    assert docs[0]["spec"]["launcher"] == method[0]
    for manifest in docs[1:]:
        manifest["metadata"]["ownerReferences"][0]["uid"] = "6b1d4e2a-0000-4000-8000-000000000001"
        _valid(manifest)
    assert len([d for d in docs if d["kind"] == "Pod"]) == int(method[2])


def test_tlaunchrun_refuses_bad_arguments_before_sending_anything() -> None:
    done = _run("--lpjob_name", "ppo", "--image", "i", "--image_pull_policy", "Sometimes", "basic", "t.py")
    assert done.returncode == 2
    assert "image_pull_policy='Sometimes' is not one of ['Always', 'IfNotPresent', 'Never']" in done.stderr
    done = _run("--image", "i", "basic", "t.py")
    assert done.returncode == 2 and "--lpjob_name must be given" in done.stderr


def test_tlaunchrun_help_documents_every_argument_of_the_seed() -> None:
    text = _run("torchrun", "--help").stdout + _run("basic", "--help").stdout
    for arg in (
        "--lpjob_name", "--namespace", "--image", "--image_pull_policy", "--gpu", "--gpu_memory",
        "--gpu_cores", "--set_save_path", "--set_checkpoint_path", "--num_trainer", "--set_share_file",
        "--nnodes", "--nproc_per_node", "--max_restarts", "--dry-run",
    ):  # fmt: skip
        assert arg in text, arg
    assert "Always" in text and "IfNotPresent" in text and "Never" in text


def test_tlaunchrun_backend_slurm_dry_run_prints_the_batch_script() -> None:
    done = _run(
        "--backend", "slurm", "--lpjob_name", "elastic", "--gpu", "4", "--partition", "gpu",
        "--time", "2:00:00", "--dry-run",
        "torchrun", "--num_trainer", "4", "--nnodes", "2:4", "--nproc_per_node", "4", "train.py",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert (
        "#SBATCH --nodes=4\n#SBATCH --gpus-per-node=4\n#SBATCH --partition=gpu\n#SBATCH --time=2:00:00\n"
        in text
    )
    assert (
        "-m tlaunch.control.starting.jobmain " in text and "tlaunch.cli" not in text
    )  # the job's file, not argv
    job = json.loads(text.rsplit("\n# ", 1)[1])["job"]
    assert (job["method"], job["nnodes"], job["nproc_per_node"], job["max_restarts"]) == (
        "torchrun",
        "2:4",
        4,
        0,
    )
    assert job["script"] == ["train.py"]
    refused = _run(
        "--backend", "slurm", "--lpjob_name", "x", "--gpu", "1", "--gpu_memory", "9", "basic", "t.py"
    )
    assert refused.returncode == 2 and "are Kubernetes settings" in refused.stderr


def test_torchrun_pods_follow_nnodes_as_in_the_seed() -> None:
    """The seed gives torchrun no num_trainer: ``--nnodes 2`` is 2 pods, ``--nnodes 1:3`` is 3."""
    for nnodes, pods in (("2", 2), ("1:3", 3)):
        lpjob = _job(method="torchrun", nnodes=nnodes, nproc_per_node=4).to_lpjob()
        jsonschema.validate(lpjob, lpjob_schema())
        made = [m for m in children(_with_uid(lpjob)) if m["kind"] == "Pod"]
        assert len(made) == pods
        assert f"--nnodes={nnodes}" in made[0]["spec"]["containers"][0]["command"]
    assert _job(method="torchrun", num_trainer=2).to_lpjob()["spec"]["torchrun"]["nnodes"] == "2"
    assert _job(method="torchrun", nnodes="2", num_trainer=2).num_trainer == 2
    assert _job(method="torchrun").num_trainer == 1 and _job().num_trainer == 1


def test_a_setup_script_path_is_one_word_of_the_shell(tmp_path: Any) -> None:
    """``setupScript`` was pasted into ``sh -c`` unquoted: a space split it, ``$(...)`` ran."""
    marker = tmp_path / "ran"
    setup = tmp_path / "my setup $(touch ran).sh"
    setup.write_text("echo setup-ran\n")
    lpjob = _job(tdata_claim="tdata-alice").to_lpjob()
    lpjob["spec"]["setupScript"] = str(setup)
    lpjob["spec"]["roles"][0]["command"] = ["echo", "main"]
    jsonschema.validate(lpjob, lpjob_schema())
    command = children(_with_uid(lpjob))[-1]["spec"]["containers"][0]["command"]
    assert command[:2] == ["sh", "-c"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["setup-ran", "main", "--rank", "0", "--world_size", "1"]
    assert not marker.exists(), "a command in the setup script's name ran"


def test_every_pod_names_each_environment_variable_once() -> None:
    """POD_NAME and POD_IP were listed twice; a role's own variable replaces tlaunch's of that name."""
    lpjob = _job(num_trainer=2, set_share_file=True, tdata_claim="t", env={"RANK": "9", "A": "1"}).to_lpjob()
    for pod in (m for m in children(_with_uid(lpjob)) if m["kind"] == "Pod"):
        _valid(pod)
        env = pod["spec"]["containers"][0]["env"]
        names = [e["name"] for e in env]
        assert len(names) == len(set(names)), names
        assert {"POD_NAME", "POD_IP", "TLAUNCH_SHARE_FILE", "A"} <= set(names)
        assert {e["name"]: e.get("value") for e in env}["RANK"] == "9"


def test_run_files_mount_the_jobs_own_secret_and_no_other() -> None:
    """``spec.runSecret`` named any Secret of the namespace; now the name follows from the job's."""
    assert run_secret_name("ppo") == "tlaunch-run-ppo"
    properties = lpjob_schema()["properties"]["spec"]["properties"]
    assert "runSecret" not in properties and properties["runFiles"]["type"] == "boolean"
    lpjob = _job().to_lpjob()
    lpjob["spec"].update(runFiles=True, runSecret="db-password")  # (a real API server prunes runSecret)
    pods = [m for m in children(_with_uid(lpjob)) if m["kind"] == "Pod"]
    secrets = [v["secret"]["secretName"] for p in pods for v in p["spec"]["volumes"] if "secret" in v]
    assert secrets == ["tlaunch-run-ppo"]
    assert pods[0]["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "run", "mountPath": "/etc/tlaunch-run", "readOnly": True}
    ]
    _valid(pods[0])
    lpjob["spec"]["runFiles"] = False
    assert all("volumes" not in m["spec"] for m in children(_with_uid(lpjob)) if m["kind"] == "Pod")


def test_the_crd_refuses_two_roles_of_one_name() -> None:
    """The API server refuses a `map` list's duplicate keys: two roles of one name never reach it."""
    roles = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert roles["roles"]["x-kubernetes-list-type"] == "map"
    assert roles["roles"]["x-kubernetes-list-map-keys"] == ["name"]
    assert "name" in roles["roles"]["items"]["required"]  # (a map list's key must be required)
    _valid(crd())


def test_a_working_dir_becomes_the_containers() -> None:
    lpjob = _job(tdata_claim="tdata-alice", working_dir="/TData/code/mnist").to_lpjob()
    jsonschema.validate(lpjob, lpjob_schema())
    pod = children(_with_uid(lpjob))[-1]
    _valid(pod)
    assert pod["spec"]["containers"][0]["workingDir"] == "/TData/code/mnist"


def test_the_claim_under_tdata_is_found_in_a_pods_manifest() -> None:
    def pod(*mounts: tuple[str, str]) -> dict[str, Any]:
        volumes = [
            {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, (c, _) in enumerate(mounts)
        ]
        volumes.append({"name": "cfg", "configMap": {"name": "c"}})
        container = {"volumeMounts": [{"name": f"v{i}", "mountPath": p} for i, (_, p) in enumerate(mounts)]}
        container["volumeMounts"].append({"name": "cfg", "mountPath": "/TData/etc"})
        return {"spec": {"volumes": volumes, "containers": [container]}}

    assert tdata_claim_of(pod(("tdata-alice", "/TData/alice"))) == ("tdata-alice", "/TData/alice")
    assert tdata_claim_of(pod(("x", "/TData/alice/cache"), ("t", "/TData/"))) == ("t", "/TData")
    assert tdata_claim_of(pod(("home", "/home/alice"), ("o", "/TDataX"))) is None
    assert tdata_claim_of({"spec": {"containers": [{}]}}) is None


def test_the_working_dir_of_job_pods_is_this_folders_place_in_the_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TLAUNCH_MOUNT_ROOT", raising=False)
    here = InPod("tpod-alice", "dev", "tdata-alice", "/TData/alice", "the pod's volumes")
    assert here.working_dir("/TData/alice/code/mnist") == "/TData/code/mnist"
    assert here.working_dir("/TData/alice") == "/TData"
    assert here.working_dir("/TData/alicex/code") is None
    assert here.working_dir("/home/alice") is None
    assert InPod("tpod-alice", "dev").working_dir("/TData/alice") is None
    monkeypatch.setenv("TLAUNCH_MOUNT_ROOT", "/tmp/root")
    assert here.working_dir("/tmp/root/TData/alice/code") == "/TData/code"
