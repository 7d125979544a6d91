"""What the launcher hands a backend: one run, whole (:class:`RunSpec`), and where its output goes.

A :class:`RunSpec` holds everything the launcher owns, made once for every
backend: the plan, the run's keys, the common settings, each node's restart
policy and payload, the environment, the run's directory, the output sink and
the progress display. A backend turns it into what its processes read: a
node's file (:meth:`RunSpec.node_file`), a head's (:meth:`RunSpec.head_file`),
the runtime settings of node processes (:meth:`RunSpec.config`) or a
coordinator in its own process (:meth:`RunSpec.coordinator_here`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from tlaunch.nodes.base import Node
from tlaunch.plan import LaunchPlan
from tlaunch.rpc.security import RunKeys
from tlaunch.runtime.head import HeadFile
from tlaunch.runtime.in_process import InProcessCoordinator
from tlaunch.runtime.node_runtime import RuntimeConfig
from tlaunch.runtime.restarts import RestartPolicy
from tlaunch.runtime.supervisor import NodeFile

__all__ = ["OutputSink", "Progress", "RunSettings", "RunSpec"]


class OutputSink(Protocol):
    """Where node output goes in the launcher: one line at a time, with its node's prefix."""

    def line(self, prefix: str, text: str) -> None:
        """Show ``text`` as a line of ``prefix`` (``label/i`` or ``host label/i``)."""


class Progress(Protocol):
    """The launcher's progress display; a backend reports its launch phases to it."""

    times: dict[str, float]
    """Seconds each finished phase took (a backend may add its own measures)."""

    def phase(self, name: str, total: int) -> AbstractContextManager[Callable[[], None]]:
        """A phase (``connect``, ``preflight``...) over ``total`` items; the yielded function ticks one."""

    def note(self, text: str) -> None:
        """Tell the user something about the launch (what is shipped, and how large)."""


@dataclass(frozen=True)
class RunSettings:
    """What every backend's processes share, from the common launch options."""

    stop_grace: float = 5.0
    resolve_timeout: float = 300.0
    coordinator_timeout: float = 15.0
    on_failure: str = "stop"
    failure_grace: float = 1.0


@dataclass(frozen=True)
class RunSpec:
    """One run, as the launcher hands it to its backend.

    Attributes:
        plan: which node runs where.
        keys: the run's TLS keys (secret: travel only in 0600 files).
        settings: timeouts and the failure policy.
        restarts: the restart policy of each node, by key.
        env: environment variables of every node process (secret: never on a
            command line).
        terminal: where output goes (one of the backend's ``terminals``).
        run_dir: the launcher's directory of the run (0700; its record, local logs).
        nodes: the program's node objects, by key (backends that run nodes in
            this process execute them).
        payloads: each node cloudpickled, by key (empty for thread backends).
            For a backend that ``shares_values``, large buffers (arrays) are
            out of band: ``buffers[key]`` lists a node's digests, in order;
            ``blobs`` holds each distinct one once.
        sink: where streamed output goes (None: it stays in the nodes' logs).
        progress: the launcher's progress display.
        launch_type: the launch type asked for (``local_mt``, ``test_mp``...).
        flags: the launcher's parsed absl flags, for the nodes (None: not parsed).
        setups: what node processes call before unpickling their node
            (:mod:`tlaunch.runtime.setups`).
        buffers, blobs: see ``payloads``.
    """

    plan: LaunchPlan
    keys: RunKeys
    settings: RunSettings
    restarts: Mapping[str, RestartPolicy]
    env: Mapping[str, str]
    terminal: str
    run_dir: str
    nodes: Mapping[str, Node]
    payloads: Mapping[str, bytes]
    sink: OutputSink | None
    progress: Progress
    launch_type: str = ""
    flags: dict[str, tuple[str, Any]] | None = None
    setups: tuple[Callable[[], None], ...] = ()
    buffers: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    blobs: Mapping[str, memoryview] = dataclasses.field(default_factory=dict)

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.plan.run_id

    def config(
        self, host_name: str = "localhost", bind_host: str = "127.0.0.1", advertise_host: str = "127.0.0.1"
    ) -> RuntimeConfig:
        """The runtime settings of node processes on ``host_name``, binding and advertising as given."""
        s = self.settings
        return RuntimeConfig(
            run_id=self.plan.run_id,
            program_name=self.plan.program_name,
            keys=self.keys,
            bind_host=bind_host,
            advertise_host=advertise_host,
            host_name=host_name,
            resolve_timeout=s.resolve_timeout,
            coordinator_lost_after=s.coordinator_timeout,
            stop_grace=s.stop_grace,
            launch_type=self.launch_type,
            flags=self.flags,
            setups=self.setups,
        )

    def coordinator_here(self, plan: LaunchPlan | None = None) -> InProcessCoordinator:
        """A coordinator for this run in the calling process (serve it for node processes).

        ``plan``: the run's plan as the backend placed it (default: as given).
        """
        s = self.settings
        return InProcessCoordinator(plan or self.plan, s.on_failure, s.stop_grace, s.failure_grace)

    def node_file(
        self, key: str, config: RuntimeConfig, log_path: str, workdir: str | None = None, keep: bool = False
    ) -> NodeFile:
        """What a supervisor needs to run node ``key`` (ship it as a 0600 file)."""
        policy = self.restarts.get(key, RestartPolicy())
        return NodeFile(
            config,
            key,
            self.payloads[key],
            log_path,
            env=dict(self.env),
            max_restarts=policy.max_restarts,
            backoff=policy.backoff,
            workdir=workdir,
            keep=keep,
        )

    def head_file(
        self, advertise_host: str, heartbeat_timeout: float, keep: bool = False, attached: bool = True
    ) -> HeadFile:
        """What a coordinator process on another host needs (ship it as a 0600 file).

        ``attached``: the launcher holds a lease on the run (it stops when the
        launcher stops renewing it); False where the launcher cannot reach the
        coordinator (a pod's) and the run is the cluster's.
        """
        s = self.settings
        return HeadFile(
            self.plan,
            self.keys,
            advertise_host,
            heartbeat_timeout,
            s.coordinator_timeout,
            s.stop_grace,
            s.on_failure,
            attached=attached,
            keep=keep,
            failure_grace=s.failure_grace,
        )
