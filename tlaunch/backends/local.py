"""Local multi-processing backend (``local_mp``): one process per node on this machine.

The coordinator stays in the launcher, served over RPC on loopback. Terminals:

* ``current_terminal``: every node's output streams to the launcher's stdout with
  a coloured ``[label/i]`` prefix (and to a log file);
* ``output_to_files``: output goes to ``<run dir>/logs/<label>_<i>.log`` only;
* ``tmux_session``: a local tmux session with one window per node, each running
  the node's supervisor (:mod:`tlaunch.runtime.supervisor`) as on SSH hosts.

Otherwise each node has a thread of the launcher as its supervisor: it starts
the node process (the leader of a new process group, its bundle on stdin),
copies its output, restarts it under its restart policy and reports its end.
The node asks the kernel for SIGTERM when that thread's process dies
(``PR_SET_PDEATHSIG``), so nodes never outlive a launcher killed with SIGKILL.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tlaunch.backends.base import BackendOptions, Placement, RunSpec
from tlaunch.backends.handle import RunHandle
from tlaunch.backends.nodeprocs import NodeCommand, NodeProcesses, killpg, launcher_python_path
from tlaunch.backends.recorded import RecordedRun
from tlaunch.backends.tmux import open_windows, session_of, window_command
from tlaunch.backends.traits import BackendTraits
from tlaunch.errors import LaunchError
from tlaunch.flags import kind_of
from tlaunch.plan import LaunchPlan, log_name
from tlaunch.procs import MARKER, carries_marker
from tlaunch.rpc import shm
from tlaunch.runtime.bundle import Bundle
from tlaunch.runtime.in_process import InProcessCoordinator
from tlaunch.runtime.node_runtime import RuntimeConfig
from tlaunch.runtime.records import RunRecord, write_private
from tlaunch.runtime.restarts import RestartPolicy

__all__ = ["LocalOptions", "LocalProcessBackend", "PythonProcess"]


@dataclass(frozen=True)
class PythonProcess:
    """How the processes of one group run (Launchpad's ``PythonProcess``; ``local_resources``).

    Attributes:
        args: absl flags of those nodes (``{"batch_size": 8}``), beside the launcher's.
        env: extra environment variables of those nodes.
        interpreter: the Python to run them with (tlaunch installed there; default: the launcher's).
    """

    args: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, Any] = field(default_factory=dict)
    interpreter: str | None = None


@dataclass(frozen=True)
class LocalOptions(BackendOptions):
    """Options of ``local_mp`` and ``test_mp`` launches.

    Attributes:
        local_resources: a :class:`PythonProcess` per group label.
    """

    local_resources: Mapping[str, PythonProcess] = field(default_factory=dict)

    def check(self) -> None:
        bad = {k: v for k, v in self.local_resources.items() if not isinstance(v, PythonProcess)}
        if bad:
            raise LaunchError(
                f"local_resources {sorted(bad)} are not PythonProcess configs: give "
                "local_resources={'label': PythonProcess(env=..., args=..., interpreter=...)}"
            )


class LocalProcessBackend(BackendTraits):
    """Starts each node of a plan as a local process (see the module docstring)."""

    name: ClassVar[str] = "local_mp"
    terminals: ClassVar[tuple[str, ...]] = ("current_terminal", "output_to_files", "tmux_session")
    placement: ClassVar[Placement] = "processes"
    can_detach: ClassVar[bool] = False
    Options: ClassVar[type[BackendOptions]] = LocalOptions

    @classmethod
    def attach(cls, run_dir: str, record: RunRecord) -> RunHandle:
        """A run of this machine found again from its record (its coordinator lives in its launcher)."""
        return RecordedRun(run_dir, record)

    def __init__(self, plan: LaunchPlan, terminal: str, options: LocalOptions | None = None) -> None:
        if terminal not in self.terminals:
            raise LaunchError(f"terminal {terminal!r} is not one of {list(self.terminals)} for local_mp")
        self._resources = dict((options or LocalOptions()).local_resources)
        labels = {n.label for n in plan.nodes}
        unknown = sorted(set(self._resources) - labels)
        if unknown:
            raise LaunchError(
                f"local_resources name {unknown}, which are not labels of the program: {sorted(labels)}"
            )
        self._terminal = terminal
        self._run_id = plan.run_id
        self._nodes: NodeProcesses | None = None
        self._session: str | None = None
        self._coordinator: InProcessCoordinator | None = None
        self._log_dir = ""
        self.record: dict[str, Any] = {"hosts": ["localhost"]}
        self.exceptions: Mapping[str, BaseException] = {}

    def prepare(self, run: RunSpec) -> None:
        if self._terminal == "tmux_session" and shutil.which("tmux") is None:
            raise LaunchError("terminal='tmux_session' needs tmux on this machine (apt-get install tmux)")
        self._log_dir = os.path.join(run.run_dir, "logs")
        self.record["log_dir"] = self._log_dir

    def start(self, run: RunSpec) -> InProcessCoordinator:
        self._coordinator = coordinator = run.coordinator_here()
        address = coordinator.serve(run.keys)
        env = {**run.env, "PYTHONPATH": run.env.get("PYTHONPATH") or launcher_python_path()}
        try:
            if self._terminal == "tmux_session":
                self._start_tmux(run, address, env)
            else:
                sink = None if self._terminal == "output_to_files" else run.sink
                self._nodes = nodes = NodeProcesses(run.run_id, coordinator, sink, sample=True)
                for spec in run.plan.nodes:
                    config, node_env, python = self._resources_of(run, spec.label, env)
                    payload = pickle.dumps(
                        Bundle(config, address, {spec.key: run.payloads[spec.key]}),
                        protocol=pickle.HIGHEST_PROTOCOL,
                    )
                    nodes.start(
                        NodeCommand(
                            spec.key,
                            [python, "-m", "tlaunch.runtime.node_main", "-", spec.key, run.run_id],
                            payload,
                            {**os.environ, **node_env},
                            os.path.join(self._log_dir, log_name(spec.key)),
                            run.restarts.get(spec.key, RestartPolicy()),
                            own_tmp=node_env.get("TMPDIR") or tempfile.gettempdir(),
                        )
                    )
        except BaseException:
            coordinator.stop("the launch failed")
            self.stop(0.0)
            coordinator.close()
            raise
        return coordinator

    def _resources_of(
        self, run: RunSpec, label: str, env: dict[str, str]
    ) -> tuple[RuntimeConfig, dict[str, str], str]:
        """The config (with the group's flags), environment and interpreter of group ``label``."""
        res = self._resources.get(label)
        config = run.config()
        if res is None:
            return config, env, sys.executable
        flags = dict(config.flags or {})
        for name, value in res.args.items():
            flags[name] = (kind_of(value) or "string", value if kind_of(value) else str(value))
        config = config._replace(flags=flags)
        return config, {**env, **{k: str(v) for k, v in res.env.items()}}, res.interpreter or sys.executable

    # -- tmux -----------------------------------------------------------
    def _start_tmux(self, run: RunSpec, address: str, env: dict[str, str]) -> None:
        windows = []
        for i, spec in enumerate(run.plan.nodes):
            node_file = os.path.join(run.run_dir, f"{i}.node")
            config, node_env, python = self._resources_of(run, spec.label, env)
            spec_file = run.node_file(spec.key, config, os.path.join(self._log_dir, log_name(spec.key)))
            write_private(node_file, pickle.dumps(spec_file._replace(env=node_env)))
            argv = [python, "-m", "tlaunch.runtime.supervisor", node_file, address]
            marks = {"PYTHONPATH": env["PYTHONPATH"], MARKER: run.run_id}
            windows.append((spec.key, window_command(argv, os.getcwd(), marks)))
        self._session = session_of(run.run_id)
        subprocess.run(
            open_windows(self._session, windows, new_session=True), check=True, capture_output=True
        )

    # -- stop -----------------------------------------------------------
    def stop(self, grace: float) -> None:
        """Grace, SIGTERM, SIGKILL to every node's process group; with ``grace`` 0, SIGKILL at once.

        Called again with 0 while a stop is under way (a second Ctrl-C), it kills at once.
        """
        if self._session is not None:
            self._stop_tmux(grace)
        if self._nodes is not None:
            self._nodes.stop(grace)
        shm.sweep(min_age=0.0)  # buffers sent through shared memory by nodes that are now gone

    def _stop_tmux(self, grace: float) -> None:
        """Supervisors in the windows stop their nodes; then the session and whatever is left go."""
        coordinator = self._coordinator
        if coordinator is not None and grace > 0:
            coordinator.wait_ended(grace + 4.0)
        groups = [
            rec[k]
            for rec in (coordinator.status().values() if coordinator is not None else [])
            for k in ("pgid", "supervisor_pid")
            if rec.get(k)
        ]
        subprocess.run(["tmux", "kill-session", "-t", f"={self._session}"], capture_output=True, check=False)
        for pid in groups:
            if carries_marker(pid, self._run_id):  # still the run's, not a pid reused since
                killpg(pid, signal.SIGKILL)
        self._session = None

    def detach(self) -> None:
        raise LaunchError("a local_mp run cannot outlive its launcher")
