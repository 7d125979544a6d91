"""Submitting a job: one :class:`~tlaunch.jobs.JobSpec` onto hosts, a SLURM cluster or Kubernetes.

``submit(job, target)`` returns at once with the job's :class:`RunHandle`;
the job runs on without the caller (a job server may restart, a terminal may
close). On hosts and SLURM the job is written once, as a file in its run's
folder (:class:`~.jobfile.JobFile`, 0600), and run by one entry point
(:mod:`.jobmain`), which writes how it ended beside it (``results()``):

- :class:`Hosts` (SSH hosts, or ``localhost``): the entry point in a session of
  its own on this machine runs the job's method there; it deletes the file as
  it reads it, so the job's environment is never on a command line. The
  handle is the run's, whose id ``submit`` chose.
- :class:`Slurm`: an ``sbatch`` job (its script 0600 in the run's folder) whose
  command is the entry point, on the allocation's first node: the method runs
  on the allocation's nodes; the handle is a :class:`~tlaunch.backends.slurm.SlurmJob`.
- :class:`Kubernetes`: the job's LPJob (:meth:`JobSpec.to_lpjob`), which the
  operator runs (``docs/k8s.md``); the handle is an
  :class:`~tlaunch.backends.k8s.LPJobRun`, recorded in the run store like the others.

A target's ``runtime_env`` (a package with a ``requirements.txt``) is built
on each host before the job runs there (:mod:`tlaunch.control.starting.envs`);
``submit`` then returns as soon as the run is recorded as ``PENDING``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from tlaunch.backends.handle import RunHandle
from tlaunch.backends.k8s.lpjobs import submit_lpjob
from tlaunch.backends.slurm.batch import command_script
from tlaunch.backends.slurm.batch import submit as sbatch
from tlaunch.control.runs import attach, runs_dir
from tlaunch.control.starting.envs import batch_steps, pod_package, write_requirements
from tlaunch.control.starting.jobfile import JOB_FILE, JobFile, entry_argv
from tlaunch.control.starting.place import Place
from tlaunch.control.starting.targets import Hosts, Kubernetes, Slurm, Target, slurm_options
from tlaunch.errors import LaunchError
from tlaunch.jobs import JobSpec
from tlaunch.plan import new_run_id
from tlaunch.runtime.records import private_dirs, read_record

__all__ = ["batch_job_file", "lpjob_of", "sbatch_script", "submit"]


def sbatch_script(job: JobSpec, target: Slurm, run_id: str = "<run id>", home: str | None = None) -> str:
    """The batch script :func:`submit` would write for ``job`` on ``target`` (a dry run).

    Raises:
        LaunchError: a value SLURM or the script cannot take.
    """
    run_dir = os.path.join(runs_dir(home), run_id)
    steps, argv = _batch_command(target, home, run_dir)
    write_requirements(target.runtime_env, run_dir)
    return command_script(slurm_options(job, target), job.lpjob_name, run_id, run_dir, argv, None, steps)


def batch_job_file(job: JobSpec, started_in: str | None = None) -> JobFile:
    """The job file a SLURM batch job of ``job`` runs (``job.json`` in its run's folder)."""
    place = Place(hosts=(), allocation=True, started_in=started_in)  # its hosts: the allocation's
    return JobFile(job, place)


def _batch_command(target: Slurm, home: str | None, run_dir: str) -> tuple[list[list[str]], list[str]]:
    """The batch job's steps before its command (a runtime environment's build), and the command: the
    entry point, with the job's file in the run's folder."""
    argv = entry_argv(os.path.join(run_dir, JOB_FILE))
    if target.runtime_env is None:
        return [], argv
    return batch_steps(target.runtime_env, home, run_dir, argv)


def submit(
    job: JobSpec,
    target: Target,
    *,
    home: str | None = None,
    timeout: float = 60.0,
    environ: Mapping[str, str] | None = None,
    run_id: str | None = None,
    started_in: str | None = None,
) -> RunHandle:
    """Start ``job`` on ``target``; its handle, at once (the job runs on without the caller).

    Args:
        job: what to run (the trainer's script, method, trainers, environment).
        target: where (:class:`Hosts`, :class:`Slurm` or :class:`Kubernetes`).
        home: the ``TLAUNCH_HOME`` whose run store records the job (default: ``$TLAUNCH_HOME``).
        timeout: seconds a :class:`Hosts` job may take to appear in the run store.
        environ: the environment the job's launcher (or ``sbatch``) starts with, under the
            job's own ``env`` (default: this process's; a job server gives
            :func:`tlaunch.control.starting.jobenv.job_environ`'s, never its own).
        run_id: the run's id (default: a new one from the job's name); its folder may exist
            already (a job server put the job's copy of its package there).
        started_in: the folder whose ``./tlaunch-models`` holds the job's ``--save_path``
            and ``--checkpoint_path`` (default: the caller's working directory; a job server
            gives the job's own folder).

    Raises:
        LaunchError: a bad value, a cluster that refused the job, or a launcher that
            failed before its run started (its output is in the message).
    """
    run_id = run_id or new_run_id(job.lpjob_name)
    started_in = os.path.abspath(started_in or os.getcwd())
    if isinstance(target, Slurm):
        return _submit_slurm(job, target, home, environ, run_id, started_in)
    if isinstance(target, Hosts):
        return _submit_hosts(job, target, home, timeout, environ, run_id, started_in)
    if isinstance(target, Kubernetes):
        return _submit_kubernetes(job, target, home, run_id)
    raise LaunchError(
        f"target {target!r} is not Hosts(...), Slurm(...) or Kubernetes(...) of tlaunch.control.submit"
    )


def lpjob_of(job: JobSpec, target: Kubernetes) -> tuple[dict[str, Any], dict[str, bytes] | None]:
    """The LPJob :func:`submit` would create for ``job`` on ``target``, and its Secret's files (a dry run).

    Raises:
        LaunchError: a value the LPJob cannot take, or a package too large to ship.
    """
    if target.namespace is not None:
        job = replace(job, namespace=target.namespace)  # checked again
    lpjob, files = job.to_lpjob(), None
    if target.working_dir is not None:
        files, lpjob["spec"]["package"] = pod_package(target.working_dir, target.runtime_env)
        lpjob["spec"]["runFiles"] = True
    return lpjob, files


def _made_run_dir(home: str | None, run_id: str) -> str:
    """The run's folder in the run store of ``home``, made (0700) where it is not yet."""
    run_dir = os.path.join(runs_dir(home), run_id)
    private_dirs(run_dir, top=os.path.dirname(runs_dir(home)))
    return run_dir


@contextlib.contextmanager
def _run_folder(home: str | None, run_id: str) -> Iterator[str]:
    """The run's folder (:func:`_made_run_dir`) for a submission, removed again if the submission
    fails: a job that never started leaves nothing in the run store."""
    run_dir = _made_run_dir(home, run_id)
    try:
        yield run_dir
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _submit_kubernetes(job: JobSpec, target: Kubernetes, home: str | None, run_id: str) -> RunHandle:
    lpjob, files = lpjob_of(job, target)
    with _run_folder(home, run_id) as run_dir:
        return submit_lpjob(lpjob, run_id, run_dir, target.kube_config, files, target.impersonate)


def _submit_slurm(
    job: JobSpec,
    target: Slurm,
    home: str | None,
    environ: Mapping[str, str] | None,
    run_id: str,
    started_in: str,
) -> RunHandle:
    opts = slurm_options(job, target)
    with _run_folder(home, run_id) as run_dir:
        steps, argv = _batch_command(target, home, run_dir)
        batch_job_file(job, started_in).write(os.path.join(run_dir, JOB_FILE))
        return sbatch(
            opts,
            job.lpjob_name,
            run_id,
            run_dir,
            None,
            env=environ,  # sbatch passes its own environment on to the job (--export=ALL)
            command=argv,
            command_steps=steps,
        )


def _submit_hosts(
    job: JobSpec,
    target: Hosts,
    home: str | None,
    timeout: float,
    environ: Mapping[str, str] | None,
    run_id: str,
    started_in: str,
) -> RunHandle:
    folder = os.path.join(os.path.dirname(runs_dir(home)), "submitted")
    private_dirs(folder, top=os.path.dirname(runs_dir(home)))
    name = f"{job.lpjob_name}-{uuid.uuid4().hex[:8]}"
    out_file = os.path.join(folder, f"{name}.out")
    run_dir = _made_run_dir(home, run_id)
    if target.working_dir:  # the launcher starts in it (below): a relative path would mean another
        target = replace(target, working_dir=os.path.abspath(target.working_dir))
    place = Place(tuple(target.hosts), False, target.ssh_config, target.working_dir, run_id=run_id,
                  started_in=started_in)  # fmt: skip
    job_file = JobFile(job, place, target.runtime_env).write(os.path.join(run_dir, JOB_FILE))
    env = dict(os.environ if environ is None else environ)
    if home is not None:
        env["TLAUNCH_HOME"] = home
    with open(out_file, "ab") as out:
        os.chmod(out_file, 0o600)
        proc = subprocess.Popen(
            entry_argv(job_file),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            # In the job's own folder: the launcher's folder is never the caller's (a job server's),
            # whose .py files an SSH launch would otherwise ship beside the package as its modules.
            cwd=target.working_dir or None,
            start_new_session=True,  # it outlives the caller, and the caller's Ctrl-C
        )
    threading.Thread(target=proc.wait, name=f"reap {name}", daemon=True).start()  # no zombie
    deadline = time.monotonic() + timeout
    while True:
        ended = proc.returncode is not None  # asked before the store: a run that ends is recorded first
        try:  # recorded as it started, or as preparing (a runtime environment to build)
            return attach(run_dir, read_record(run_dir))
        except (OSError, ValueError):
            pass
        if ended:
            break
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)  # its session: the launcher and anything it began
            break
        time.sleep(0.05)
    with open(out_file, encoding="utf-8", errors="replace") as f:
        said = f.read()[-3000:].strip()
    shutil.rmtree(run_dir, ignore_errors=True)  # a run that never started: nothing of it stays
    with_pid = f"(pid {proc.pid}, exit code {proc.wait()})"
    raise LaunchError(f"job {job.lpjob_name!r} did not start on {list(target.hosts)} {with_pid}: {said}")
