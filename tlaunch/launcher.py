"""``launch()``: turn a program into a running :class:`Run`.

The launcher makes the run's keys and directory, starts its coordinator, ships
the nodes to a backend and returns a :class:`Run` (a context manager with
``wait``, ``stop`` and ``status``). Nothing is left running when ``launch``
raises.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import shutil
import sys
import threading
from typing import Any, Literal

from tlaunch import context
from tlaunch.backends.base import Backend
from tlaunch.errors import LaunchError, RunFailedError
from tlaunch.plan import LaunchPlan, make_plan
from tlaunch.program import Program
from tlaunch.rpc.security import RunKeys
from tlaunch.rpc.server import RPCServer
from tlaunch.runtime.bundle import Bundle, pickle_node, write_bundle
from tlaunch.runtime.coordinator import Coordinator
from tlaunch.runtime.node_runtime import NodeRuntime, RuntimeConfig
from tlaunch.runtime.records import RunRecord, write_record

__all__ = ["LaunchType", "Run", "launch", "runs_dir"]

log = logging.getLogger(__name__)


class LaunchType(str, enum.Enum):
    """How a program is started (Launchpad's names)."""

    LOCAL_MULTI_PROCESSING = "local_mp"
    LOCAL_MULTI_THREADING = "local_mt"
    TEST_MULTI_THREADING = "test_mt"
    SSH = "ssh"


TerminalName = Literal["current_terminal", "output_to_files", "tmux_session", "ssh_tmux_session"]
_TERMINALS = ("current_terminal", "output_to_files", "tmux_session", "ssh_tmux_session")


def runs_dir() -> str:
    """Where runs keep their bundles and logs: ``$TLAUNCH_HOME/runs`` (default ``~/.tlaunch/runs``)."""
    home = os.environ.get("TLAUNCH_HOME") or os.path.join(os.path.expanduser("~"), ".tlaunch")
    return os.path.join(home, "runs")


def _launch_type(value: object, plan: LaunchPlan, terminal: str | None) -> LaunchType:
    remote = [n for n in plan.nodes if n.host is not None and not n.host.is_local]
    if value is None:
        return (
            LaunchType.SSH if remote or terminal == "ssh_tmux_session" else LaunchType.LOCAL_MULTI_PROCESSING
        )
    if isinstance(value, LaunchType):
        return value
    text = getattr(value, "value", value)
    for lt in LaunchType:
        if text in (lt.value, lt.name) or str(text).lower() == lt.name.lower():
            return lt
    raise LaunchError(
        f"launch_type {value!r} is not one of {[lt.value for lt in LaunchType]} "
        "(or the LaunchType names); use e.g. launch_type='local_mp'"
    )


class Run:
    """A launched program: wait for it, stop it, ask its status.

    Use as a context manager to stop it on exit::

        with launch(program, wait=False) as run:
            client = handle.dereference()
            ...
    """

    def __init__(
        self,
        plan: LaunchPlan,
        coordinator: Coordinator,
        backend: Backend,
        run_dir: str,
        launcher_runtime: NodeRuntime,
        server: RPCServer | None,
        stop_grace: float,
        exceptions: dict[str, BaseException] | None = None,
        record: RunRecord | None = None,
    ) -> None:
        self.plan = plan
        self.run_id = plan.run_id
        self.run_dir = run_dir
        self._coord = coordinator
        self._backend = backend
        self._runtime = launcher_runtime
        self._server = server
        self._grace = stop_grace
        self._exceptions = exceptions if exceptions is not None else {}
        self._torn_down = False
        self._lock = threading.Lock()
        self._record = record
        self.detached = False

    @property
    def log_dir(self) -> str:
        """Where each node's output is logged (``<label>_<i>.log``)."""
        return os.path.join(self.run_dir, "logs")

    def status(self) -> dict[str, dict[str, Any]]:
        """Every node's state (``pending``, ``running``, ``serving``, ``done``, ``failed``...)."""
        return self._coord.status()

    @property
    def done(self) -> bool:
        """Whether the run has ended (finished, stopped or failed)."""
        return self._coord.stopping

    def failure(self) -> RunFailedError | None:
        """The error of the first node to fail, or None."""
        rec = self._coord.failure
        if rec is None:
            return None
        err = RunFailedError(rec.key, rec.host, rec.exit_code, rec.traceback, rec.reason or "")
        cause = self._exceptions.get(rec.key)
        if cause is not None:
            err.__cause__ = cause
        return err

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the program ends (every node with ``run()`` returned, or stop).

        Returns:
            True once the run has ended and been torn down; False on timeout,
            or when the launcher detached from the run (SSH runs: Ctrl-\\).

        Raises:
            RunFailedError: a node failed; names the first to fail, with its traceback.
        """
        if not self._coord.wait_stopping(timeout) or self.detached:
            return False
        self._teardown()
        failure = self.failure()
        if failure is not None:
            raise failure
        return True

    def stop(self) -> None:
        """Stop every node and wait until none is left; idempotent."""
        if self.detached:
            raise LaunchError(f"run {self.run_id} was detached; stop it with `tlaunch stop {self.run_id}`")
        self._coord.stop("Run.stop() was called")
        self._teardown()

    def detach(self) -> None:
        """Leave the run going without this launcher (SSH runs only).

        ``tlaunch ps``, ``logs``, ``attach`` and ``stop`` find it again by its id.
        """
        detach = getattr(self._backend, "detach", None)
        if detach is None:
            raise LaunchError(
                f"run {self.run_id} runs on this machine and cannot outlive its launcher; "
                "detach needs an SSH launch (nodes placed with .to_host())"
            )
        with self._lock:
            if self.detached or self._torn_down:
                return
            self.detached = True
        detach()
        self._runtime.close()
        context.uninstall_if(self._runtime)
        if self._record is not None:
            self._record.detached = True
            self._record.launcher_pid = None
            write_record(self.run_dir, self._record)
        sys.stderr.write(
            f"tlaunch: detached from run {self.run_id}; it goes on. "
            f"`tlaunch ps {self.run_id}`, `tlaunch logs -f {self.run_id}`, "
            f"`tlaunch attach {self.run_id}`, `tlaunch stop {self.run_id}`\n"
        )

    def _teardown(self) -> None:
        with self._lock:
            if self._torn_down:
                return
            self._torn_down = True
            self._coord.stop("the run is being torn down")
            try:
                self._backend.stop(self._grace)
            finally:
                self._runtime.close()
                context.uninstall_if(self._runtime)
                if self._server is not None:
                    self._server.close()
                for name in ("bundle.pkl", "run.keys"):  # the secrets go; logs and record stay
                    path = os.path.join(self.run_dir, name)
                    if os.path.exists(path):
                        os.unlink(path)
                if self._record is not None:
                    self._record.ended = True
                    self._record.final_status = self._coord.status()
                    self._record.stop_reason = self._coord.stop_reason
                    failure = self._coord.failure
                    self._record.failure = None if failure is None else dataclasses.asdict(failure)
                    write_record(self.run_dir, self._record)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Run({self.run_id!r}, done={self.done})"


def launch(
    program: Program,
    launch_type: LaunchType | str | None = None,
    terminal: TerminalName | str | None = None,
    *,
    wait: bool = True,
    stop_grace: float = 5.0,
    resolve_timeout: float = 300.0,
    coordinator_timeout: float = 15.0,
    env: dict[str, str] | None = None,
    **backend_options: Any,
) -> Run:
    """Launch ``program`` and (by default) wait until it ends.

    Args:
        program: the program to run.
        launch_type: ``local_mp`` (a process per node; default), ``local_mt``
            (threads), ``test_mt`` (threads, for unit tests) or ``ssh`` (default
            when a node is placed on a remote host).
        terminal: where output goes: ``current_terminal`` (default), ``output_to_files``,
            ``tmux_session``; ``ssh_tmux_session`` for SSH launches.
        wait: block until the program ends; Ctrl-C stops it.
        stop_grace: seconds nodes get to exit after a stop before SIGTERM, then SIGKILL.
        resolve_timeout: how long a handle's first call waits for its node to come up.
        coordinator_timeout: a node that cannot reach its run's coordinator (the
            launcher died) for this long stops, and its process group is killed
            ``stop_grace`` seconds later.
        env: extra environment variables of every node process.

    Returns:
        The :class:`Run` (already ended when ``wait`` is true).

    Raises:
        LaunchError: bad options or a node that cannot be shipped; nothing started.
        RunFailedError: (``wait=True``) a node failed.
        ProgramError: the program graph is invalid.
    """
    plan = make_plan(program)
    if terminal is not None and terminal not in _TERMINALS:
        raise LaunchError(
            f"terminal {terminal!r} is not one of {list(_TERMINALS)}; use e.g. terminal='current_terminal'"
        )
    lt = _launch_type(launch_type, plan, terminal)
    if lt is LaunchType.SSH:
        from tlaunch.backends.ssh import launch_ssh  # lazy: paramiko only when needed

        return launch_ssh(
            program,
            plan,
            terminal=terminal,
            wait=wait,
            stop_grace=stop_grace,
            resolve_timeout=resolve_timeout,
            coordinator_timeout=coordinator_timeout,
            env=env,
            **backend_options,
        )
    if backend_options:
        raise LaunchError(
            f"options {sorted(backend_options)} apply to SSH launches only, not to {lt.value!r}"
        )
    remote = [n for n in plan.nodes if n.host is not None and not n.host.is_local]
    if remote:
        raise LaunchError(
            f"node {remote[0].key!r} is placed on host {str(remote[0].host)!r} but "
            f"launch_type {lt.value!r} runs every node on this machine; use "
            "launch_type='ssh' (or terminal='ssh_tmux_session'), or drop .to_host()"
        )
    if lt is not LaunchType.LOCAL_MULTI_PROCESSING and terminal not in (None, "current_terminal"):
        raise LaunchError(
            f"terminal {terminal!r} needs node processes; with launch_type {lt.value!r} "
            "nodes are threads that write to this terminal: use launch_type='local_mp'"
        )
    run = _launch_local(
        program,
        plan,
        lt,
        terminal or "current_terminal",
        stop_grace,
        resolve_timeout,
        coordinator_timeout,
        env,
    )
    if wait:
        try:
            run.wait()
        except KeyboardInterrupt:
            run.stop()
            raise
        except BaseException:
            run.stop()
            raise
    return run


def _launch_local(
    program: Program,
    plan: LaunchPlan,
    lt: LaunchType,
    terminal: str,
    stop_grace: float,
    resolve_timeout: float,
    coordinator_timeout: float,
    env: dict[str, str] | None,
) -> Run:
    keys = RunKeys.generate()
    config = RuntimeConfig(
        run_id=plan.run_id,
        program_name=plan.program_name,
        keys=keys,
        resolve_timeout=resolve_timeout,
        coordinator_lost_after=coordinator_timeout,
        stop_grace=stop_grace,
    )
    run_dir = os.path.join(runs_dir(), plan.run_id)
    nodes = {n.key or "": n for n in program.get_all_nodes()}
    coordinator = Coordinator(plan)
    server: RPCServer | None = None
    backend: Backend
    exceptions: dict[str, BaseException] = {}
    if lt is LaunchType.LOCAL_MULTI_PROCESSING:
        pickled = {key: pickle_node(node) for key, node in nodes.items()}  # fails before anything starts
    os.makedirs(os.path.join(run_dir, "logs"), mode=0o700, exist_ok=True)
    os.chmod(run_dir, 0o700)
    try:
        if lt is LaunchType.LOCAL_MULTI_PROCESSING:
            server = RPCServer(coordinator, keys)
            bundle_path = os.path.join(run_dir, "bundle.pkl")
            write_bundle(bundle_path, Bundle(config, server.address, pickled))
            node_env = {**(env or {}), "PYTHONPATH": _python_path()}
            from tlaunch.backends.local import LocalProcessBackend

            backend = LocalProcessBackend(
                coordinator, bundle_path, os.path.join(run_dir, "logs"), terminal, node_env
            )
        else:
            from tlaunch.backends.threads import ThreadBackend

            thread_backend = ThreadBackend(coordinator, config, nodes)
            exceptions = thread_backend.exceptions
            backend = thread_backend
        launcher_runtime = NodeRuntime(config, coordinator, None)
        launcher_runtime.start_watcher()
        backend.launch(plan)
    except BaseException:
        coordinator.stop("the launch failed")
        if server is not None:
            server.close()
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    record = None
    if server is not None:
        record = RunRecord(
            plan.run_id,
            plan.program_name,
            lt.value,
            server.address,
            os.getpid(),
            hosts=["localhost"],
            log_dir=os.path.join(run_dir, "logs"),
        )
        write_record(run_dir, record, keys)
    context.install(launcher_runtime)
    return Run(plan, coordinator, backend, run_dir, launcher_runtime, server, stop_grace, exceptions, record)


def _python_path() -> str:
    """PYTHONPATH for node processes: the launcher's script directory and path."""
    parts = [p for p in sys.path if p and os.path.isdir(p)]
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    if main_file:
        parts.insert(0, os.path.dirname(os.path.abspath(main_file)))
    seen: dict[str, None] = {}
    for p in parts:
        seen.setdefault(os.path.abspath(p), None)
    return os.pathsep.join(seen)
