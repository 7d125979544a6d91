"""What a job of the server is: its :class:`~tlaunch.jobs.JobSpec` and target, and how it is.

A running job's state, nodes and root cause come from its run (a local or
SSH launcher process of its own, a SLURM job, an LPJob), found again by its id
in the server's run store, never from a copy in the server, so a server
restarted mid-job finds every job as it is: :func:`view_job` makes the job's
view from its row and a snapshot of its run (the server's watcher takes it:
:mod:`tlaunch.server.watcher`). Once it has ended, its final view is kept in
the job's row (:func:`final_of`), so a finished job is shown without reading
its run, and a run store pruned later does not turn it ``LOST``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tlaunch import control
from tlaunch.control import LogLine, RunHandle, RunNotFoundError, RunSnapshot, RunState
from tlaunch.errors import TLaunchError
from tlaunch.jobs import JobSpec
from tlaunch.jobs.client import IN_JOB
from tlaunch.runtime.envkey import env_key, requirement_lines
from tlaunch.runtime.methods import COMMAND, DEFAULT_METHOD, SETTINGS, get_method
from tlaunch.runtime.pyenv import RuntimeEnv, has_requirements
from tlaunch.server.models import ENTRY_FIELDS
from tlaunch.server.packages import Package
from tlaunch.server.pool import placement_target, scheduled
from tlaunch.server.store import JobRow

__all__ = [
    "ACCEPTED",
    "ENDED",
    "STARTING",
    "JobView",
    "ended_without_run",
    "final_of",
    "handle_of",
    "job_of",
    "log_lines",
    "view_job",
]

log = logging.getLogger(__name__)
ENDED = frozenset(s.value for s in RunState if s.ended)
"""The terminal states' names."""
_FINAL_FIELDS = ("state", "message", "exit_code", "refs", "nodes", "failure", "results")
ACCEPTED = "accepted: waiting for its launcher to start"
STARTING = "its launcher is starting"
LOST_RUN = "its run can no longer be found in the server's run store"


@dataclass(frozen=True)
class JobView:
    """A job as the API shows it."""

    row: JobRow
    state: str
    message: str | None
    exit_code: int | None
    snapshot: RunSnapshot | None
    results: Any = None
    """A ``function`` job's results (``{"results": {host: [...]}}``), once it has ended."""

    def to_dict(self) -> dict[str, Any]:
        """The job's JSON form."""
        if self.snapshot is None and self.row.final is not None:  # as it ended, kept in its row
            return {**self._row_dict(), **{k: self.row.final.get(k) for k in _FINAL_FIELDS}}
        snap = self.snapshot
        out: dict[str, Any] = {
            **self._row_dict(),
            "state": self.state,
            "message": self.message,
            "exit_code": self.exit_code,
            "refs": {"run_id": self.row.run_id, **(dict(snap.refs) if snap is not None else {})},
            "nodes": [],
            "failure": None,
            "results": self.results,
        }
        if snap is not None:
            out["nodes"] = [
                {
                    "key": n.key,
                    "host": n.host,
                    "state": n.state,
                    "pid": n.pid,
                    "exit_code": n.exit_code,
                    "reason": n.reason,
                    "restarts": n.restarts,
                    "started_at": n.started_at,
                    "finished_at": n.finished_at,
                }
                for n in snap.nodes
            ]
            if snap.failure is not None:
                f = snap.failure
                out["failure"] = {
                    "node": f.node,
                    "host": f.host,
                    "exit_code": f.exit_code,
                    "reason": f.reason,
                    "exception": f.exception,
                    "traceback": f.traceback,
                }
        return out

    def _row_dict(self) -> dict[str, Any]:
        row = self.row
        return {
            "name": row.name,
            "owner": row.owner,
            "labels": row.labels,
            "created": row.created,
            "spec": row.spec,
            **scheduled(row),
        }


def job_of(row: JobRow, package: Package, folder: str | None = None) -> tuple[JobSpec, control.Target]:
    """``row``'s job from ``package`` (its files in ``folder``, the job's own copy; default: the stored
    package's, for a dry run) and where it goes, checked (nothing is started).

    Raises:
        TLaunchError: a value the job or its target cannot take (the message names it).
    """
    spec = row.spec
    folder = folder or package.path
    env = dict(spec.get("env") or {})
    env[IN_JOB] = row.name  # tlaunch.jobs.submit_self: in the job, the script trains
    for key in ("input", "output"):
        if spec.get(key):
            env[f"TLAUNCH_{key.upper()}"] = str(spec[key])
    slurm, kube = spec.get("slurm"), spec.get("kubernetes")
    placed = placement_target(row)  # a job the server's pool placed: its hosts and their slots
    if placed is not None:
        env.update(placed[2])
    method = get_method(spec.get("launch_method", DEFAULT_METHOD))
    if method.entry is COMMAND:  # any program, run as it is
        script = [*(spec.get(ENTRY_FIELDS[COMMAND]) or []), *spec.get("args", [])]
    else:
        script = [spec.get(ENTRY_FIELDS[method.entry]) or spec["entry_point"], *spec.get("args", [])]
        if slurm is not None and method.entry.in_package:  # the cluster's nodes share the package's folder
            script[0] = os.path.join(folder, script[0])
    runtime_env = runtime_env_of(spec, package, folder)
    job = JobSpec(
        lpjob_name=row.name,
        script=script,
        image=spec.get("base_image") or "none",
        namespace=(kube or {}).get("namespace"),  # None: the credentials' own
        method=method.name,
        num_trainer=int(spec.get("num_trainer") or 0),  # 0: the method's own count
        gpu=int(spec.get("gpu_num") or 0) if spec.get("use_gpu") else 0,
        cpu=str(spec["cpu_num"]) if spec.get("cpu_num") else None,
        memory=spec.get("memory"),
        tdata_claim=(kube or {}).get("tdata_claim"),
        # On Kubernetes the operator restarts the job's pods; elsewhere the server runs it again.
        restart_policy=(spec.get("restart_policy") or "Never") if kube is not None else "Never",
        backoff_limit=int(spec.get("backoff_limit") or 0) if kube is not None else 0,
        env=env,
        **{name: spec.get(name, setting.default) for name, setting in SETTINGS.items()},
    )
    target: control.Target
    if slurm is not None:
        target = control.Slurm(
            partition=slurm.get("partition"),
            account=slurm.get("account"),
            qos=slurm.get("qos"),
            time=slurm.get("time"),
            sbatch_args=tuple(slurm.get("sbatch_args") or ()),
            runtime_env=runtime_env,
        )
        control.sbatch_script(job, target)  # a dry run: every value the batch script takes, checked
    elif kube is not None:
        target = control.Kubernetes(
            namespace=kube.get("namespace"), working_dir=folder, runtime_env=runtime_env
        )
        control.lpjob_of(job, target)  # a dry run: the LPJob and its package, checked
    elif placed is not None:
        target = control.Hosts(placed[0], placed[1], folder, runtime_env)
    else:
        hosts = tuple(spec.get("hosts") or ("localhost",))
        target = control.Hosts(hosts, spec.get("ssh_config"), folder, runtime_env)
    return job, target


def runtime_env_of(spec: dict[str, Any], package: Package, folder: str) -> RuntimeEnv | None:
    """The runtime environment of a job (its ``pip`` lines, or its package's requirements file),
    built from the job's copy of the package in ``folder``, keyed by what it installs
    (:func:`tlaunch.runtime.envkey.env_key`): a package edited elsewhere keeps it. None: it installs
    nothing.

    The key is read from the stored package (the same bytes as any copy; a copy under
    ``--unix-users`` is not in the user's run folder yet when the job is made)."""
    source = package.path
    pip = requirement_lines(spec.get("pip") or ())
    if pip:
        return RuntimeEnv(folder, env_key(source, pip, package.sha256), pip=tuple(pip))
    name = os.path.normpath(spec.get("requirements") or "requirements.txt")
    if not has_requirements(source, name):
        return None
    path = os.path.join(source, name)
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    return RuntimeEnv(folder, env_key(source, lines, package.sha256, os.path.dirname(path)), name)


def handle_of(row: JobRow, home: str) -> RunHandle | None:
    """The handle of ``row``'s run, if it has one the run store knows."""
    if not row.run_id:
        return None
    try:
        return control.find_run(row.run_id, home)
    except (RunNotFoundError, TLaunchError):
        return None


def view_job(row: JobRow, snap: RunSnapshot | None = None, handle: RunHandle | None = None) -> JobView:
    """How ``row``'s job is: as it ended (kept in its row), else as ``snap`` of its run says
    (``handle``: its run, whose results an ended ``function`` job shows).

    ``snap`` None: the job has no run (yet, or any longer: ``LOST``), or it has ended.
    """
    if row.final is not None:
        return JobView(
            row, str(row.final.get("state")), row.final.get("message"), row.final.get("exit_code"), None
        )
    if snap is None:
        if row.run_id:
            return JobView(row, row.final_state or "LOST", row.message or LOST_RUN, None, None)
        return JobView(row, "PENDING", row.message or (STARTING if row.started else ACCEPTED), None, None)
    exit_code: int | None = None
    if snap.state.ended:
        exit_code = (snap.failure.exit_code or 1) if snap.failure is not None else 0
    kept = handle.results() if snap.state.ended and handle is not None else None
    results = None
    if kept is not None and (kept.results is not None or kept.results_why is not None):  # a function's
        results = {"results": kept.results, **({"why": kept.results_why} if kept.results_why else {})}
    message = snap.reason
    if snap.failure is not None:
        f = snap.failure
        message = f"node {f.node} on {f.host} failed: {f.exception or f.reason or f'exit code {f.exit_code}'}"
    return JobView(row, snap.state.value, message, exit_code, snap, results)


def final_of(view: JobView) -> dict[str, Any]:
    """What the row of a job that has ended keeps of ``view``."""
    return {k: v for k, v in view.to_dict().items() if k in _FINAL_FIELDS}


def ended_without_run(row: JobRow, state: str, reason: str) -> JobView:
    """The view of a job that ended before it had a run (its launch failed, or it was stopped
    before it started); ``row`` is changed to keep it."""
    final: dict[str, Any] = {"state": state, "message": reason, "exit_code": None, "refs": {"run_id": None}}
    final.update(nodes=[], failure=None, results=None)
    row.final, row.final_state, row.message = final, state, reason
    return JobView(row, state, reason, None, None)


def log_lines(handle: RunHandle, node: str | None, follow: bool, tail: int | None) -> Iterator[LogLine]:
    """The run's log lines (the last ``tail`` of them, when not following)."""
    lines = handle.logs(node, follow=follow)
    if follow or tail is None:
        yield from lines
        return
    kept: list[LogLine] = []
    for line in lines:
        kept.append(line)
        if len(kept) > tail:
            del kept[0]
    yield from kept
