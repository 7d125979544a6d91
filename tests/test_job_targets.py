"""Every launch method on every target, through the one entry point, its result read through the handle.

A job is written once as a file and run by ``python -m tlaunch.control.starting.jobmain`` wherever
it goes: this machine, SSH hosts (the entry point here, the method's processes there), a SLURM batch
job (the entry point is the batch script's command). For each (method, target), the job is submitted
with ``control.submit`` as a user or the job server does, joined through its handle (``join``), and
how it ended is read through the handle too (``results()``: the result its entry point wrote; a
``function`` job's workers' return values in it). Each target's six jobs run at once (one fixture
submits them), so the whole matrix costs about one job per target.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from extensions import EXTENSIONS, deepspeed_env

from tlaunch import control
from tlaunch.jobs import JobSpec
from tlaunch.runtime.methods import METHODS

TRAINER = """
import os, sys
print("trainer", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], flush=True)
if "--save_path" in sys.argv:  # set_save_path: a folder made where it runs, before it started
    save = sys.argv[sys.argv.index("--save_path") + 1]
    with open(os.path.join(save, "model-" + os.environ["RANK"]), "w") as f:
        f.write("weights")
    print("its arguments:", *sys.argv[1:], flush=True)
"""

PROGRAMS = """
import os
from tlaunch import lp_ssh as lp


def make_program():
    p = lp.Program("one-node")
    p.add_node(lp.PyNode(print, "the program's node ran"), label="node")
    return p


def work(x):
    return {"rank": int(os.environ["RANK"]), "x": int(x)}
"""

SAYS = (
    "import os, sys; print('command', os.environ['RANK'], 'of', "
    "os.environ['WORLD_SIZE'], 'by', sys.executable)"
)

DEEPSPEED = {"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": EXTENSIONS}  # its op built once a machine

# Each method's job, as a user gives it (FILE and FILE:FUNCTION name files of the package).
JOBS: dict[str, dict[str, Any]] = {  # two trainers (SLURM: nodes) each
    "basic": {"script": ["train.py"], "num_trainer": 2, "set_save_path": True, "set_checkpoint_path": True},
    "torchrun": {"script": ["train.py"], "nproc_per_node": 2, "num_trainer": 2},
    "deepspeed": {"script": ["train.py"], "env": DEEPSPEED, "num_trainer": 2},
    # A user's ``python`` is the interpreter tlaunch runs with there (a host's PATH may have none).
    "command": {"script": ["python", "-c", SAYS], "num_trainer": 2},
    "program": {"script": ["programs.py:make_program"], "num_trainer": 2},
    "function": {"script": ["programs.py:work", "7"], "nproc_per_node": 2, "num_trainer": 2},
}
SAID = {  # what each method's job prints, in its run's logs
    "basic": "trainer 0 of 2",
    "torchrun": "trainer 0 of",  # (rank 0's lines are echoed: what a SLURM job's output has)
    "deepspeed": "trainer 0 of",
    "command": f"command 1 of 2 by {sys.executable}",  # (each host's interpreter: the launcher's path)
    "program": "the program's node ran",
    "function": None,  # its results say it
}
NEEDS = {"torchrun": "torch", "deepspeed": "deepspeed", "function": "torch"}


def test_the_matrix_is_every_method() -> None:
    assert set(JOBS) == set(SAID) == set(METHODS)


def _package(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(TRAINER)
    (folder / "programs.py").write_text(PROGRAMS)
    return folder


def _job(method: str, package: Path | None) -> JobSpec:
    """``method``'s job; ``package``: the package's absolute folder (a SLURM job's script is its path
    on the shared filesystem, as the job server gives it), else the job's working directory is it."""
    given = dict(JOBS[method])
    script = list(given.pop("script"))
    if package is not None and METHODS[method].entry.in_package:
        script[0] = str(package / script[0])
    return JobSpec(lpjob_name=f"{method}-job", script=script, image="none", method=method, **given)


@dataclass
class Submitted:
    """Every method's job on one target, and the folder they were submitted from."""

    handles: dict[str, control.RunHandle]
    folder: Path


def _submit_all(target: control.Target, package: Path | None, folder: Path, **kw: Any) -> Submitted:
    """Submit every method's job from ``folder`` (a job's ``./tlaunch-models`` is there)."""
    handles = {}
    deepspeed_env()  # no lock a killed run left where DeepSpeed builds its op
    with contextlib.chdir(folder):
        for method in JOBS:
            if method in NEEDS and not _has(NEEDS[method]):
                continue
            handles[method] = control.submit(_job(method, package), target, **kw)
    return Submitted(handles, folder)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _check(jobs: Submitted, method: str, hosts: list[str]) -> None:
    if method not in jobs.handles:
        pytest.skip(f"needs {NEEDS[method]}")
    handle = jobs.handles[method]
    snap = handle.join(timeout=300)
    assert snap.state is control.RunState.SUCCEEDED, snap
    result = handle.results()  # the one result format, written by the job's entry point
    assert result is not None and result.state == "completed" and result.failure is None, result
    if method == "function":
        assert result.results == {h: [{"rank": 2 * i, "x": 7}, {"rank": 2 * i + 1, "x": 7}]
                                  for i, h in enumerate(hosts)}, result  # fmt: skip
    else:
        assert result.results is None
        text = "\n".join(line.text for line in handle.logs())
        assert SAID[method] in text and "Warning" not in text, (method, text[-2000:])
    if JOBS[method].get("set_save_path"):  # the same arguments on every target, after the script's
        models = jobs.folder / "tlaunch-models" / f"{method}-job"
        paths = f"--save_path {models} --checkpoint_path {models}/last.tar.gz"
        said = f"its arguments: {paths} --rank 0 --world_size 2"
        assert said in text, text[-2000:]


# -- this machine ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def here(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Submitted]:
    """Every method's job on this machine, submitted at once."""
    folder = tmp_path_factory.mktemp("jobs-here")
    target = control.Hosts(("localhost",), working_dir=str(_package(folder / "package")))
    yield _submit_all(target, None, folder, home=str(folder / "home"))


@pytest.mark.parametrize("method", list(JOBS))
def test_a_method_on_this_machine(here: Submitted, method: str) -> None:
    _check(here, method, ["localhost"])
    if JOBS[method].get("set_save_path"):  # made here, 0700, before the trainers started
        models = here.folder / "tlaunch-models" / f"{method}-job"
        assert sorted(os.listdir(models)) == ["model-0", "model-1"]
        assert os.stat(models).st_mode & 0o777 == os.stat(models.parent).st_mode & 0o777 == 0o700


# -- SSH hosts ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def on_hosts(ssh_hosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Submitted]:  # type: ignore[no-untyped-def]
    """Every method's job on two SSH test hosts (the package shipped to both), submitted at once."""
    folder = tmp_path_factory.mktemp("jobs-ssh")
    hosts = ("th1", "th2")
    target = control.Hosts(hosts, ssh_hosts.ssh_config, str(_package(folder / "package")))
    jobs = _submit_all(target, None, folder, home=str(folder / "home"))
    yield jobs
    for handle in jobs.handles.values():
        assert ssh_hosts.wait_no_leftovers(handle.run_id, 20) == {}


@pytest.mark.ssh
@pytest.mark.parametrize("method", list(JOBS))
def test_a_method_on_ssh_hosts(on_hosts: Submitted, method: str) -> None:
    # The models' folder is made on each host (its /tmp is its own): each trainer wrote in its own.
    _check(on_hosts, method, ["th1", "th2"])


# -- SLURM ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def on_slurm(slurm_cluster) -> Iterator[Submitted]:  # type: ignore[no-untyped-def]
    """Every method's job as a batch job of two nodes, submitted at once (the package and the run
    store on the folder the cluster's nodes share)."""
    folder = Path(slurm_cluster.shared_dir) / f"jobs-{time.monotonic_ns()}"
    package = _package(folder / "package")
    environ = {**os.environ, "SLURM_CONF": slurm_cluster.conf}
    target = control.Slurm(time="10")
    yield _submit_all(target, package, folder, home=str(folder / "home"), environ=environ)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slurm
@pytest.mark.parametrize("method", list(JOBS))
def test_a_method_as_a_slurm_batch_job(on_slurm: Submitted, method: str) -> None:
    _check(on_slurm, method, ["th1", "th2"])
    if JOBS[method].get("set_save_path"):  # in the submit folder, which every node shares
        assert sorted(os.listdir(on_slurm.folder / "tlaunch-models" / f"{method}-job")) == [
            "model-0",
            "model-1",
        ]
    if method in on_slurm.handles:  # the batch script runs the one entry point on the job's file: no CLI
        with open(os.path.join(on_slurm.handles[method].snapshot().refs["log_dir"], "job.sbatch")) as f:
            command = f.read().rstrip().splitlines()[-1]
        assert shlex.split(command)[1:4] == [sys.executable, "-m", "tlaunch.control.starting.jobmain"]
