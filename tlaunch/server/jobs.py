"""What the server does with a job: start it through :mod:`tlaunch.control`, and say how it is.

A job's run is found again by its id in the server's run store
(``<home>/runs``) whenever asked: its state, nodes, root cause and logs come
from the run itself (a local or SSH launcher process of its own, or a SLURM
job), never from a copy in the server, so a server restarted mid-job finds
every job as it is.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tlaunch import control
from tlaunch.control import LogLine, RunHandle, RunNotFoundError, RunSnapshot
from tlaunch.errors import TLaunchError
from tlaunch.jobs import JobSpec
from tlaunch.jobs.client import IN_JOB
from tlaunch.server.packages import Package
from tlaunch.server.store import JobRow

__all__ = ["JobView", "handle_of", "log_lines", "start_job", "view_job"]


@dataclass(frozen=True)
class JobView:
    """A job as the API shows it."""

    row: JobRow
    state: str
    message: str | None
    exit_code: int | None
    snapshot: RunSnapshot | None

    def to_dict(self) -> dict[str, Any]:
        """The job's JSON form."""
        snap = self.snapshot
        out: dict[str, Any] = {
            "name": self.row.name,
            "owner": self.row.owner,
            "state": self.state,
            "message": self.message,
            "exit_code": self.exit_code,
            "labels": self.row.labels,
            "created": self.row.created,
            "spec": self.row.spec,
            "refs": {"run_id": self.row.run_id, **(dict(snap.refs) if snap is not None else {})},
            "nodes": [],
            "failure": None,
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


def start_job(row: JobRow, package: Package, home: str) -> RunHandle:
    """Start ``row``'s job from ``package``; its run's handle.

    Raises:
        TLaunchError: a bad value, or a target that refused the job.
    """
    spec = row.spec
    env = dict(spec.get("env") or {})
    env[IN_JOB] = row.name  # tlaunch.jobs.submit_self: in the job, the script trains
    for key in ("input", "output"):
        if spec.get(key):
            env[f"TLAUNCH_{key.upper()}"] = str(spec[key])
    slurm = spec.get("slurm")
    script = [spec["entry_point"], *spec.get("args", [])]
    if slurm is not None:  # the cluster's nodes share the package's folder (the server's home)
        script[0] = os.path.join(package.path, spec["entry_point"])
    job = JobSpec(
        lpjob_name=row.name,
        script=script,
        image=spec.get("base_image") or "none",
        method=spec.get("launch_method", "basic"),
        num_trainer=int(spec.get("num_trainer", 1)),
        nproc_per_node=int(spec.get("nproc_per_node", 1)),
        gpu=int(spec.get("gpu_num") or 0) if spec.get("use_gpu") else 0,
        env=env,
        backend="slurm" if slurm is not None else "kubernetes",
    )
    target: control.Target
    if slurm is not None:
        target = control.Slurm(
            partition=slurm.get("partition"),
            account=slurm.get("account"),
            qos=slurm.get("qos"),
            time=slurm.get("time"),
            sbatch_args=tuple(slurm.get("sbatch_args") or ()),
        )
    else:
        hosts = tuple(spec.get("hosts") or ("localhost",))
        target = control.Hosts(hosts, spec.get("ssh_config"), working_dir=package.path)
    return control.submit(job, target, home=home)


def handle_of(row: JobRow, home: str) -> RunHandle | None:
    """The handle of ``row``'s run, if it has one the run store knows."""
    if not row.run_id:
        return None
    try:
        return control.find_run(row.run_id, home)
    except (RunNotFoundError, TLaunchError):
        return None


def view_job(row: JobRow, home: str) -> JobView:
    """How ``row``'s job is now, from its run."""
    handle = handle_of(row, home)
    if handle is None:
        state = row.final_state or ("LOST" if row.run_id else "PENDING")
        return JobView(row, state, row.message, None, None)
    snap = handle.snapshot()
    exit_code: int | None = None
    if snap.state.ended:
        exit_code = (snap.failure.exit_code or 1) if snap.failure is not None else 0
    message = snap.reason
    if snap.failure is not None:
        f = snap.failure
        message = f"node {f.node} on {f.host} failed: {f.exception or f.reason or f'exit code {f.exit_code}'}"
    return JobView(row, snap.state.value, message, exit_code, snap)


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
