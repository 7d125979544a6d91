"""Which backend runs a launch (:func:`backend_type`), and handing a program to one's scheduler.

A launch names its launch type, or the program says it: a node placed on a
remote host makes it ``ssh``; an environment a backend claims (a SLURM
allocation) makes it that backend's; else ``local_mp``. Launchpad's names
(``LaunchType`` members) are understood; its types tlaunch does not run are
refused naming them. With ``submit=True`` the whole program goes to the
backend's scheduler (:func:`submit_program`), and its batch job runs the
launcher's batch entry, ``python -m tlaunch.launcher``.
"""

from __future__ import annotations

import enum
import os
import shutil

from tlaunch.backends import backend_names, check_backend_type, claiming_backend, get_backend
from tlaunch.backends.base import BackendOptions, BackendType, Submission
from tlaunch.backends.handle import RunHandle
from tlaunch.errors import LaunchError
from tlaunch.launch_types import LaunchType
from tlaunch.launcher.submitted import Submitted
from tlaunch.plan import LaunchPlan
from tlaunch.program import Program
from tlaunch.runtime.records import private_dirs, runs_dir

__all__ = ["backend_type", "submit_program"]

_TERMINALS = ("current_terminal", "output_to_files", "tmux_session", "ssh_tmux_session")
_ELSEWHERE = {"local_docker": "Docker containers", "vertex_ai": "Google Cloud Vertex AI"}


def backend_type(value: object, plan: LaunchPlan, terminal: str | None) -> BackendType:
    """The backend of ``launch_type`` (by default: SSH if a node has a remote host, else local_mp)."""
    if terminal is not None and terminal not in _TERMINALS:
        raise LaunchError(
            f"terminal {terminal!r} is not one of {list(_TERMINALS)}; use e.g. terminal='current_terminal'"
        )
    if value is not None and not isinstance(value, (str, enum.Enum)):
        return check_backend_type(value)  # a backend class
    if value is None:
        remote = [n for n in plan.nodes if n.host is not None and not n.host.is_local]
        value = "ssh" if remote or terminal == "ssh_tmux_session" else "local_mp"
        claimant = claiming_backend(plan)  # the environment is a backend's own (a SLURM allocation)
        if claimant is not None and (terminal is None or terminal in claimant.terminals):
            return claimant
    text = str(getattr(value, "value", value))
    names = backend_names()
    for lt in LaunchType:
        if text in (lt.value, lt.name) or text.lower() == lt.name.lower():
            text = lt.value
    if text in _ELSEWHERE:
        raise LaunchError(
            f"launch_type {text!r} ({_ELSEWHERE[text]}) is Launchpad's and tlaunch does not run it; "
            f"use one of {names}"
        )
    if text not in names:
        raise LaunchError(
            f"launch_type {value!r} is not one of {names} (or the LaunchType names); "
            "use e.g. launch_type='local_mp'"
        )
    kind = get_backend(text)
    if kind.placement != "hosts":
        remote = [n for n in plan.nodes if n.host is not None and not n.host.is_local]
        if remote:
            raise LaunchError(
                f"node {remote[0].key!r} is placed on host {str(remote[0].host)!r} but "
                f"launch_type {text!r} runs every node on this machine; use "
                "launch_type='ssh' (or terminal='ssh_tmux_session'), or drop .to_host()"
            )
    return kind


def submit_program(
    kind: BackendType, program: Program, plan: LaunchPlan, options: BackendOptions, launch: Submitted
) -> RunHandle:
    """``submit=True``: hand the whole program to the backend's scheduler; the job's handle.

    Once scheduled, the job runs ``python -m tlaunch.launcher`` (:mod:`tlaunch.launcher.__main__`),
    which launches the program with ``launch`` in the allocation.
    """
    if not kind.can_submit:
        submitters = [n for n in backend_names() if get_backend(n).can_submit]
        raise LaunchError(
            f"submit=True: launch_type {kind.name!r} does not submit jobs; use one that does: {submitters}"
        )
    run_dir = os.path.join(runs_dir(), plan.run_id)
    private_dirs(run_dir, top=os.path.dirname(runs_dir()))
    try:
        return kind.submit(Submission(program, plan, run_dir, options, launch, __name__.rpartition(".")[0]))
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
