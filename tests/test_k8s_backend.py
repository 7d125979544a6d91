"""The Kubernetes backend end to end: ``launch(program, launch_type="k8s")``, its runs found again, groups.

Everything runs on the stand-in API server with the real operator (kopf), the
real kubernetes client and a stand-in kubelet that runs each pod's command as
a process here (the ``cluster`` fixture of ``conftest.py``). Every pod the
operator makes is validated against the Kubernetes schemas, every LPJob
against the CRD's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

kubernetes = pytest.importorskip("kubernetes")
pytest.importorskip("kopf")

import jsonschema  # noqa: E402
import kubernetes_validate  # noqa: E402

from tlaunch import control, lp_k8s  # noqa: E402
from tlaunch import lp_ssh as lp  # noqa: E402
from tlaunch.control import RunState  # noqa: E402
from tlaunch.errors import LaunchError  # noqa: E402
from tlaunch.k8s.crd import lpjob_schema  # noqa: E402
from tlaunch.lp_k8s import Config, Container, Resource, ResourceRange  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_helpers import free_port, pods_end  # noqa: E402
from programs import consumer_producers  # noqa: E402

LPJOBS = ("tlaunch.io", "v1alpha1", "lpjobs")


def _valid_pods(api: Any, ns: str = "default") -> list[dict[str, Any]]:
    pods = api.list("", "pods", ns)
    for pod in pods:
        manifest = {k: pod[k] for k in ("apiVersion", "kind", "metadata", "spec")}
        manifest["metadata"] = {
            k: v for k, v in pod["metadata"].items() if k in ("name", "namespace", "labels")
        }
        kubernetes_validate.validate(manifest, "1.32.0", strict=True)
    return pods


def _until(ok: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := ok()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return value


def _talk(n: int) -> None:
    for i in range(n):
        print(f"line {i}", flush=True)
        time.sleep(0.05)


class _Lines:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def line(self, prefix: str, text: str) -> None:
        self.lines.append((prefix, text))


def test_launch_type_k8s_runs_a_program_to_its_results(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    api, _ = cluster
    out = str(tmp_path / "out.txt")
    program = consumer_producers(out, 2)
    program.add_node(lp.PyNode(_talk, 3), label="talker")
    shown = _Lines()
    run = lp.launch(
        program, launch_type="k8s", image="repo/img:1", coordinator_port=free_port(), output=shown
    )
    with open(out) as f:
        assert f.read() == "[0, 2]"
    assert ("talker/0", "line 2") in shown.lines  # the pods' output, on the launcher's terminal
    snap = run.snapshot()
    assert snap.state is RunState.SUCCEEDED and snap.backend == "k8s"
    job = snap.refs["lpjob"]
    assert {n.key: n.state for n in snap.nodes} == {
        "producer/0": "stopped",  # servers: stopped once every node with a run() had finished
        "producer/1": "stopped",
        "consumer/0": "done",
        "talker/0": "done",
    }
    assert {n.host for n in snap.nodes} == {
        f"{job}-producer-0",
        f"{job}-producer-1",
        f"{job}-consumer-0",
        f"{job}-talker-0",
    }
    lpjob = api.get(*LPJOBS[:2], LPJOBS[2], "default", job)
    jsonschema.validate(lpjob, lpjob_schema())
    _valid_pods(api)
    found = control.find_run(run.run_id)  # from its record, as another process would
    assert found.backend == "k8s" and found.snapshot().state is RunState.SUCCEEDED
    assert [line.text for line in found.logs("talker/0")] == ["line 0", "line 1", "line 2"]
    found.stop()  # the LPJob, its pods and its Secret go; the record keeps the end
    assert api.get(*LPJOBS[:2], LPJOBS[2], "default", job) is None
    assert api.list("", "pods", "default") == [] and api.list("", "secrets", "default") == []
    again = control.find_run(run.run_id).snapshot()
    assert again.state is RunState.SUCCEEDED and len(again.nodes) == 4


def _fails() -> None:
    time.sleep(0.3)
    raise ValueError("bad batch on purpose")


def _idles() -> None:
    while not lp.wait_for_stop(0.05):
        pass


def test_a_failing_node_raises_its_own_exception_through_launch(cluster) -> None:  # type: ignore[no-untyped-def]
    _, kubelet = cluster
    program = lp.Program("failing")
    program.add_node(lp.PyNode(_idles), label="idle")
    program.add_node(lp.PyNode(_fails), label="learner")
    with pytest.raises(ValueError) as caught:
        lp.launch(program, launch_type="kubernetes", image="repo/img:1", coordinator_port=free_port())
    err = caught.value
    assert err.node == "learner/0" and err.host.endswith("-learner-0")  # type: ignore[attr-defined]
    assert "ValueError: bad batch on purpose" in err.remote_traceback  # type: ignore[attr-defined]
    (run,) = control.list_runs()
    snap = run.snapshot()
    assert snap.state is RunState.FAILED and snap.failure is not None
    assert snap.failure.node == "learner/0" and snap.failure.exception == "ValueError: bad batch on purpose"
    assert {n.key: n.state for n in snap.nodes}["idle/0"] in ("stopped", "done")
    assert pods_end(kubelet), "the idle node kept running"
    run.stop()


def test_a_k8s_launch_waits_for_its_nodes_to_be_up(cluster) -> None:  # type: ignore[no-untyped-def]
    """``Run.wait_ready`` on Kubernetes: as the pods show the nodes."""
    _, kubelet = cluster
    program = lp.Program("ready")
    program.add_node(lp.PyNode(_idles), label="idle")
    run = lp.launch(program, launch_type="k8s", image="repo/img:1", coordinator_port=free_port(), wait=False)
    try:
        assert run.wait_ready(["idle"], timeout=60)
        assert run.status()["idle/0"]["state"] == "running"
    finally:
        run.stop()
    assert pods_end(kubelet)


def test_a_pod_that_fails_before_its_node_starts_is_the_root_cause(cluster) -> None:  # type: ignore[no-untyped-def]
    """No coordinator's report (the node never reached it): the failed pod, its exit, its log's traceback."""
    api, kubelet = cluster
    program = lp.Program("crashing")
    program.add_node(lp.PyNode(_idles), label="idle")
    program.add_node(lp.PyNode(_idles), label="crasher")
    crash = ["python", "-c", "import tlaunch.k8s.pod; raise RuntimeError('no GPU driver in this image')"]
    groups = {"crasher": Config(container=Container(command=crash))}
    with pytest.raises(RuntimeError) as caught:
        lp_k8s.launch(
            program, image="repo/img:1", group_config=groups, coordinator_port=free_port(), stop_grace=0.5
        )
    err = caught.value
    assert err.node == "crasher/0" and err.host.endswith("-crasher-0")  # type: ignore[attr-defined]
    assert "exit code 1" in err.reason  # type: ignore[attr-defined]
    assert "RuntimeError: no GPU driver in this image" in err.remote_traceback  # type: ignore[attr-defined]
    assert api.list(*LPJOBS[:1], LPJOBS[2], "default") == []  # its coordinator would never end: deleted
    assert pods_end(kubelet)
    (run,) = control.list_runs()
    assert run.snapshot().failure is not None and run.snapshot().failure.node == "crasher/0"  # type: ignore[union-attr]


LAUNCHER = textwrap.dedent(
    """
    import sys, time
    from tlaunch import lp_ssh as lp

    def talk(n):
        for i in range(n):
            print("talk", i, flush=True)
            time.sleep(0.1)
        while not lp.wait_for_stop(0.05):
            pass

    p = lp.Program("chatty")
    p.add_node(lp.PyNode(talk, 5), label="talker")
    run = lp.launch(p, launch_type="k8s", image="repo/img:1", coordinator_port=int(sys.argv[1]), detach=True)
    print("RUN", run.run_id, flush=True)
    """
)


def test_another_process_follows_and_stops_an_lpjob_run(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    api, kubelet = cluster
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    done = subprocess.run(
        [sys.executable, str(script), str(free_port())], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.split("RUN ", 1)[1].split()[0]  # its launcher has exited: the job is the cluster's
    run = control.find_run(run_id)
    assert run.backend == "k8s"
    _until(lambda: run.snapshot().state is RunState.RUNNING, "never running")
    lines: list[str] = []
    follower = threading.Thread(
        target=lambda: lines.extend(str(x) for x in run.logs(follow=True)), daemon=True
    )
    follower.start()
    try:
        _until(lambda: len(lines) >= 5, f"the lines did not come: {lines}")
        snap = run.snapshot()
        assert snap.state is RunState.RUNNING and [n.key for n in snap.nodes] == ["talker/0"]
        assert snap.nodes[0].state == "running" and snap.nodes[0].host.endswith("-talker-0")
    finally:  # the follower ends with the run, before the cluster it reads from goes
        run.stop()
        follower.join(15)
    assert not follower.is_alive(), "logs(follow=True) did not end with the run"
    assert [line.rsplit("] ", 1)[1] for line in lines] == [f"talk {i}" for i in range(5)]
    assert all(line.startswith("[talker/0] ") for line in lines)
    assert run.snapshot().state is RunState.STOPPED
    assert api.list(*LPJOBS[:1], LPJOBS[2], "default") == [] and api.list("", "pods", "default") == []
    assert pods_end(kubelet)


class Learner:
    def update(self, actor: int) -> dict[str, Any]:
        return {"actor": actor, "role": os.environ.get("ROLE")}


def _act(learner: Any, i: int, out: str) -> None:
    from absl import flags

    reply = learner.update(i)
    report = {"reply": reply, "role": os.environ.get("ROLE"), "lr": flags.FLAGS.actor_lr}
    report["debug"] = flags.FLAGS.actor_debug
    with open(os.path.join(out, f"actor_{i}.json"), "w") as f:
        json.dump(report, f)


def _learner_and_actors(out: str) -> lp.Program:
    program = lp.Program("learner-actors")
    learner = program.add_node(lp.CourierNode(Learner), label="learner")
    with program.group("actor"):
        for i in range(2):
            program.add_node(lp.PyNode(_act, learner, i, out))
    return program


def test_group_config_gives_a_gpu_learner_and_cpu_actors_their_pods(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    api, _ = cluster
    toleration = kubernetes.client.V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
    groups = {
        "learner": Config(
            container=Container(
                image="repo/learner:1",
                resources=Resource(
                    cpu="2",
                    memory=ResourceRange("4Gi", "8Gi"),
                    nvidia_gpu=1,
                    nvidia_gpu_memory=8000,
                    nvidia_gpu_cores=50,
                ),
                env={"ROLE": "learner"},
            ),
            node_selector={"accelerator": "a100"},
            tolerations=[toleration],
        ),
        "actor": Config(
            container=Container(
                resources=Resource(cpu=ResourceRange("500m", "1"), memory="512Mi"),
                env={"ROLE": "actor"},
                flags=["--actor_lr=0.5", "--actor_debug"],
            ),
            priority_class_name="low",
        ),
    }
    run = lp_k8s.launch(
        _learner_and_actors(str(tmp_path)),
        image="repo/img:1",
        group_config=groups,
        coordinator_port=free_port(),
        timeout=90,
    )
    for i in range(2):  # the actors' own environment and flags reached them, and the learner's it
        with open(tmp_path / f"actor_{i}.json") as f:
            assert json.load(f) == {
                "reply": {"actor": i, "role": "learner"},
                "role": "actor",
                "lr": "0.5",
                "debug": True,
            }
    jsonschema.validate(api.get(*LPJOBS[:2], LPJOBS[2], "default", run.name), lpjob_schema())
    pods = {p["metadata"]["labels"]["tlaunch.io/role"]: p["spec"] for p in _valid_pods(api)}
    learner, actor, coordinator = pods["learner"], pods["actor"], pods["coordinator"]
    assert learner["containers"][0]["image"] == "repo/learner:1"
    assert learner["containers"][0]["resources"] == {
        "limits": {
            "nvidia.com/gpu": "1",
            "nvidia.com/gpumem": "8000",
            "nvidia.com/gpucores": "50",
            "memory": "8Gi",
        },
        "requests": {"cpu": "2", "memory": "4Gi"},
    }
    assert learner["nodeSelector"] == {"accelerator": "a100"}
    assert learner["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert actor["containers"][0]["image"] == "repo/img:1"
    assert actor["containers"][0]["resources"] == {
        "limits": {"cpu": "1"},
        "requests": {"cpu": "500m", "memory": "512Mi"},
    }
    assert actor["priorityClassName"] == "low" and "nodeSelector" not in actor
    assert (
        coordinator["containers"][0]["resources"] == {}
        and coordinator["containers"][0]["image"] == "repo/img:1"
    )
    for spec in pods.values():  # a group's environment travels in the run's Secret, not in the pod's spec
        assert "ROLE" not in {e["name"] for e in spec["containers"][0]["env"]}
    run.stop()


def test_volcano_vgpu_for_a_group_validates() -> None:
    from tlaunch.backends.k8s import manifests
    from tlaunch.k8s.children import children
    from tlaunch.plan import make_plan

    plan = make_plan(_learner_and_actors("/tmp"))
    roles = {
        "learner": Config(container=Container(resources=Resource(nvidia_gpu=2, nvidia_gpu_memory=4000))).role(
            "learner", "img:1"
        ),
        "actor": Config().role("actor", "img:1"),
    }
    job = manifests.lpjob(
        "la-1",
        "default",
        plan,
        image="img:1",
        pull_policy="Never",
        port=7070,
        gpu_stack="volcano",
        group_roles=roles,
    )
    jsonschema.validate(job, lpjob_schema())
    job["metadata"]["uid"] = "6b1d4e2a-0000-4000-8000-000000000001"
    made = {m["metadata"]["name"]: m for m in children(job)}
    for manifest in made.values():
        kubernetes_validate.validate(manifest, "1.32.0", strict=True)
    limits = made["la-1-learner-0"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"volcano.sh/vgpu-number": "2", "volcano.sh/vgpu-memory": "4000"}


def test_a_refused_owner_patch_leaves_no_secret_of_keys(cluster) -> None:  # type: ignore[no-untyped-def]
    """Issue 21 (LOW): a raw ApiException and an orphaned Secret of the run's keys, before the fix."""
    api, kubelet = cluster
    program = lp.Program("patched")
    program.add_node(lp.PyNode(_idles), label="idle")
    api.refuse("PATCH", "secrets")  # as a role that may create Secrets but not patch them
    with pytest.raises(LaunchError, match=r"the owner of its Secret .*403 Forbidden"):
        lp_k8s.launch(program, image="repo/img:1", coordinator_port=free_port())
    _until(
        lambda: not api.list("", "secrets", "default") and not api.list(*LPJOBS[:1], LPJOBS[2], "default"),
        "the Secret or the LPJob stayed",
    )
    _until(lambda: not api.list("", "pods", "default"), "pods stayed")
    assert pods_end(kubelet)
    assert control.list_runs() == []


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: lp_k8s.ReverbNode(lambda: None), "ReverbNode is not supported.*TransmitNode"),
        (lambda: lp_k8s.GitSource("https://x/y.git", None, None), "GitSource is not supported"),
        (lambda: lp_k8s.MinioSource("s3:9000", "b", "p"), "MinioSource is not supported"),
        (
            lambda: Config(namespace="team"),
            r"namespace=\.\.\.\) is not supported: a run's pods share its namespace",
        ),
        (lambda: Config(host_network=True), r"host_network=\.\.\.\) is not supported.*node_selector"),
    ],
)
def test_what_the_original_offered_and_tlaunch_does_not_is_refused(make: Any, message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        make()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"group_config": {"critic": Config()}}, r"group_config names \['critic'\].*groups of the program"),
        ({"image": None}, "group 'learner' has no image"),
        (
            {"group_config": {"actor": Config(container=Container(resources=Resource(cpu="lots")))}},
            "'lots' is not a Kubernetes quantity",
        ),
        (
            {
                "group_config": {
                    "actor": Config(container=Container(resources=Resource(nvidia_gpu=ResourceRange(1, 2))))
                }
            },
            "a GPU's request is its limit",
        ),
        (
            {"group_config": {"actor": Config(container=Container(resources=Resource(nvidia_gpu_cores=50)))}},
            "a share of each GPU; give nvidia_gpu=",
        ),
        (
            {"group_config": {"actor": Config(container=Container(command=["bash", "-c", "echo hi"]))}},
            "does not start the node",
        ),
        ({"group_config": {"actor": Config(container=Container(flags=["lr=3"]))}}, "is not --name=value"),
        ({"group_config": {"actor": Container()}}, "are not lp_k8s.Config objects"),
        ({"source": "git@x:y.git"}, "source='git@x:y.git' is not supported"),
        ({"namespace": "Team_RL"}, "is not a Kubernetes namespace name"),
        ({"kube_config": "/no/such/kubeconfig"}, "is not a file"),
    ],
)
def test_bad_k8s_launches_are_refused_before_anything_is_made(kw: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"image": "repo/img:1"}
    with pytest.raises(LaunchError, match=message):
        lp_k8s.launch(_learner_and_actors("/tmp"), **{**base, **kw})
    assert control.list_runs() == []


def _tlaunchrun(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.tlaunchrun", *args], capture_output=True, text=True, timeout=120
    )


def test_control_submits_a_job_spec_as_an_lpjob_and_follows_it(cluster) -> None:  # type: ignore[no-untyped-def]
    from tlaunch.jobs import JobSpec

    api, kubelet = cluster
    hello = ["python", "-c", "import os; print('hello from', os.environ['RANK'])"]
    run = control.submit(
        JobSpec(lpjob_name="hello", script=hello, image="img:1", num_trainer=2), control.Kubernetes()
    )
    assert run.backend == "k8s"
    assert sorted(str(line) for line in run.logs(follow=True)) == [
        "[hello-trainer-0] hello from 0",
        "[hello-trainer-1] hello from 1",
    ]
    snap = control.find_run(run.run_id).snapshot()  # the run store knows it, as tlaunch ps does
    assert snap.state is RunState.SUCCEEDED and snap.refs["phase"] == "Succeeded"
    assert [(n.key, n.state, n.exit_code) for n in snap.nodes] == [
        ("hello-trainer-0", "done", 0),
        ("hello-trainer-1", "done", 0),
    ]
    tlaunch = [sys.executable, "-m", "tlaunch.cli.main"]  # tlaunch ps/logs: the same run, as any other
    shown = subprocess.run([*tlaunch, "ps", run.run_id], capture_output=True, text=True, timeout=60)
    assert f"run {run.run_id} (hello, k8s): ended (succeeded)" in shown.stdout, shown.stdout + shown.stderr
    logs = subprocess.run([*tlaunch, "logs", run.run_id], capture_output=True, text=True, timeout=60)
    assert "[hello-trainer-1] hello from 1" in logs.stdout, logs.stdout + logs.stderr
    bad = JobSpec(
        lpjob_name="bad", script=["python", "-c", "raise ValueError('bad input 42')"], image="img:1"
    )
    failing = control.submit(bad, control.Kubernetes(namespace="default"))
    with pytest.raises(ValueError) as caught:  # the trainer's own exception, from its pod's log
        failing.wait(timeout=60)
    assert caught.value.node == "bad-trainer-0"  # type: ignore[attr-defined]
    assert "ValueError: bad input 42" in caught.value.remote_traceback  # type: ignore[attr-defined]
    status = _tlaunchrun("status", "bad")
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[:2] == [
        "bad: Failed (0/1 ready, 0 restarts)",
        "  pod bad-trainer-0 failed: exit code 1 (Error)",
    ]
    assert "  bad-trainer-0 raised ValueError: bad input 42" in status.stdout
    assert {r.run_id for r in control.list_runs()} == {run.run_id, failing.run_id}
    deleted = _tlaunchrun("delete", "bad")
    assert deleted.returncode == 0 and "lpjob.tlaunch.io/bad deleted" in deleted.stdout, deleted.stderr
    assert api.get(*LPJOBS[:2], LPJOBS[2], "default", "bad") is None
    again = control.find_run(failing.run_id).snapshot()  # its record keeps how it ended
    assert again.state is RunState.FAILED and again.failure is not None
    assert again.failure.exception == "ValueError: bad input 42"
    missing = _tlaunchrun("status", "nosuch")
    assert missing.returncode == 2 and "no LPJob 'nosuch' in namespace default" in missing.stderr
    run.stop()
    assert pods_end(kubelet)
