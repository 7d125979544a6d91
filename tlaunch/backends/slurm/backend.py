"""SLURM backend (``launch_type="slurm"``): every node a step of the current allocation.

Inside an allocation (``salloc``, or the script of an ``sbatch`` job):

1. ``prepare``: SLURM's commands are on PATH; the allocation
   (``$SLURM_JOB_ID`` or ``job_id=``) is running; its nodes come from
   ``$SLURM_JOB_NODELIST`` (the launcher's own allocation) or ``scontrol``. A
   node whose ``to_host()`` names an allocated node runs there; a node of
   another host is an error naming the allocation's nodes; the nodes without a
   host are spread over the allocation in order (node *i* of those on
   allocated node *i mod n*; :mod:`~tlaunch.backends.slurm.placing`). Nothing
   starts. A launcher outside its own allocation (``salloc`` on a login node)
   asks SLURM nothing: the job runs, and each step finds the launcher's address
   in its own environment (``$SLURM_LAUNCH_NODE_IPADDR``, where its launch came
   from) and advertises its own on the route there. A launcher on one of the
   allocation's nodes (an ``sbatch`` script) asks SLURM about the job and its
   nodes' addresses meanwhile, and waits for the answers in ``start``: the
   run's record, read from other machines, names the coordinator by the
   address at which the nodes reach it. In another allocation (``job_id=``),
   SLURM is asked first.
2. ``start``: each node runs as ``srun --jobid=J -N1 -n1 --nodelist=NODE
   --overlap python -m tlaunch.runtime.node_main``; while the steps' interpreters
   start, SLURM's answers are read, where it was asked (a job found not RUNNING
   ends the steps, none restarted, and the launch fails), the run's coordinator
   is served from the launcher on all of this machine's addresses, and each
   step gets its bundle on its stdin (the run's keys never touch a disk or a
   command line). Its output comes back through ``srun`` into
   its log and the launcher's terminal. A thread of the launcher supervises each
   step exactly as ``local_mp`` supervises a process: restarts, reports, logs
   (:mod:`tlaunch.backends.nodeprocs`). Steps share the allocation's CPUs and
   GPUs (``--overlap``): the scheduler's ``CUDA_VISIBLE_DEVICES`` reaches every node.
3. ``stop``: nodes end on the coordinator's stop; a step left after the grace
   gets SIGTERM (``srun`` forwards it), then is cancelled (``scancel J.STEP``);
   the run's steps are checked gone. A step that ends because the job was
   cancelled (``scancel`` by anyone) or timed out stops the run with that
   reason: it is reported as stopped, not as a node failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import pickle
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from tlaunch.allocation import LAUNCH_NODE, address_towards, slurm_allocation
from tlaunch.backends.base import BackendOptions, Placement, RunSpec, Submission
from tlaunch.backends.handle import RunHandle
from tlaunch.backends.nodeprocs import NodeCommand, NodeProcesses, killpg, launcher_python_path
from tlaunch.backends.recorded import RecordedRun
from tlaunch.backends.slurm.batch import submit
from tlaunch.backends.slurm.commands import (
    JobState,
    ask_job_and_nodes,
    hostnames,
    job_state,
    missing_tools,
    node_info,
    node_infos,
)
from tlaunch.backends.slurm.job import SlurmJob
from tlaunch.backends.slurm.options import SlurmOptions
from tlaunch.backends.slurm.placing import place
from tlaunch.backends.slurm.steps import cancel_steps, cancel_steps_until_gone, step_argv, step_name
from tlaunch.backends.traits import BackendTraits
from tlaunch.errors import LaunchError, StopError
from tlaunch.hosts import HostSpec
from tlaunch.plan import LaunchPlan, log_name, placed_nodes
from tlaunch.runtime.bundle import Bundle
from tlaunch.runtime.in_process import InProcessCoordinator
from tlaunch.runtime.packing import pickle_with_nodes
from tlaunch.runtime.records import RunRecord
from tlaunch.runtime.restarts import RestartPolicy

__all__ = ["SlurmBackend", "address_towards", "place"]  # the last two: from allocation.py, placing.py

log = logging.getLogger(__name__)


class SlurmBackend(BackendTraits):
    """The steps of one run in a SLURM allocation (see the module docstring)."""

    name: ClassVar[str] = "slurm"
    terminals: ClassVar[tuple[str, ...]] = ("current_terminal", "output_to_files")
    placement: ClassVar[Placement] = "hosts"
    can_detach: ClassVar[bool] = False
    can_submit: ClassVar[bool] = True
    Options: ClassVar[type[BackendOptions]] = SlurmOptions

    @classmethod
    def attach(cls, run_dir: str, record: RunRecord) -> RunHandle:
        """A SLURM run found again from its record.

        A launch in an allocation has its coordinator in its launcher; a
        submitted batch job has SLURM's state and its output file.
        """
        if record.coordinator:
            return RecordedRun(run_dir, record)
        return SlurmJob.from_record(run_dir, record)

    def __init__(self, plan: LaunchPlan, terminal: str, options: SlurmOptions | None = None) -> None:
        if terminal not in self.terminals:
            raise LaunchError(
                f"terminal {terminal!r} is not available on SLURM; use one of {list(self.terminals)}"
            )
        self.opts = options or SlurmOptions()
        if self.opts.submit:
            raise LaunchError(
                "submit=True is handled by tlaunch.launch, not by the backend"
            )  # pragma: no cover
        self._plan = plan
        self._terminal = terminal
        self.job_id = ""
        self.placed: dict[str, str] = {}
        self._addresses: dict[str, str] = {}
        self._here = "127.0.0.1"
        self._log_dir = ""
        self._nodes: NodeProcesses | None = None
        self._coordinator: InProcessCoordinator | None = None
        self._stopped_for: str | None = None
        # In this process's own allocation, SLURM is asked in start() once the steps are started,
        # and answers while they start: the job's state, its nodes' records; or, from outside
        # the allocation, not at all (each step reaches this machine at its launch's address).
        self._ask_later = False
        self._at_launch_node = False
        self._asked: Callable[[], tuple[JobState, dict[str, dict[str, str]]]] | None = None
        self.record: dict[str, Any] = {}
        self.exceptions: dict[str, BaseException] = {}

    @classmethod
    def claims(cls, plan: LaunchPlan, env: Mapping[str, str] | None = None) -> bool:
        """Whether a launch with no launch type should run here: inside an allocation (not a step).

        True when ``$SLURM_JOB_ID`` is set outside a step, SLURM's commands are
        here, every ``to_host()`` names a node of the allocation, and the
        allocation is more than this machine (several nodes, or one that is not
        this one: ``salloc`` on a login node).
        """
        env = os.environ if env is None else env
        allocation = slurm_allocation(env)
        if allocation is None or not allocation.job_id or allocation.in_step:
            return False
        if missing_tools(("srun", "scontrol"), env):
            return False
        try:
            nodes = hostnames(allocation.nodelist, env)
        except LaunchError:
            return False
        named = {spec.host.host for spec in plan.nodes if spec.host is not None}
        if not named <= set(nodes):
            return False
        return len(nodes) > 1 or nodes[0] != socket.gethostname().split(".")[0]

    @classmethod
    def submit(cls, submission: Submission) -> SlurmJob:
        """Submit a program as a batch job that launches it with ``launch_type="slurm"``; its handle.

        The job runs ``python -m ENTRY RUN_DIR`` (the launcher's batch entry) with the program, the
        submission's ``launch`` and these options for inside the job (its own allocation's: no
        ``submit``, no resources).
        """
        options, plan = submission.options, submission.plan
        assert isinstance(options, SlurmOptions)
        inside = SlurmOptions(python=options.python, srun_args=options.srun_args)
        nodes = {n.key or "": n for n in placed_nodes(submission.program)}
        data = {"program": submission.program, "launch": submission.launch, "backend_options": inside}
        payload = pickle_with_nodes(data, nodes)
        run_dir = submission.run_dir
        return submit(options, plan.program_name, plan.run_id, run_dir, payload, entry=submission.entry)

    # -- prepare --------------------------------------------------------
    def prepare(self, run: RunSpec) -> None:
        missing = missing_tools(("srun", "scontrol", "squeue", "scancel"))
        if missing:
            raise LaunchError(
                f"launch_type='slurm' needs SLURM's commands, and {', '.join(missing)} is not on PATH; "
                "run inside a SLURM allocation on a machine with slurm-client installed"
            )
        self.job_id = self.opts.job_id or os.environ.get("SLURM_JOB_ID", "")
        if not self.job_id:
            raise LaunchError(
                "launch_type='slurm' runs the program in a SLURM allocation, and there is none here "
                "($SLURM_JOB_ID is unset): run it under salloc or in an sbatch script, pass job_id=, "
                "or pass submit=True (with nodes=, partition=...) to submit it as a batch job"
            )
        self._log_dir = os.path.join(run.run_dir, "logs")
        allocation = slurm_allocation()
        if allocation is not None and allocation.job_id == self.job_id and allocation.nodelist:
            # This process's own allocation (its node list is in the environment): it runs, so
            # the nodes are placed now. From outside it (no SLURMD_NODENAME: salloc's shell on
            # a login node), the run's record is this machine's alone, and nothing is asked:
            # scontrol's ~9 ms of CPU (controller and munge too) slowed the steps' start on the
            # cores they share. On one of its nodes (an sbatch script), SLURM is asked for the
            # address the record gives other machines, in start(), while the steps start.
            self.placed = place(self._plan, hostnames(allocation.nodelist))
            self._at_launch_node = not os.environ.get("SLURMD_NODENAME")
            self._ask_later = not self._at_launch_node
        else:
            state = job_state(self.job_id)
            self._check_running(state)
            self.placed = place(self._plan, hostnames(state.nodes or ""))
            self._learn_addresses(node_infos(list(dict.fromkeys(self.placed.values()))))
        self.record.update(
            hosts=list(dict.fromkeys(self.placed.values())), log_dir=self._log_dir, slurm_job=self.job_id
        )

    def _check_running(self, state: JobState) -> None:
        if state.state != "RUNNING" or not state.nodes:
            raise LaunchError(
                f"SLURM job {self.job_id} is {state.state}, not RUNNING"
                + (f" ({state.reason})" if state.reason else "")
                + "; launch inside a running allocation"
            )

    def _learn_addresses(self, by_name: Mapping[str, Mapping[str, str]]) -> None:
        """Each used node's address (``NodeAddr``), and this machine's on the route to the first."""
        for node in dict.fromkeys(self.placed.values()):
            self._addresses[node] = by_name[node].get("NodeAddr") or node
        self._here = address_towards(next(iter(self._addresses.values()), "127.0.0.1"))

    def _ask(self) -> None:
        """Ask SLURM whether the job runs and where its nodes are (answered in :meth:`_answers`)."""
        self._asked = ask_job_and_nodes(self.job_id, list(dict.fromkeys(self.placed.values())))

    def _answers(self) -> None:
        """SLURM's answers asked in start(): the job runs, and where its nodes are.

        Raises:
            LaunchError: the job is not running, or SLURM could not be asked.
        """
        if self._asked is None:
            return
        state, nodes = self._asked()
        self._check_running(state)
        self._learn_addresses(nodes)

    # -- start ----------------------------------------------------------
    def start(self, run: RunSpec) -> InProcessCoordinator:
        placed = tuple(dataclasses.replace(n, host=HostSpec(self.placed[n.key])) for n in run.plan.nodes)
        self._coordinator = coordinator = run.coordinator_here(dataclasses.replace(run.plan, nodes=placed))
        sink = None if self._terminal == "output_to_files" else run.sink
        self._nodes = nodes = NodeProcesses(run.run_id, coordinator, sink, ended=self._ended, kill=self._kill)
        # Nodes import what the launcher imports: its script's folder and sys.path, on the
        # filesystem a cluster's nodes share (modules of the nodes' own code travel by value).
        env = {**os.environ, **run.env}
        env["PYTHONPATH"] = run.env.get("PYTHONPATH") or launcher_python_path()
        env.pop("SLURM_CPU_BIND", None)  # an outer step's binding must not pin every node's step
        # The steps start first; each gets its bundle on stdin once SLURM has answered and the
        # coordinator serves (their interpreters start meanwhile). A failed launch gives them
        # nothing, after the stop is set: none is restarted.
        bundles: dict[str, bytes] = {}
        made = threading.Event()

        def bundle(key: str) -> bytes:
            made.wait()
            return bundles.get(key, b"")

        try:
            commands = []
            for spec in run.plan.nodes:
                node_main = [self.opts.interpreter, "-m", "tlaunch.runtime.node_main", "-", spec.key]
                node = self.placed[spec.key]
                argv = step_argv(self.job_id, node, run.run_id, spec.key, self.opts.srun_args, node_main)
                argv.append(run.run_id)
                policy = run.restarts.get(spec.key, RestartPolicy())
                log_path = os.path.join(self._log_dir, log_name(spec.key))
                payload = functools.partial(bundle, spec.key)
                commands.append(NodeCommand(spec.key, argv, payload, env, log_path, policy))
            # Every step's srun first (one process after another), then their threads.
            for command, first in [(c, nodes.spawn(c)) for c in commands]:
                nodes.start(command, first)
            if self._ask_later:  # scontrol starts once the steps have: it does not delay them
                self._ask()
            self._answers()
            address = coordinator.serve(run.keys, bind_host="0.0.0.0", advertise_host=self._here)
            if self._at_launch_node:  # the record's is 127.0.0.1: processes of this machine read it
                address = f"{LAUNCH_NODE}:{address.rpartition(':')[2]}"
            for spec in run.plan.nodes:
                node = self.placed[spec.key]
                advertise = LAUNCH_NODE if self._at_launch_node else self._addresses[node]
                config = run.config(node, bind_host="0.0.0.0", advertise_host=advertise)
                config = config._replace(scheduler="slurm")
                bundles[spec.key] = pickle.dumps(
                    Bundle(config, address, {spec.key: run.payloads[spec.key]}),
                    protocol=pickle.HIGHEST_PROTOCOL,
                )
            made.set()
        except BaseException:
            nodes.stopping.set()
            bundles.clear()
            made.set()
            coordinator.stop("the launch failed")
            self.stop(0.0)
            coordinator.close()
            raise
        return coordinator

    def step_name(self, key: str) -> str:
        """The name of node ``key``'s step (``squeue -s`` shows it)."""
        return step_name(self._plan.run_id, key)

    def _ended(self, key: str, code: int) -> None:
        """A node's step ended: if the job itself is ending (scancel, time limit), the run stops for that."""
        if code == 0 or self._coordinator is None:
            return
        with contextlib.suppress(LaunchError):
            state = job_state(self.job_id)
            if state.state not in ("RUNNING", "COMPLETING") or state.ended:
                self._stop_run(
                    f"SLURM job {self.job_id} is {state.state}"
                    + (f" ({state.reason})" if state.reason else "")
                )
                return
            info = node_info(self.placed[key])
            if any(s in info.get("State", "") for s in ("DOWN", "NOT_RESPONDING", "FAIL")):
                why = info.get("Reason", "")
                log.error(
                    "SLURM node %s of %s is %s%s",
                    self.placed[key],
                    key,
                    info["State"],
                    f" ({why})" if why else "",
                )

    def _stop_run(self, reason: str) -> None:
        """Stop the run for a reason of the scheduler's; every node's end is then a stop, not a failure."""
        if self._stopped_for is None:
            self._stopped_for = reason
            assert self._nodes is not None and self._coordinator is not None
            self._nodes.stop_from_outside()
            self._coordinator.stop(reason)

    def _kill(self, popen: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        """SIGTERM: to ``srun``, which forwards it to the step; SIGKILL: the run's steps are cancelled."""
        if sig == signal.SIGKILL:
            cancel_steps(self.job_id, self._plan.run_id)
        killpg(popen.pid, sig)

    # -- stop -----------------------------------------------------------
    def stop(self, grace: float) -> None:
        """End every node's step (grace, SIGTERM, cancel) and confirm SLURM lists none of the run's steps."""
        if self._nodes is not None:
            self._nodes.stop(grace)
        if not self.job_id or not self.placed:
            return
        steps = cancel_steps_until_gone(self.job_id, self._plan.run_id, 10.0)
        if steps and job_state(self.job_id).state == "RUNNING":
            raise StopError(self._plan.run_id, {f"SLURM job {self.job_id}": steps})

    def detach(self) -> None:
        raise LaunchError("a SLURM run's coordinator lives in its launcher: it cannot outlive it")
