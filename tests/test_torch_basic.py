"""basic mode as the original TLaunch's authors use it, and what every trainer gets (docs/torch.md's table).

Their basic MNIST example reads ``--rank``, ``--world_size`` and ``--share_file``
from its command line and meets its peers with
``init_process_group(init_method=f"file://{share_file}", ...)``;
``examples/torch/basic_train.py`` is that set-up on random tensors (gloo, no
dataset), and it meets through ``MASTER_ADDR`` (``env://``) when it has no
shared file. Here: ``tlaunch basic`` on this machine, as a user runs it (the
CLI in a new process), and a basic LPJob's pods (the real operator, the
stand-in API server and kubelet). SSH hosts: ``test_torch_ssh.py``; SLURM:
``test_torch_slurm.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "torch" / "basic_train.py"

DUMP = """
import json, os, sys
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "TLAUNCH_NUM_TRAINER", "TLAUNCH_SHARE_FILE", "GLOO_SOCKET_IFNAME")
print("TRAINER " + json.dumps({"argv": sys.argv[1:], **{n: os.environ.get(n) for n in names}}), flush=True)
"""


def _tlaunch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def met(output: str, world: int, how: str) -> None:
    """Every rank of ``world`` says it met the others by ``how``, and they ended with the same weights."""
    for rank in range(world):
        said = f"rank {rank} of {world} (arguments: rank {rank} of {world}) met by {how}"
        assert said in output, output
    done = re.findall(rf"rank \d+ of {world} done: weights (\S+), the same on every rank", output)
    assert len(done) == world and len(set(done)) == 1, output


def test_the_authors_basic_setup_joins_one_group_through_the_share_file(tmp_path: Path) -> None:
    """It saw ``world_size == 1`` in every trainer and trained alone, silently."""
    done = _tlaunch(
        "basic", "--num-trainer", "2", "--set-share-file", str(EXAMPLE), "--steps", "2", cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (share,) = os.listdir(tmp_path / "tlaunch-share")
    met(done.stdout, 2, f"file://{tmp_path / 'tlaunch-share' / share}")


def test_an_env_init_script_joins_through_master_addr(tmp_path: Path) -> None:
    done = _tlaunch("basic", "--num-trainer", "2", str(EXAMPLE), "--steps", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    met(done.stdout, 2, "env://")


def _trainers(output: str) -> dict[int, dict[str, Any]]:
    found = [json.loads(line.split("TRAINER ", 1)[1]) for line in output.splitlines() if "TRAINER " in line]
    return {int(t["RANK"]): t for t in found}


def test_every_trainer_gets_the_table(tmp_path: Path) -> None:
    """docs/torch.md's table, on this machine; the job's own values win; rank arguments can be turned off."""
    (tmp_path / "dump.py").write_text(DUMP)
    share = str(tmp_path / "s" / "f")
    done = _tlaunch("basic", "--num-trainer", "3", "--share-file", share, "dump.py", "--x", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    trainers = _trainers(done.stdout)
    port = trainers[0]["MASTER_PORT"]
    assert port.isdigit()
    for rank, t in trainers.items():
        assert t == {
            "argv": ["--x", "--rank", str(rank), "--world_size", "3", "--share_file", share],
            "RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "3",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TLAUNCH_NUM_TRAINER": "3",
            "TLAUNCH_SHARE_FILE": share, "GLOO_SOCKET_IFNAME": "lo",
        }  # fmt: skip
    done = _tlaunch("basic", "--num-trainer", "2", "--no-rank-args", "--env", "MASTER_PORT=29999", "dump.py",
                    "--x", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    trainers = _trainers(done.stdout)
    assert [t["argv"] for t in trainers.values()] == [["--x"], ["--x"]]
    assert {t["MASTER_PORT"] for t in trainers.values()} == {"29999"}
    assert trainers[1]["TLAUNCH_SHARE_FILE"] is None


# -- Kubernetes: a basic LPJob's pods ----------------------------------------------------


def _lpjob(name: str, share_file: Path | None, port: int) -> dict[str, Any]:
    """A basic LPJob of two pods running the example (their image: this machine's python)."""
    from tlaunch.jobs import JobSpec

    lpjob = JobSpec(
        lpjob_name=name, script=[str(EXAMPLE), "--steps", "2"], image="none", num_trainer=2
    ).to_lpjob()
    if share_file is not None:
        # The LPJob's shareFile, on a filesystem every pod sees (this machine's: the stand-in kubelet's
        # pods are its processes); tlaunchrun puts it under the job's /TData claim.
        lpjob["spec"]["shareFile"] = str(share_file)
    lpjob["spec"]["basic"] = {"masterPort": port}  # the pods share this machine's loopback
    return lpjob


def test_a_basic_lpjobs_pods_join_one_group_both_ways(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The pods get the arguments, and the first pod's name in the job's service as ``MASTER_ADDR`` (the
    stand-in kubelet's pods resolve it as a cluster's DNS would)."""
    kubernetes = pytest.importorskip("kubernetes")
    from kube_helpers import free_port, job_status, until

    api, _ = cluster
    objects = kubernetes.client.CustomObjectsApi()
    share = tmp_path / "share_file"
    jobs = {"mnist": f"file://{share}", "envinit": "env://"}
    for name in jobs:  # both at once
        lpjob = _lpjob(name, share if name == "mnist" else None, free_port())
        objects.create_namespaced_custom_object("tlaunch.io", "v1alpha1", "default", "lpjobs", lpjob)
    core = kubernetes.client.CoreV1Api()
    for name, how in jobs.items():
        phase = until(
            lambda name=name: (
                job_status(api, name).get("phase") in ("Succeeded", "Failed")
                and job_status(api, name)["phase"]
            ),
            f"{name} did not end: {job_status(api, name)}",
            timeout=120,
        )
        logs = "".join(core.read_namespaced_pod_log(f"{name}-trainer-{i}", "default") for i in range(2))
        assert phase == "Succeeded", logs
        met(logs, 2, how)


def test_python_first_puts_this_interpreter_first_and_leaves_path_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command's ``python`` is the trainer's interpreter: a venv's ``bin`` first, else a folder of
    scripts that run it (a host whose PATH has no ``python``, or another one), removed after."""
    from tlaunch.torch.interpreter import python_first

    def python_of(path: str) -> str:
        ran = subprocess.run(["python", "-c", "import sys; print(sys.executable)"], env={"PATH": path},
                             capture_output=True, text=True, check=True)  # fmt: skip
        return ran.stdout.strip()

    env = {"PATH": "/usr/bin:/bin"}
    with python_first(env) as path:
        assert (
            path == f"{os.path.dirname(sys.executable)}:/usr/bin:/bin" and python_of(path) == sys.executable
        )
    assert env == {"PATH": "/usr/bin:/bin"}
    with python_first({"PATH": path}) as again:  # already first: nothing changes
        assert again == path
    monkeypatch.setattr(sys, "prefix", sys.base_prefix)  # as an interpreter that is no venv's
    with python_first(env) as path:
        folder = path.split(":")[0]
        assert sorted(os.listdir(folder)) == ["python", "python3"] and os.stat(folder).st_mode & 0o077 == 0
        assert python_of(path) == sys.executable  # exec'd by its path: its venv stays its own
    assert not os.path.exists(folder) and env == {"PATH": "/usr/bin:/bin"}
