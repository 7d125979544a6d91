"""Function launch: run ``func`` on N hosts x M workers with an initialised process group; get every result.

::

    result = tlaunch.torch.launch(train, hostnames=["node1", "node2"], workers_per_host=8)
    model = result.rank(0)

The job is a program (:mod:`tlaunch.torch.job`): one agent per host starts
that host's workers (:mod:`tlaunch.torch.worker`), which get ``RANK``,
``LOCAL_RANK``, ``GROUP_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT`` and (unless ``backend=None``) the default
process group. A worker that raises ends the launch at once and its own
exception is raised here, with its remote traceback; each launch is
self-cleaning: nothing of it runs once ``launch`` returns or raises.
"""

from __future__ import annotations

import importlib.util
import pickle
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import cloudpickle

from tlaunch.backends.slurm.options import SlurmOptions
from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.errors import LaunchError
from tlaunch.pickling import dumps
from tlaunch.runtime.packing import user_module
from tlaunch.torch.agent import AgentSpec, function_agent
from tlaunch.torch.env import DEFAULT_ENV_VARS, copied_env
from tlaunch.torch.errors import WorkerFailedError, WorkerRaisedError
from tlaunch.torch.job import start_job
from tlaunch.torch.logs import default_log_dir
from tlaunch.torch.outcomes import JobOutcome, WorkerFailure
from tlaunch.torch.placement import HostOptions, WorkersSpec, check_workers, resolve_hostnames

__all__ = ["LaunchResult", "Launcher", "launch"]

BackendName = Literal["nccl", "gloo", "mpi", "ucc", "auto"]
_BACKENDS = (None, "nccl", "gloo", "mpi", "ucc", "auto")


@dataclass
class LaunchResult:
    """What every worker's function returned.

    Attributes:
        results: ``results[host][local_rank]``, hosts in launch order.
        run_id: the launch's run id.
        log_dir: the folder of its logs (``<host>[<local_rank>].log``).
    """

    results: dict[str, list[Any]]
    run_id: str = ""
    log_dir: str = ""

    @property
    def hosts(self) -> list[str]:
        """The hosts, in launch order."""
        return list(self.results)

    @property
    def world_size(self) -> int:
        """How many workers ran."""
        return sum(len(r) for r in self.results.values())

    def rank(self, i: int) -> Any:
        """The result of global rank ``i``.

        Raises:
            IndexError: no such rank.
        """
        if not 0 <= i < self.world_size:
            raise IndexError(f"rank {i} is out of range: the launch had {self.world_size} workers")
        for values in self.results.values():
            if i < len(values):
                return values[i]
            i -= len(values)
        raise AssertionError("unreachable")

    def index(self, hostname: str, local_rank: int) -> Any:
        """The result of worker ``local_rank`` on ``hostname``.

        Raises:
            KeyError: no such host; IndexError: no such local rank.
        """
        if hostname not in self.results:
            raise KeyError(f"host {hostname!r} was not part of the launch; its hosts: {self.hosts}")
        return self.results[hostname][local_rank]


def _check_torch(backend: str | None) -> None:
    if backend is not None and importlib.util.find_spec("torch") is None:
        raise LaunchError(
            f"backend={backend!r} needs PyTorch, which is not installed here; "
            "pip install 'tlaunch[torch]' (or backend=None for plain processes)"
        )


def launch(
    func: Callable[..., Any],
    func_args: Sequence[Any] = (),
    func_kwargs: Mapping[str, Any] | None = None,
    hostnames: Sequence[str] | str = "auto",
    workers_per_host: WorkersSpec = "auto",
    ssh_config_file: str | None = None,
    backend: BackendName | None = "auto",
    timeout: float = 600,
    default_env_vars: Sequence[str] = DEFAULT_ENV_VARS,
    extra_env_vars: Sequence[str] = (),
    env_file: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    log_dir: str | None = None,
    echo_ranks: Sequence[int] | None = (0,),
    log_handlers: Sequence[Any] = (),
    master_addr: str | None = None,
    master_port: int | None = None,
    master_interface: str | None = None,
    working_dir: str | Literal[False] | None = None,
    ssh: SSHOptions | None = None,
    slurm: SlurmOptions | None = None,
    run_id: str | None = None,
) -> LaunchResult:
    """Run ``func(*func_args, **func_kwargs)`` in every worker of every host; return all results.

    Args:
        func: the function (defined anywhere: a script's own functions travel by value).
        func_args: its positional arguments (pickled once, shipped to each host).
        func_kwargs: its keyword arguments (the same).
        hostnames: hosts (``localhost`` needs no SSH; others as ssh-config names or
            ``user@host:port``), ``"slurm"`` (the allocation) or ``"auto"`` (the
            allocation inside one, else ``["localhost"]``). The first is the head.
        workers_per_host: an int, one int per host, ``"gpu"`` (each host's visible
            GPUs), ``"cpu"``, ``"auto"`` (GPUs, else CPUs) or ``"slurm"`` (the
            allocation's GPUs per node, else its CPUs per node).
        ssh_config_file: the ssh config (default: ``~/.ssh/config``).
        backend: the process group's backend; ``"auto"``: ``nccl`` when every host
            has GPUs, else ``gloo``; None: no process group.
        timeout: seconds for agents to register and the process group to form.
        default_env_vars: ``fnmatch`` patterns of the launcher's variables to copy
            to every worker (the scheduler's per-host variables, like
            ``CUDA_VISIBLE_DEVICES``, never are).
        extra_env_vars: more such patterns.
        env_file: a file each host's agent sources (bash) before starting workers.
        env: more variables for every worker.
        log_dir: where ``<run id>/<host>[<local_rank>].log`` go (default
            ``$TLAUNCH_LOG_DIR`` or ``./tlaunch_logs``).
        echo_ranks: global ranks whose output is echoed here as ``[host rank] line``.
        log_handlers: ``logging.Handler``s that get every worker's and agent's lines.
        master_addr: where rank 0's store listens (default: the head host's address
            as the other hosts reach it).
        master_port: its port (default: a port free there).
        master_interface: take the head's address from this network interface.
        working_dir: a folder shipped to every SSH host; workers start in it (False: a shared
            filesystem: nothing shipped).
        ssh: options of SSH hosts (``python``, ``setup``, ``accept_unknown_hosts``...:
            :class:`~tlaunch.backends.ssh.SSHOptions`); given, remote hosts are
            reached over SSH even inside a SLURM allocation.
        slurm: options of the allocation's steps (``python``, ``srun_args``:
            :class:`~tlaunch.backends.slurm.SlurmOptions`), when the hosts are its nodes.
        run_id: the run's id (default: made from the function's name).

    Returns:
        A :class:`LaunchResult`.

    Raises:
        Exception: the first worker that raised, its own exception (its remote
            traceback is ``remote_traceback`` and printed).
        WorkerFailedError: a worker died without raising (signal, OOM, ``os._exit``).
        AgentFailedError: a host's agent died or its host was lost.
        WorkerRaisedError: a worker raised an exception that cannot be unpickled here.
        LaunchError: bad arguments (before anything starts).
    """
    if not callable(func):
        raise LaunchError(f"func={func!r} is not callable; pass the function to run in every worker")
    if backend not in _BACKENDS:
        raise LaunchError(f"backend={backend!r} is not one of {list(_BACKENDS)}")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise LaunchError(f"timeout={timeout!r} must be a number of seconds > 0")
    if master_port is not None and not (isinstance(master_port, int) and 0 < master_port < 65536):
        raise LaunchError(f"master_port={master_port!r} must be a port number, 1..65535")
    _check_torch(backend)
    hosts = resolve_hostnames(hostnames)
    workers = check_workers(workers_per_host, len(hosts))
    options = HostOptions.given(ssh, slurm, ssh_config_file, working_dir)
    payload = _payload(func, tuple(func_args), dict(func_kwargs or {}))
    spec = AgentSpec(
        payload,
        workers,
        hosts,
        backend,
        float(timeout),
        env_file=env_file,
        master_addr=master_addr,
        master_port=master_port,
        master_interface=master_interface,
    )
    fixed = [w if isinstance(w, int) else None for w in workers]

    def rank_of(host: str, local_rank: int) -> int | None:
        i = hosts.index(host)
        if any(w is None for w in fixed[: i + 1]):
            return None
        return sum(w or 0 for w in fixed[:i]) + local_rank

    job = start_job(
        getattr(func, "__name__", "function"),
        hosts,
        function_agent,
        lambda i: (spec,),
        log_dir=log_dir or default_log_dir(),
        echo_ranks=echo_ranks,
        rank_of=rank_of,
        handlers=log_handlers,
        host_options=options,
        env=copied_env([*default_env_vars, *extra_env_vars], env),
        run_id=run_id,
    )

    def result(outcome: JobOutcome) -> LaunchResult:
        error = _worker_error(outcome.failure) if outcome.failure is not None else None
        if error is not None:
            _say(error)
            raise error
        return LaunchResult(
            {
                hosts[i]: [cloudpickle.loads(r) for r in o.results or ()]
                for i, o in sorted(outcome.outcomes.items())
            },
            job.run_id,
            job.logs.dir,
        )

    return job.end_with(result)


def _payload(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """``(func, args, kwargs)`` pickled for the workers; the user's own module goes by value.

    Raises:
        LaunchError: something cannot be pickled.
    """
    mod = user_module(func)
    if mod is not None:
        cloudpickle.register_pickle_by_value(mod)
    try:
        return dumps((func, args, kwargs))
    except Exception as exc:
        raise LaunchError(f"func or its arguments cannot be pickled to send to the workers: {exc}") from exc
    finally:
        if mod is not None:
            cloudpickle.unregister_pickle_by_value(mod)


def _worker_error(failure: WorkerFailure) -> BaseException:
    """The exception to raise for a worker's failure: its own, else one that says what is known.

    Its own exception is unpickled here; whatever that unpickling does (raise,
    or ``sys.exit(0)``: any ``BaseException``), and whenever it is not an
    ``Exception`` (a worker's ``SystemExit`` or ``KeyboardInterrupt`` raised
    here would end the launcher as if it had been asked to), the failure is
    still raised, as a :class:`WorkerRaisedError` with the type, message and
    traceback the worker recorded.
    """
    host, rank, local_rank = failure.host, failure.rank or 0, failure.local_rank or 0
    if failure.error is None:
        return WorkerFailedError(host, rank, local_rank, failure.exit_code or 0, failure.log_tail)
    record = pickle.loads(failure.error)  # a dict of builtins, written by tlaunch.torch.worker
    where = f"rank {rank} (host {host!r}, local rank {local_rank})"
    exc: object = None
    if record.get("exception") is not None:
        try:
            exc = cloudpickle.loads(record["exception"])
        except BaseException:  # whatever it did, the worker failed: say so below
            exc = None
    if not isinstance(exc, Exception):
        return WorkerRaisedError(
            host, rank, local_rank, record["type"], record["message"], record["traceback"]
        )
    exc.remote_traceback = record["traceback"]  # type: ignore[attr-defined]
    exc.host, exc.rank, exc.local_rank = host, rank, local_rank  # type: ignore[attr-defined]
    if hasattr(exc, "add_note"):
        exc.add_note(f"raised by worker {where}; its traceback:\n{record['traceback'].rstrip()}")
    return exc


def _say(error: BaseException) -> None:
    """Print the root cause at once (the teardown comes after)."""
    tb = getattr(error, "remote_traceback", None)
    where = ""
    if hasattr(error, "rank"):
        where = f"rank {error.rank} (host {error.host!r}, local rank {error.local_rank}) "  # type: ignore[attr-defined]
    text = f"tlaunch.torch: worker {where}failed: {type(error).__name__}: {error}"
    if tb and isinstance(error, Exception) and not isinstance(error, WorkerRaisedError):
        text = f"tlaunch.torch: worker {where}raised:\n{tb.rstrip()}"
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


@dataclass
class Launcher:
    """The arguments of :func:`launch` as a dataclass (fill it with ``tyro.cli(Launcher)`` or flags).

    ``Launcher(hostnames=["a", "b"], workers_per_host=2).run(train, lr=0.1)``
    is ``launch(train, func_kwargs={"lr": 0.1}, hostnames=["a", "b"], workers_per_host=2)``.
    """

    hostnames: list[str] | Literal["auto", "slurm"] = "auto"
    """Hosts (the first is the head); slurm: the allocation; auto: the allocation, else localhost."""
    workers_per_host: int | list[int] | Literal["cpu", "gpu", "auto", "slurm"] = "auto"
    """Workers on each host: a number, one per host, or counted on each host."""
    ssh_config_file: str | None = None
    """The ssh config (default ~/.ssh/config)."""
    backend: BackendName | None = "auto"
    """The process group's backend (auto: nccl when every host has GPUs, else gloo; None: none)."""
    timeout: int = 600
    """Seconds for agents to register and the process group to form."""
    default_env_vars: tuple[str, ...] = DEFAULT_ENV_VARS
    """Launcher variables copied to every worker (fnmatch patterns)."""
    extra_env_vars: tuple[str, ...] = ()
    """More patterns to copy."""
    env_file: str | None = None
    """A file each host sources (bash) before starting its workers."""
    log_dir: str | None = None
    """Where <run id>/<host>[<local rank>].log go (default $TLAUNCH_LOG_DIR or ./tlaunch_logs)."""
    echo_ranks: tuple[int, ...] = (0,)
    """Global ranks whose output is echoed here."""
    master_addr: str | None = None
    """Rank 0's address (default: the head's address as the other hosts reach it)."""
    master_port: int | None = None
    """Rank 0's port (default: one free on the head)."""
    master_interface: str | None = None
    """Take the head's address from this network interface."""
    working_dir: str | Literal[False] | None = None
    """A folder shipped to every SSH host; workers start in it (False: a shared filesystem: none)."""
    python: str | None = None
    """The Python of the SSH hosts (default: the launcher's path)."""
    env: dict[str, str] = field(default_factory=dict)
    """More variables for every worker."""

    def run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> LaunchResult:
        """``launch(func, args, kwargs, ...)`` with this launcher's settings."""
        return launch(
            func,
            args,
            kwargs,
            hostnames=self.hostnames,
            workers_per_host=self.workers_per_host,
            ssh_config_file=self.ssh_config_file,
            backend=self.backend,
            timeout=self.timeout,
            default_env_vars=self.default_env_vars,
            extra_env_vars=self.extra_env_vars,
            env_file=self.env_file,
            env=self.env,
            log_dir=self.log_dir,
            echo_ranks=self.echo_ranks,
            master_addr=self.master_addr,
            master_port=self.master_port,
            master_interface=self.master_interface,
            working_dir=self.working_dir,
            ssh=None if self.python is None else SSHOptions(python=self.python),
        )
