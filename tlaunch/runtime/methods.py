"""The launch methods of jobs, one entry each: everything that differs between them, stated once.

A job (:class:`tlaunch.jobs.JobSpec`: a trainer's script, its trainers, their
environment) names its method. What differs between methods is a field of its
:class:`Method` here, and nothing above this table compares method names::

    what differs                                       the field          who reads it
    ─────────────────────────────────────────────────  ─────────────────  ──────────────────────────────────
    what the job's entry is: a script, a command,      entry              the job server (entry_point,
      a FILE:FUNCTION reference                                             command, program), tlaunch job
    which settings it takes (nnodes, pservers...),     settings,          JobSpec.check (one check: the CLI's
      and how many trainers it has by default           trainers            errors, the server's 400s)
    how it runs in pods: its command, its files, its    pods               the LPJob operator
      LPJob section with the section's defaults                             (tlaunch.k8s.children), the CRD
    whether it keeps what its job returned              keeps_results      the job's entry point (results())
    what it does, in one line                           summary            every help text

How each method *runs* on hosts and on a SLURM allocation is its runner, a
typed function of the layer that can run it: the runner table of
:mod:`tlaunch.control.starting.runners`, which holds one runner per entry here
(a test keeps the two equal). Adding a method is an entry here and a runner
there; a method without ``pods`` is refused on Kubernetes with a clear error.

This module is pure and sits low in the layers (the operator, in
``tlaunch.k8s``, reads it); the pods' commands are in :mod:`.method_pods`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from tlaunch.errors import LaunchError
from tlaunch.runtime.method_pods import (
    RDZV_PORT,
    TORCH_MASTER_PORT,
    Pods,
    PodSide,
    SectionKey,
    basic_pod,
    deepspeed_files,
    deepspeed_pod,
    python_script,
    torchrun_pod,
    trainer_pod,
)

__all__ = [
    "COMMAND",
    "DEFAULT_METHOD",
    "METHODS",
    "NNODES",
    "RDZV_PORT",
    "REFERENCE",
    "SCRIPT",
    "SETTINGS",
    "TORCH_MASTER_PORT",
    "Entry",
    "Method",
    "MethodJob",
    "PodSide",
    "Pods",
    "SectionKey",
    "Setting",
    "get_method",
    "describe",
    "method_names",
    "methods_of",
]


class MethodJob(Protocol):
    """What a method reads of a job (a :class:`tlaunch.jobs.JobSpec` is one)."""

    @property
    def method(self) -> str: ...
    @property
    def num_trainer(self) -> int: ...
    @property
    def nnodes(self) -> str | None: ...
    @property
    def nproc_per_node(self) -> int: ...
    @property
    def max_restarts(self) -> int: ...


@dataclass(frozen=True)
class Entry:
    """What a job's entry (the first item of its script) is.

    Attributes:
        kind: ``script`` (a Python script the method starts), ``command`` (any
            program, run as it is) or ``reference`` (``FILE:FUNCTION`` of the job's package).
        what: how a person is told what to give.
        in_package: it names a file of the job's package (a job run elsewhere gets its path).
    """

    kind: Literal["script", "command", "reference"]
    what: str
    in_package: bool


SCRIPT = Entry("script", "the trainer's Python script and its arguments (train.py --lr 3e-4)", True)
COMMAND = Entry("command", "any program and its arguments, run as it is (bash run.sh)", False)
REFERENCE = Entry("reference", "FILE:FUNCTION of the job's package, then its arguments", True)


@dataclass(frozen=True)
class Setting:
    """A setting of jobs that only some methods take (a field of :class:`~tlaunch.jobs.JobSpec`).

    Attributes:
        name: the field's name (``nnodes``).
        help: what it is, for every help text.
        default: its value when not given (a method that does not take it needs it so).
        lacking: how a method that does not take it is said to lack it.
    """

    name: str
    help: str
    default: object
    lacking: str = ""

    def lacks(self, method: str, called: str) -> str:
        """``"method basic takes no nnodes"``: how ``method`` lacks this setting."""
        return f"{called} {method} {self.lacking or f'takes no {self.name}'}"


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting("nnodes", "N or MIN:MAX nodes (elastic); the job's nodes are MAX", None),
        Setting("nproc_per_node", "workers per node (usually its GPUs)", 1),
        Setting("max_restarts", "restarts of the worker group", 0),
        Setting(
            "set_share_file",
            "TLAUNCH_SHARE_FILE (and the script's --share_file) points at a file every trainer sees",
            False,
        ),
        Setting(
            "rank_args",
            "the script gets --rank R --world_size N (and --share_file F) after its own arguments, as "
            "the original TLaunch's basic mode gives them",
            True,
        ),
        Setting(
            "pservers",
            "replicas of the program's 'pserver' group (make_program(pservers=N))",
            0,
            "has no parameter-server group",
        ),
    )
}
"""The settings some methods take, by name (each :class:`Method` names those it takes)."""


def _one_trainer(job: MethodJob) -> int:
    return 1


def _nnodes_max(job: MethodJob) -> int:
    """torchrun's trainer count: the MAX of ``nnodes`` (the seed's torchrun has no ``num_trainer``)."""
    last = (job.nnodes or "").rpartition(":")[2]
    return int(last) if last.isdigit() and int(last) > 0 else 1


@dataclass(frozen=True)
class Method:
    """One launch method of jobs (see the module docstring).

    Attributes:
        name: its name (``JobSpec.method``, the LPJob's ``spec.launcher``, a ``tlaunch`` command).
        summary: one line on what runs on each node.
        entry: what the job's entry is.
        settings: the :data:`SETTINGS` it takes (any other must keep its default).
        pods: how it runs on Kubernetes (None: it does not; a program there is ``launch_type='k8s'``).
        keeps_results: its runner returns what the job returned, kept with the run (``results()``).
        trainers: its trainer (node) count when the job gives none.
    """

    name: str
    summary: str
    entry: Entry
    settings: frozenset[str] = frozenset()
    pods: PodSide | None = None
    keeps_results: bool = False
    trainers: Callable[[MethodJob], int] = _one_trainer

    def check_settings(self, given: Mapping[str, object], called: str = "method") -> None:
        """Refuse a setting this method does not take (``given``: setting name -> value).

        ``called`` is how the caller names the method's field (``launch_method`` in the job server).

        Raises:
            LaunchError: the first setting given that the method does not take, naming the methods
                that do.
        """
        for name, value in given.items():
            setting = SETTINGS[name]
            if name in self.settings or value == setting.default or value is None:
                continue
            takers = [m.name for m in METHODS.values() if name in m.settings]
            raise LaunchError(
                f"{name}={value!r}: {setting.lacks(self.name, called)}; leave it {setting.default!r}, "
                f"or use {called} {' or '.join(takers)} ({setting.help})"
            )

    def in_pods(self) -> PodSide:
        """How this method runs on Kubernetes.

        Raises:
            LaunchError: it does not.
        """
        if self.pods is None:
            raise LaunchError(
                f"method {self.name!r} does not run on Kubernetes; it runs on hosts and SLURM "
                f"(those on Kubernetes: {list(method_names('kubernetes'))})"
            )
        return self.pods


NNODES = r"^[1-9][0-9]*(:[1-9][0-9]*)?$"
"""What ``nnodes`` takes: ``N`` or ``MIN:MAX``."""
_AT_LEAST_1 = {"type": "integer", "minimum": 1}
_PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
_TRAINERS = frozenset({"set_share_file"})
"""What the methods of N trainers with a rank each take."""

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "basic",
            "N trainers, each told its rank, world size and rank 0's address (environment and "
            "--rank/--world_size arguments) and an optional shared file; the script does the rest",
            SCRIPT,
            _TRAINERS | {"rank_args"},
            PodSide(
                basic_pod,
                role_command=python_script,
                section=(
                    SectionKey("rankArgs", {"type": "boolean"}, "rank_args", True),
                    SectionKey("masterPort", _PORT, None, TORCH_MASTER_PORT),
                ),
            ),
        ),
        Method(
            "torchrun",
            "torch's elastic agent on every node, c10d rendezvous on the first",
            SCRIPT,
            frozenset({"nnodes", "nproc_per_node", "max_restarts"}),
            PodSide(
                torchrun_pod,
                section=(
                    SectionKey("nnodes", {"type": "string", "pattern": NNODES}, "nnodes", str),
                    SectionKey("nprocPerNode", _AT_LEAST_1, "nproc_per_node", 1),
                    SectionKey("maxRestarts", {"type": "integer", "minimum": 0}, "max_restarts", 0),
                    SectionKey("rdzvPort", _PORT, None, RDZV_PORT),
                ),
            ),
            trainers=_nnodes_max,
        ),
        Method(
            "deepspeed",
            "DeepSpeed's per-node launcher on every node, with the job's hostfile",
            SCRIPT,
            frozenset({"nproc_per_node"}),
            PodSide(
                deepspeed_pod,
                deepspeed_files,
                section=(
                    SectionKey("slotsPerNode", _AT_LEAST_1, "nproc_per_node", 1),
                    SectionKey("masterPort", _PORT, None, TORCH_MASTER_PORT),
                ),
            ),
        ),
        Method(
            "command",
            "N trainers, each running the job's command (any program) with RANK, WORLD_SIZE and rank 0's "
            "address",
            COMMAND,
            _TRAINERS,
            PodSide(trainer_pod),
        ),
        Method(
            "program",
            "a Launchpad-style program made by FILE:FUNCTION of the package (pservers: its 'pserver' group)",
            REFERENCE,
            frozenset({"pservers"}),
        ),
        Method(
            "function",
            "FILE:FUNCTION of the package in nproc_per_node workers per host; its results kept",
            REFERENCE,
            frozenset({"nproc_per_node"}),
            keeps_results=True,
        ),
    )
}
"""Every launch method, by name, in the order they are listed to users."""

DEFAULT_METHOD = next(iter(METHODS))
"""The method of a job that names none (``basic``)."""


def method_names(target: Literal["kubernetes"] | None = None) -> tuple[str, ...]:
    """The methods' names; with ``target="kubernetes"``: those that run in pods (every method runs on
    hosts and SLURM)."""
    return tuple(name for name, m in METHODS.items() if target is None or m.pods is not None)


def methods_of(entry: Entry) -> tuple[str, ...]:
    """The names of the methods whose entry is ``entry`` (``methods_of(REFERENCE)``: program, function)."""
    return tuple(name for name, m in METHODS.items() if m.entry is entry)


def get_method(name: object) -> Method:
    """The method called ``name``.

    Raises:
        LaunchError: no such method (the message lists them).
    """
    try:
        return METHODS[name]  # type: ignore[index]
    except (KeyError, TypeError):
        raise LaunchError(
            f"method {name!r} is not one of {list(METHODS)}; use one of them (e.g. {DEFAULT_METHOD!r})"
        ) from None


def describe(names: Sequence[str]) -> str:
    """``basic, torchrun or deepspeed``."""
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names)
