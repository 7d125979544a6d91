"""The backend seam: what the launcher hands a backend, and the few things a backend does.

::

    launcher (owns, once, for every backend)        backend (does only what differs)
    ────────────────────────────────────────        ─────────────────────────────────
    plan, common and backend options, keys,   ───▶  prepare(run)   check hosts, tools and
    run directory and record, node payloads,                        placement; start nothing
    env, restart policy per node, progress    ───▶  start(run)     place the coordinator and
    display, output sink                                            every node (with what
                                                                    supervises it); send output
                                                                    to run.sink; return the
                                                                    launcher's CoordinatorLink
    Run: wait / stop / status / detach,       ───▶  stop(grace)    end every process, confirm
    failure report, teardown order                                  none is left (also after a
                                                                    launch that failed half-way)
                                              ───▶  detach()       leave the run going

Where the coordinator runs is the backend's choice, made in ``start``: in the
launcher (:class:`~tlaunch.runtime.in_process.InProcessCoordinator`; the local
backends), on a head host (:class:`~tlaunch.runtime.remote.RemoteCoordinator`;
SSH), in a pod or an allocation. The launcher only sees a
:class:`CoordinatorLink`. A backend never imports the launcher, another
backend or a node type; ``docs/backends.md`` walks through writing one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from tlaunch.backends.handle import RunHandle
from tlaunch.errors import LaunchError
from tlaunch.nodes.base import Node
from tlaunch.plan import LaunchPlan
from tlaunch.program import Program
from tlaunch.rpc.security import RunKeys
from tlaunch.runtime.coordinator import NodeRecord
from tlaunch.runtime.head import HeadFile
from tlaunch.runtime.in_process import InProcessCoordinator
from tlaunch.runtime.node_runtime import RuntimeConfig
from tlaunch.runtime.records import RunRecord
from tlaunch.runtime.restarts import RestartPolicy
from tlaunch.runtime.supervisor import NodeFile

__all__ = [
    "Backend",
    "BackendOptions",
    "BackendType",
    "CoordinatorLink",
    "NoOptions",
    "OutputSink",
    "Placement",
    "Progress",
    "RunSettings",
    "RunSpec",
]

Placement = Literal["threads", "processes", "hosts"]
"""Where a backend's nodes run: threads of the launcher, processes of this machine, other hosts."""


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


class CoordinatorLink(Protocol):
    """The launcher's view of the run's coordinator, wherever it runs.

    It also serves the launcher's own runtime (handles dereferenced in the
    launcher), which calls ``resolve``, ``wait_stop`` and ``stop``.
    """

    address: str | None
    """Where node processes reach the coordinator (None: only this process can)."""

    def status(self) -> dict[str, dict[str, Any]]:
        """Every node's record, as plain dicts."""

    @property
    def stopping(self) -> bool:
        """Whether the run is stopping or has stopped."""

    @property
    def stop_reason(self) -> str | None:
        """Why the run stopped."""

    @property
    def failure(self) -> NodeRecord | None:
        """The first node to fail, by time."""

    @property
    def stop_kind(self) -> str | None:
        """Why the stop began: ``completed``, ``requested`` or ``failed`` (None while the run goes on)."""

    def stop(self, reason: str = "stop() was called", kind: str = "requested") -> None:
        """Ask every node to stop (``kind``: ``requested`` from outside, ``completed`` by the program)."""

    def stop_grace(self) -> float:
        """Seconds nodes get after the current stop (shorter when a failure stopped the run)."""

    def wait_stopping(self, timeout: float | None) -> bool:
        """Wait until the run is stopping; False on timeout."""

    def wait_ready(self, keys: list[str] | None, timeout: float | None) -> bool:
        """Wait until every node of ``keys`` (None: all) is up (serving, running or done); False on
        timeout, or once the run stopped with one of them not up."""

    def wait_ended(self, timeout: float) -> bool:
        """Wait until every node has ended; False on timeout."""

    def release(self) -> None:
        """The launcher has read the final state: a coordinator that waits for it may exit."""

    def detach(self) -> None:
        """The launcher leaves; the run goes on without it."""

    def close(self) -> None:
        """Close the link (and a coordinator served from this process); idempotent."""

    def resolve(self, key: str, previous: str | None, timeout: float) -> dict[str, Any]:
        """Wait up to ``timeout`` s for an address of ``key`` other than ``previous``."""

    def wait_stop(self, key: str | None = None, timeout: float = 2.0) -> bool:
        """Long poll: True once the run is stopping."""


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


OptionsT = TypeVar("OptionsT", bound="BackendOptions")


@dataclass(frozen=True)
class BackendOptions:
    """Base of a backend's typed options (keyword arguments of :func:`tlaunch.launch`)."""

    @classmethod
    def from_kwargs(cls: type[OptionsT], kwargs: Mapping[str, Any], backend: str) -> OptionsT:
        """The options in ``kwargs``, checked.

        Raises:
            LaunchError: an option this backend does not take, or a bad value.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            takes = f"its own options are {names}" if names else "it takes no options of its own"
            raise LaunchError(f"unknown launch options {unknown} for launch_type {backend!r}; {takes}")
        options = cls(**kwargs)
        options.check()
        return options

    def check(self) -> None:
        """Raise :class:`LaunchError` for a bad value (override to check)."""


@dataclass(frozen=True)
class NoOptions(BackendOptions):
    """A backend without options of its own."""


class Backend(Protocol):
    """One way to place a run's processes (see the module docstring for the sequence)."""

    record: dict[str, Any]
    """What ``tlaunch ps/logs/stop`` need to find the run again (hosts, log_dir...), for its record."""

    exceptions: Mapping[str, BaseException]
    """Nodes' own exception objects, where nodes ran in this process (else empty)."""

    def prepare(self, run: RunSpec) -> None:
        """Check everything the launch needs and start nothing.

        Raises:
            LaunchError: naming every problem found (or an ``SSHError``/``HostsError``).
        """

    def start(self, run: RunSpec) -> CoordinatorLink:
        """Start the run's coordinator and every node; output goes to ``run.sink``.

        Returns:
            The launcher's link to the coordinator.
        """

    def stop(self, grace: float) -> None:
        """End every process of the run and confirm none is left; idempotent.

        Nodes get ``grace`` seconds after the coordinator's stop, then SIGTERM,
        then SIGKILL. After a launch that failed part-way, also removes what the
        launch had created.
        """

    def detach(self) -> None:
        """Leave the run going without this launcher (only where ``can_detach``)."""


class BackendType(Protocol):
    """A backend class: its traits, its capabilities, and the constructor the launcher calls.

    Capabilities a backend may lack have defaults in :class:`BackendTraits`
    (subclass it): ``claims`` (never), ``submit`` (refused), ``attach`` (refused).
    """

    name: ClassVar[str]
    """The launch type it serves (``local_mp``, ``ssh``...); kept in the run record."""
    terminals: ClassVar[tuple[str, ...]]
    """The terminals it offers; the first is its default."""
    placement: ClassVar[Placement]
    """Where its nodes run (decides how they are shipped)."""
    can_detach: ClassVar[bool]
    """Whether a run can outlive its launcher."""
    Options: ClassVar[type[BackendOptions]]
    """Its typed options."""

    can_submit: ClassVar[bool]
    """Whether ``launch(..., submit=True)`` hands the whole program to this backend's scheduler."""
    shares_values: ClassVar[bool]
    """Whether it ships a large value several nodes hold once per host (``RunSpec.blobs``)."""

    def __call__(self, plan: LaunchPlan, terminal: str, options: Any) -> Backend:
        """A backend for ``plan``; checks placement and terminal.

        Raises:
            LaunchError: the plan or terminal does not fit this backend.
        """

    def claims(self, plan: LaunchPlan) -> bool:
        """Whether ``plan`` should run here when no launch type is given (SLURM inside an allocation)."""

    def submit(
        self,
        program: Program,
        plan: LaunchPlan,
        run_dir: str,
        options: BackendOptions,
        launch_kwargs: Mapping[str, Any],
    ) -> RunHandle:
        """Hand ``program`` to the backend's scheduler (``submit=True``); its handle.

        ``launch_kwargs`` are the launch's other arguments, for the launch that
        runs the program once it is scheduled. The record goes into ``run_dir``.

        Raises:
            LaunchError: the backend does not submit, or its scheduler refused
                the job (nothing was submitted).
        """

    def attach(self, run_dir: str, record: RunRecord) -> RunHandle:
        """One of this backend's runs, found again from its record (another process's run).

        Raises:
            LaunchError: the backend's runs cannot be found again.
        """
