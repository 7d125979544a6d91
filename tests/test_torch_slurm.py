"""tlaunch.torch jobs on the real SLURM test cluster (tlaunch.testing.slurm), submitted by tlaunchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from test_slurm import on_the_cluster  # noqa: F401  # the fixture: submit to the test cluster

from tlaunch.backends.slurm import SlurmJob

STEP_TRAINER = """
import os, socket
with open(os.path.join(os.environ["OUT"], f"rank{os.environ['RANK']}"), "w") as f:
    f.write(f"{socket.gethostname()} {os.environ.get('SLURM_STEP_ID', 'no-step')}")
"""


def test_a_one_node_basic_job_runs_as_a_step_of_its_allocation(on_the_cluster) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """``tlaunchrun --backend slurm basic`` on one node: its trainer is an ``srun`` step, not an SSH login.

    With one node (the batch script's own), the trainer was placed over SSH to
    that same node: SLURM neither saw nor accounted it.
    """
    out = Path(on_the_cluster.shared_dir) / f"basic1-{time.monotonic_ns()}"
    out.mkdir()
    script = out / "trainer.py"
    script.write_text(STEP_TRAINER)
    done = subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.tlaunchrun", "--backend", "slurm", "--lpjob_name", "basic1",
         "--env", f"OUT={out}", "basic", "--num_trainer", "1", str(script)],
        capture_output=True, text=True, timeout=60, cwd=on_the_cluster.shared_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split("submitted SLURM job ")[1].split()[0]
    run_id = done.stdout.split("(run ")[1].split(")")[0]
    run_dir = os.path.join(os.environ["TLAUNCH_HOME"], "runs", run_id)
    job = SlurmJob(job_id, run_id, run_dir)
    assert job.wait(timeout=120).state == "COMPLETED", job.read_output()
    host, step = (out / "rank0").read_text().split()
    assert host == "th1" and step != "no-step", job.read_output()
    (inner,) = os.listdir(os.path.join(run_dir, "batch", "runs"))  # the basic job's own run, in the job
    with open(os.path.join(run_dir, "batch", "runs", inner, "run.json")) as f:
        assert json.load(f)["backend"] == "slurm"


def test_the_authors_basic_setup_and_an_env_init_script_join_on_slurm(on_the_cluster) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """``tlaunchrun --backend slurm basic --num_trainer 2 --set_share_file`` of the original TLaunch's set-up
    (``--rank``, ``--world_size``, ``--share_file``, ``init_method="file://..."``), then the same script
    without a shared file, which meets through ``MASTER_ADDR`` (``env://``): "environment variable
    MASTER_ADDR expected" before. The script is on the cluster's shared filesystem, as a user's is.
    The first also asks for ``--set_save_path --set_checkpoint_path`` (never passed to trainers off
    Kubernetes before): rank 0 saves its model and a checkpoint there."""
    from test_torch_basic import EXAMPLE, met

    folder = Path(on_the_cluster.shared_dir) / f"tiny-{time.monotonic_ns()}"
    folder.mkdir()
    script = folder / "basic_train.py"
    script.write_text(EXAMPLE.read_text())
    jobs = {}
    paths = ["--set_save_path", "--set_checkpoint_path"]  # the seed's: --save_path, --checkpoint_path
    for name, share in (("tiny-file", ["--set_share_file"]), ("tiny-env", [])):
        done = subprocess.run(
            [sys.executable, "-m", "tlaunch.cli.tlaunchrun", "--backend", "slurm", "--lpjob_name", name,
             *(paths if share else []), "basic", "--num_trainer", "2", *share,
             "basic_train.py", "--steps", "2"],
            capture_output=True, text=True, timeout=60, cwd=folder,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        job_id = done.stdout.split("submitted SLURM job ")[1].split()[0]
        run_id = done.stdout.split("(run ")[1].split(")")[0]
        jobs[name] = SlurmJob(job_id, run_id, os.path.join(os.environ["TLAUNCH_HOME"], "runs", run_id))
    for name, job in jobs.items():
        assert job.wait(timeout=180).state == "COMPLETED", job.read_output()
    (share,) = os.listdir(folder / "tlaunch-share")  # ./tlaunch-share/<id> of the folder it was sent from
    met(jobs["tiny-file"].read_output(), 2, f"file://{folder / 'tlaunch-share' / share}")
    met(jobs["tiny-env"].read_output(), 2, "env://")
    models = folder / "tlaunch-models" / "tiny-file"  # ./tlaunch-models/<job> of the folder it was sent from
    assert sorted(os.listdir(models)) == ["last.tar.gz", "tiny.pt"]
    assert f"rank 0 kept a checkpoint at step 2 in {models}/last.tar.gz" in jobs["tiny-file"].read_output()
    assert not (folder / "tlaunch-models" / "tiny-env").exists()
