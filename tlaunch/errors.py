"""The exception tree of tlaunch.

Every error tlaunch raises on purpose derives from :class:`TLaunchError`::

    TLaunchError
    ├── ProgramError            bad program graph: labels, groups, handles, hosts
    ├── LaunchError             a launch could not start (nothing is left running)
    │   └── PicklingError       a node (or one of its attributes) cannot be shipped
    ├── RunFailedError          a node of a running program failed; carries its traceback
    ├── BatchJobError           a batch job ended badly with no node failure (time limit, lost node)
    ├── StopError               a run could not be stopped completely; .left names what is alive
    ├── RunNotFoundError        no run (or several) of that id in the run store; also a LookupError
    ├── DebugError              a node cannot be debugged: not paused, unreachable, or no run key here
    ├── SSHError                a host could not be reached or used over SSH (.host)
    │   ├── HostKeyError        the host key is unknown or does not match known_hosts
    │   ├── CommandError        a remote command failed (.argv, .exit_status, .stdout, .stderr)
    │   └── HostsError          several hosts failed; .errors maps each host to its error
    ├── RPCError                a call could not be delivered or answered
    │   ├── ResolveTimeoutError the called node never registered an address
    │   └── ServerRestartedError the server was replaced while the call was in flight
    ├── RemoteError             the called method raised; carries the remote traceback
    ├── TransmitStopped         the program stopped while a transmit call was waiting
    ├── CheckpointError         a transmit checkpoint is partial or corrupt; it was not loaded
    ├── PoolError               the job server's pool of SSH hosts (tlaunch.pool.errors draws its own)
    └── TorchLaunchError        a distributed PyTorch launch failed (tlaunch.torch.errors draws its own)

Messages name the bad value, say what is valid, and how to fix it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = [
    "BatchJobError",
    "CheckpointError",
    "CommandError",
    "DebugError",
    "Fields",
    "HostKeyError",
    "HostsError",
    "LaunchError",
    "PicklingError",
    "ProgramError",
    "RPCError",
    "RemoteError",
    "ResolveTimeoutError",
    "RunFailedError",
    "RunNotFoundError",
    "SSHError",
    "ServerRestartedError",
    "StopError",
    "TLaunchError",
    "TransmitStopped",
    "builtin_exception_type",
    "failure_from_report",
]


class TLaunchError(Exception):
    """Root of every error that tlaunch raises on purpose."""


class ProgramError(TLaunchError, ValueError):
    """The program graph is invalid (labels, groups, handles, host strings)."""


class LaunchError(TLaunchError):
    """A launch could not start; nothing of it is left running."""


class PicklingError(LaunchError, RuntimeError):
    """A node, or an attribute of it, cannot be serialized for shipping.

    Also a RuntimeError, as Launchpad's serialization errors are.
    """


class SSHError(TLaunchError):
    """A host could not be reached or used over SSH."""

    def __init__(self, host: str, message: str) -> None:
        self.host = host
        super().__init__(f"{host}: {message}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.host, str(self).split(": ", 1)[1]))


class HostKeyError(SSHError):
    """The host's key is not in known_hosts, or differs from the one there."""


class CommandError(SSHError):
    """A remote command exited with a non-zero status.

    Attributes:
        argv: the command.
        exit_status: its exit status (-1 if it was killed or the channel closed).
        stdout: what it wrote to stdout.
        stderr: what it wrote to stderr.
    """

    def __init__(self, host: str, argv: list[str], exit_status: int, stdout: str, stderr: str) -> None:
        self.argv = list(argv)
        self.exit_status = exit_status
        self.stdout = stdout
        self.stderr = stderr
        tail = stderr.strip().splitlines()[-3:] if stderr.strip() else []
        detail = ("; stderr: " + " | ".join(tail)) if tail else ""
        super().__init__(host, f"{argv!r} exited with status {exit_status}{detail}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.host, self.argv, self.exit_status, self.stdout, self.stderr))


class HostsError(SSHError):
    """Several hosts failed at once; ``errors`` maps each failing host to its error."""

    def __init__(self, errors: dict[str, BaseException]) -> None:
        self.errors = dict(errors)
        lines = "\n".join(f"  - {e}" for e in errors.values())
        Exception.__init__(self, f"{len(errors)} host(s) failed:\n{lines}")
        self.host = ",".join(errors)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.errors,))


class RPCError(TLaunchError):
    """A remote call could not be delivered or its reply was lost."""


class ResolveTimeoutError(RPCError, TimeoutError):
    """The called node did not register an address within the timeout."""


class ServerRestartedError(RPCError):
    """The server was replaced (restarted) while a call to it was in flight."""


class Fields:
    """An error written as a dataclass of its constructor's arguments, pickled as them.

    Each argument is an attribute of the same name; the error crosses processes
    (pickle) as those arguments, and its constructor (``__post_init__``) makes its
    message again. Declared ``@dataclass(eq=False, repr=False)``: an exception is
    equal only to itself, and its repr is its message's, as any exception's.
    """

    def fields(self) -> tuple[object, ...]:
        """The error's constructor arguments, in their order."""
        assert dataclasses.is_dataclass(self)
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), self.fields())


@dataclasses.dataclass(eq=False, repr=False)
class RemoteError(Fields, TLaunchError):
    """The remote method raised.

    Attributes:
        type_name: qualified name of the remote exception's type.
        remote_message: ``str()`` of the remote exception.
        remote_traceback: the formatted traceback, as printed on the remote side.
        node: the node (``label/index``) that raised, when known.
    """

    type_name: str
    remote_message: str
    remote_traceback: str
    node: str | None = None

    def __post_init__(self) -> None:
        where = f" in node {self.node!r}" if self.node else ""
        super().__init__(
            f"{self.type_name}: {self.remote_message} (raised{where}; remote traceback follows)\n"
            f"{self.remote_traceback.rstrip()}"
        )


@dataclasses.dataclass(eq=False, repr=False)
class RunFailedError(Fields, TLaunchError):
    """A node of the program failed, which stopped the run.

    Attributes:
        node: the failing node, ``label/index``.
        host: the host it ran on (``localhost`` for local launches).
        exit_code: the process exit code (negative: killed by that signal), if known.
        remote_traceback: the node's traceback, if it raised.
        hint: how to fix it, where tlaunch can tell (a module missing on the host...).
    """

    node: str
    host: str
    exit_code: int | None
    remote_traceback: str | None
    reason: str = ""
    hint: str = ""

    def __post_init__(self) -> None:
        code, tb = self.exit_code, self.remote_traceback
        how = self.reason or (f"exited with code {code}" if code is not None else "failed")
        msg = f"node {self.node!r} on host {self.host!r} {how}"
        if tb:
            said = "its traceback" if tb.startswith("Traceback") else "its last output"
            msg += f"; {said}:\n{tb.rstrip()}"
        if self.hint:
            msg += f"\nhint: {self.hint}"
        self._message = msg
        super().__init__(msg)

    def __str__(self) -> str:
        return self._message

    def __reduce__(self) -> tuple[object, ...]:
        return (RunFailedError, self.fields())  # a class of as_kind() is made again, not found by name

    def as_kind(self, kind: type[BaseException] | None) -> RunFailedError:
        """This error, made again as one that is also a ``kind`` (the node's own exception type),
        where Python allows.

        ``except ValueError`` then catches a node's ``ValueError`` too, as it would
        have caught it in one process (Launchpad's thread launches raise the
        node's own exception). Types that need their own constructor arguments
        or layout (``OSError``...) give this plain ``RunFailedError``.
        """
        typed = _typed_class(kind) if kind is not None else None
        if typed is not None:
            try:
                return typed(
                    self.node, self.host, self.exit_code, self.remote_traceback, self.reason, self.hint
                )
            except Exception:  # its __init__ wants other arguments
                pass
        return self


@dataclasses.dataclass(eq=False, repr=False)
class BatchJobError(Fields, TLaunchError):
    """A batch job ended badly with no node failure to show (time limit, a lost node, a failed script).

    Attributes:
        job_id: the scheduler's job id.
        state: its final state (``TIMEOUT``, ``NODE_FAIL``, ``FAILED``...).
        exit_code: its exit code, if known.
        output: the end of its output.
    """

    job_id: str
    state: str
    exit_code: int | None
    reason: str
    output: str = ""

    def __post_init__(self) -> None:
        msg = f"batch job {self.job_id} ended {self.state}" + (f" ({self.reason})" if self.reason else "")
        if self.output.strip():
            msg += f"; the end of its output:\n{self.output.rstrip()}"
        super().__init__(msg)


def builtin_exception_type(traceback: str | None) -> type[BaseException] | None:
    """The built-in exception type named on a traceback's last line (``ValueError: ...``), if any."""
    import builtins

    last = (traceback or "").strip().rsplit("\n", 1)[-1]
    name = last.split(":", 1)[0].strip()
    kind = getattr(builtins, name, None) if name.isidentifier() else None
    return kind if isinstance(kind, type) and issubclass(kind, BaseException) else None


def failure_from_report(report: dict[str, Any]) -> RunFailedError:
    """The :class:`RunFailedError` of a failure report (``key``, ``host``, ``exit_code``, ``traceback``...).

    Reports are what a coordinator records of a node's failure, carried as JSON
    (a batch job's result, a pod's log); the error is also of the node's
    built-in exception type where its traceback names one.
    """
    return RunFailedError(
        report["key"],
        report.get("host") or "?",
        report.get("exit_code"),
        report.get("traceback"),
        report.get("reason") or "",
    ).as_kind(builtin_exception_type(report.get("traceback")))


@dataclasses.dataclass(eq=False, repr=False)
class StopError(Fields, TLaunchError):
    """Processes of a run are still alive after it was stopped and killed.

    Attributes:
        run_id: the run.
        left: host -> the pids still alive there.
    """

    run_id: str
    left: dict[str, list[str]]

    def __post_init__(self) -> None:
        self.left = dict(self.left)
        where = "; ".join(f"{host}: pids {' '.join(pids)}" for host, pids in self.left.items())
        super().__init__(
            f"run {self.run_id} is stopped but processes of it are still alive ({where}); they could not "
            "be killed: look at them (ps -o pid,stat,args -p PID) and end them by hand"
        )


_typed: dict[type[BaseException], type[RunFailedError] | None] = {}


def _typed_class(kind: type[BaseException]) -> type[RunFailedError] | None:
    """``RunFailedError`` and ``kind`` in one class (cached); None where they cannot be combined."""
    if kind not in _typed:
        plain = kind in _PLAIN_BUILTINS if kind.__module__ == "builtins" else True
        usable = issubclass(kind, Exception) and not issubclass(kind, (OSError, TLaunchError)) and plain
        made: type[RunFailedError] | None = None
        if usable:
            try:
                # Named as the plain class: a traceback reads "tlaunch.errors.RunFailedError: ...".
                made = type(
                    "RunFailedError",
                    (RunFailedError, kind),
                    {"__module__": __name__, "__qualname__": "RunFailedError"},
                )
            except TypeError:  # layouts that cannot be combined
                made = None
        _typed[kind] = made
    return _typed[kind]


_PLAIN_BUILTINS = (
    ArithmeticError, AssertionError, AttributeError, EOFError, FloatingPointError, ImportError, IndexError,
    KeyError, LookupError, MemoryError, ModuleNotFoundError, NameError, NotImplementedError, OverflowError,
    RecursionError, ReferenceError, RuntimeError, StopAsyncIteration, SystemError, TypeError,
    UnboundLocalError, ValueError, ZeroDivisionError, Exception,
)  # fmt: skip


class TransmitStopped(TLaunchError):
    """The program stopped while a transmit call (``get``, ``sample``, a full ``insert``) was waiting."""


class CheckpointError(TLaunchError):
    """A transmit checkpoint is partial, corrupt or not a checkpoint; it was not loaded."""


class RunNotFoundError(TLaunchError, LookupError):
    """No run of that id (or prefix) is in the run store, or several are; the message lists them."""


class DebugError(TLaunchError):
    """A node cannot be debugged from here: it is not paused, cannot be reached, or this
    machine does not hold its run's key (``tlaunch debug``)."""
