"""Run control: what happens to a run after it starts, whatever started it.

One layer under ``tlaunch.cli`` and ``tlaunch.server`` (siblings that never
import each other) and over the launcher, the backends, ``torch``, ``jobs`` and
``k8s``. It returns data and raises typed errors; it never prints::

    from tlaunch import control

    for run in control.list_runs():                  # every run this machine recorded
        print(run.snapshot().state)
    run = control.find_run("consumer_producers-2026")  # an id, or a unique prefix of one
    for line in run.logs(follow=True):               # until the run ends
        print(line)
    run.stop()
    job = control.submit(JobSpec(...), control.Slurm(partition="gpu"))  # or Hosts(...), Kubernetes()
    ppo = control.find_lpjob("ppo", namespace="team-rl")  # an LPJob by its name (tlaunchrun's)
    control.debug.paused(run)                        # its nodes waiting in a debugger (breakpoint())
    control.metrics.top(run, sort="mem")             # its nodes' CPU, memory, GPU: hottest first

A handle is the :class:`RunHandle` of the backend that runs it: a local run
(its launcher holds it), an SSH run (its head's coordinator, its hosts' logs),
a SLURM run (in an allocation, or a submitted batch job), an LPJob (a program's,
``tlaunchrun``'s: found by run id, or by its name with :func:`find_lpjob`).
"""

from tlaunch.backends.handle import (
    Attachable,
    Failure,
    LogLine,
    NodeStatus,
    RunHandle,
    RunSnapshot,
    RunState,
)
from tlaunch.backends.k8s.lpjobs import find_lpjob, list_lpjobs
from tlaunch.backends.logfiles import LogFollowing, LogSteps
from tlaunch.control import debug, metrics
from tlaunch.control.runs import attach, find_record, find_run, list_runs, runs_dir
from tlaunch.control.starting.submission import lpjob_of, sbatch_script, submit
from tlaunch.control.starting.targets import Hosts, Kubernetes, Slurm, Target
from tlaunch.errors import RunNotFoundError

__all__ = [
    "Attachable",
    "Failure",
    "Hosts",
    "Kubernetes",
    "LogFollowing",
    "LogLine",
    "LogSteps",
    "NodeStatus",
    "RunHandle",
    "RunNotFoundError",
    "RunSnapshot",
    "RunState",
    "Slurm",
    "Target",
    "attach",
    "debug",
    "find_lpjob",
    "find_record",
    "find_run",
    "list_lpjobs",
    "list_runs",
    "lpjob_of",
    "metrics",
    "runs_dir",
    "sbatch_script",
    "submit",
]
