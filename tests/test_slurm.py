"""The SLURM test cluster (a real slurmctld and a slurmd per test host) and tlaunch.torch in an allocation."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tlaunch.torch.hosts import expand_nodelist

pytestmark = [pytest.mark.slurm, pytest.mark.ssh]


@pytest.mark.parametrize(
    "nodelist", ["n[1-3,5]", "gpu[01-02],cpu7", "a[08-10]", "r[1-2]-c[3-4]", "x[9-10],y"]
)
def test_node_lists_agree_with_scontrol(slurm_cluster, nodelist: str) -> None:  # type: ignore[no-untyped-def]
    done = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist],
        env=slurm_cluster.env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert expand_nodelist(nodelist) == done.stdout.split()


def test_gpus_per_node_sets_cuda_visible_devices(slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    done = subprocess.run(
        ["srun", "-N2", "--gpus-per-node=1", "sh", "-c", 'echo "$(hostname) $CUDA_VISIBLE_DEVICES"'],
        env=slurm_cluster.env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert sorted(done.stdout.splitlines()) == ["th1 0", "th2 0"]


LAUNCHER = """
import os, sys
import tlaunch.torch

def work():
    import torch, torch.distributed as dist
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return os.uname().nodename, dist.get_rank(), t.item()

result = tlaunch.torch.launch(work, hostnames="slurm", workers_per_host="slurm", backend="gloo",
                              ssh_config_file=sys.argv[1], log_dir=sys.argv[2])
print("NODELIST", os.environ["SLURM_JOB_NODELIST"])
for host in result.hosts:
    print("RESULT", host, result.results[host])
"""


def test_torch_function_launch_in_an_allocation(slurm_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    argv = ["salloc", "-N2", "--ntasks-per-node=2", sys.executable, "-c", LAUNCHER]
    done = subprocess.run(  # 2 CPUs per node: workers_per_host="slurm" gives 2 workers on each
        [*argv, slurm_cluster.hosts.ssh_config, str(tmp_path)],
        env=slurm_cluster.env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "NODELIST th[1-2]" in done.stdout
    assert "RESULT th1 [('th1', 0, 6.0), ('th1', 1, 6.0)]" in done.stdout
    assert "RESULT th2 [('th2', 2, 6.0), ('th2', 3, 6.0)]" in done.stdout
    (run_id,) = os.listdir(tmp_path)
    assert slurm_cluster.hosts.wait_no_leftovers(run_id, 10) == {}


def test_workers_per_host_slurm_follows_the_allocations_gpus(slurm_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    argv = ["salloc", "-N2", "--gpus-per-node=1", sys.executable, "-c", LAUNCHER]
    done = subprocess.run(
        [*argv, slurm_cluster.hosts.ssh_config, str(tmp_path)],
        env=slurm_cluster.env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT th1 [('th1', 0, 1.0)]" in done.stdout and "RESULT th2 [('th2', 1, 1.0)]" in done.stdout
