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

What the launcher hands over is a :class:`~tlaunch.backends.runspec.RunSpec`
(:mod:`tlaunch.backends.runspec`, re-exported here). Where the coordinator
runs is the backend's choice, made in ``start``: in the launcher
(:class:`~tlaunch.runtime.in_process.InProcessCoordinator`; the local
backends), on a head host (:class:`~tlaunch.runtime.remote.RemoteCoordinator`;
SSH), in a pod or an allocation. The launcher only sees a
:class:`CoordinatorLink`. A backend never imports the launcher, another
backend or a node type; ``docs/backends.md`` walks through writing one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from tlaunch.backends.handle import RunHandle
from tlaunch.backends.runspec import OutputSink, Progress, RunSettings, RunSpec
from tlaunch.errors import LaunchError
from tlaunch.plan import LaunchPlan
from tlaunch.program import Program
from tlaunch.runtime.coordinator import NodeRecord
from tlaunch.runtime.records import RunRecord

__all__ = [
    "Backend",
    "BackendOptions",
    "BackendType",
    "CoordinatorLink",
    "NoOptions",
    "OutputSink",
    "Placement",
    "Progress",
    "Submission",
    "RunSettings",
    "RunSpec",
]

Placement = Literal["threads", "processes", "hosts"]
"""Where a backend's nodes run: threads of the launcher, processes of this machine, other hosts."""


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


@dataclass(frozen=True)
class Submission:
    """A program handed to a backend's scheduler (``launch(..., submit=True)``).

    Once scheduled, the job runs ``python -m ENTRY RUN_DIR`` with the program, ``launch``
    and the backend's own options for inside the job as a pickle on its stdin.

    Attributes:
        program: the program; plan: its plan.
        run_dir: where the submission's record goes.
        options: the backend's options (its resources: the job's).
        launch: what the launch inside the job takes, as the launcher made it (ship it as it is).
        entry: the module the job runs (the launcher's batch entry, which the launcher names).
    """

    program: Program
    plan: LaunchPlan
    run_dir: str
    options: BackendOptions
    launch: object
    entry: str


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

    def submit(self, submission: Submission) -> RunHandle:
        """Hand a program to the backend's scheduler (``submit=True``); its handle (see :class:`Submission`).

        Raises:
            LaunchError: the backend does not submit, or its scheduler refused
                the job (nothing was submitted).
        """

    def attach(self, run_dir: str, record: RunRecord) -> RunHandle:
        """One of this backend's runs, found again from its record (another process's run).

        Raises:
            LaunchError: the backend's runs cannot be found again.
        """
