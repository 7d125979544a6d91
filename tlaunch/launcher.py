"""``launch()``: turn a program into a running :class:`~tlaunch.run.Run`, on any backend.

The launcher owns what every backend shares, once: the plan, the options, the
run's keys and directory, the node payloads, environment and restart
policies, the progress display and output sink, the run record, and the
:class:`Run` with its failure report and teardown. A backend
(:mod:`tlaunch.backends`) only places processes: ``prepare`` (check, start
nothing), ``start`` (coordinator and nodes), ``stop``, ``detach``. Nothing is
left running when ``launch`` raises.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import shutil
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from tlaunch import context
from tlaunch.backends import backend_names, check_backend_type, claiming_backend, get_backend
from tlaunch.backends.base import Backend, BackendType, CoordinatorLink, RunSettings, RunSpec
from tlaunch.display import Phases, Printer
from tlaunch.errors import LaunchError
from tlaunch.flags import parsed_flags
from tlaunch.launch_types import LaunchType
from tlaunch.launchpad_args import bind_addresses, check_serializable, finish_later, read_args
from tlaunch.options import LaunchOptions, restart_policies, split_options
from tlaunch.plan import LaunchPlan, make_plan, placed_nodes
from tlaunch.procs import pid_space, process_start
from tlaunch.program import Program
from tlaunch.rpc.security import RunKeys
from tlaunch.run import Run
from tlaunch.runtime.node_runtime import NodeRuntime, RuntimeConfig
from tlaunch.runtime.packing import SharedPayloads, heavy_notes, pickle_nodes, pickle_nodes_shared
from tlaunch.runtime.records import RunRecord, free_run_id, private_dirs, runs_dir, write_record
from tlaunch.runtime.setups import node_setups

__all__ = ["LaunchType", "Run", "launch", "runs_dir"]

log = logging.getLogger(__name__)
# What large arguments cost, as log records too (the display shows them): a handler of its own
# keeps logging's last resort from printing each a second time where nothing is configured.
_cost_log = logging.getLogger(f"{__name__}.costs")
_cost_log.addHandler(logging.NullHandler())


TerminalName = Literal["current_terminal", "output_to_files", "tmux_session", "ssh_tmux_session"]
_TERMINALS = ("current_terminal", "output_to_files", "tmux_session", "ssh_tmux_session")
_STREAMING = ("current_terminal", "ssh_tmux_session")  # terminals whose output the launcher shows
_ELSEWHERE = {"local_docker": "Docker containers", "vertex_ai": "Google Cloud Vertex AI"}


def launch(
    programs: Program | Sequence[Program],
    launch_type: LaunchType | str | BackendType | None = None,
    xm_resources: Any = None,
    local_resources: Mapping[str, Any] | None = None,
    test_case: Any = None,
    terminal: TerminalName | str | None = None,
    *,
    wait: bool | None = None,
    serialize_py_nodes: bool | None = None,
    controller_xm_requirements: Any = None,
    stop_grace: float = 5.0,
    resolve_timeout: float = 300.0,
    coordinator_timeout: float = 15.0,
    env: dict[str, str] | None = None,
    run_id: str | None = None,
    **options: Any,
) -> Run:
    """Launch a program and (for processes and hosts) wait until it ends.

    Launchpad's arguments keep Launchpad's meaning (``tlaunch.launchpad_args``);
    the rest are tlaunch's.

    Args:
        programs: the program to run (a list: its first, as in Launchpad).
        launch_type: ``local_mp`` (a process per node; the default),
            ``local_mt`` (threads), ``test_mt``/``test_mp`` (threads/processes,
            for tests), ``ssh`` (the default when a node is placed on a remote
            host), ``slurm`` (each node a step of the SLURM allocation; the
            default inside an allocation of other or several nodes, see
            ``SlurmBackend.claims``), or a backend class; when None,
            ``--lp_launch_type`` if given. With ``launch_type="slurm",
            submit=True`` and resources (``SlurmOptions``) the program is
            submitted as a batch job and its ``SlurmJob`` is returned.
        xm_resources: Launchpad's Vertex AI resources; ignored here.
        local_resources: ``local_mp``/``test_mp``: a ``PythonProcess`` (env,
            args, interpreter) per group label.
        test_case: a ``unittest.TestCase`` whose cleanup stops the run.
        terminal: where output goes: ``current_terminal`` (default), ``output_to_files``,
            ``tmux_session``; ``ssh_tmux_session`` for SSH launches; when None,
            ``--lp_terminal`` if given.
        wait: block until the program ends (Ctrl-C stops it). By default
            ``local_mt``, ``test_mt`` and ``test_mp`` return at once, as in
            Launchpad (``local_mt`` waits for its program when the interpreter
            exits), and the others wait.
        serialize_py_nodes: thread launches: check that every node pickles
            (default: ``test_mt`` yes, ``local_mt`` no).
        controller_xm_requirements: Launchpad's; ignored here.
        stop_grace: seconds nodes get to exit after a stop before SIGTERM, then SIGKILL.
        resolve_timeout: how long a handle's first call waits for its node to come up.
        coordinator_timeout: a node that cannot reach its run's coordinator (the
            launcher died) for this long stops, and its process group is killed
            ``stop_grace`` seconds later.
        env: extra environment variables of every node process.
        run_id: the run's id (default: made from the program's name). A process
            that recorded the run before launching it (a submitted job's
            launcher, building its runtime environment: ``runtime.pyenv``)
            passes the id of that record; the launch's record replaces it.
        **options: the other common options (:class:`~tlaunch.options.LaunchOptions`:
            ``env_patterns``, ``max_restarts``, ``restart_backoff``, ``on_failure``,
            ``failure_grace``, ``detach``) and the backend's own (``SSHOptions`` for ``ssh``).

    Returns:
        The :class:`Run` (already ended when it waited).

    Raises:
        LaunchError: bad options or a node that cannot be shipped; nothing started.
        RunFailedError: (when waiting) a node failed.
        ProgramError: the program graph is invalid.
    """
    args = read_args(programs, launch_type, terminal, wait, test_case, serialize_py_nodes, xm_resources)
    plan = make_plan(args.program, None if run_id is None else free_run_id(runs_dir(), run_id))
    kind = _backend_type(args.launch_type, plan, args.terminal)
    if local_resources is not None:
        options["local_resources"] = local_resources
    common, own = split_options(
        {
            "stop_grace": stop_grace,
            "resolve_timeout": resolve_timeout,
            "coordinator_timeout": coordinator_timeout,
            "env": env,
            **options,
        }
    )
    if own.get("submit"):
        given: dict[str, Any] = {"stop_grace": stop_grace, "resolve_timeout": resolve_timeout}
        given.update(coordinator_timeout=coordinator_timeout, env=env, **options)
        if args.terminal is not None:
            given["terminal"] = args.terminal
        return _submit(kind, args.program, plan, own, given)  # type: ignore[no-any-return]
    backend = _make_backend(kind, plan, args.terminal, own)
    if common.detach and not kind.can_detach:
        raise LaunchError(
            f"detach=True needs a backend whose runs outlive the launcher; {kind.name!r} cannot"
        )
    if kind.placement == "threads" and args.serialize:
        check_serializable(args.program)
    if kind.placement != "hosts":
        bind_addresses(placed_nodes(args.program))
    phases = Phases()
    terminal_name = args.terminal or kind.terminals[0]
    spec = _run_spec(args.program, plan, kind, backend, common, terminal_name, phases, args.launch_type)
    link = _start(backend, spec, phases)
    try:
        run = _hold(spec, link, backend, common, phases, args.workers_exited_error)
    except BaseException:  # the record could not be written (a full disk...): nothing may stay
        link.stop("the launch failed")
        with contextlib.suppress(Exception):
            backend.stop(0.0)
        link.close()
        shutil.rmtree(spec.run_dir, ignore_errors=True)
        raise
    if common.detach:
        run.detach()
    elif args.wait:
        _wait(run, kind.can_detach)
    else:
        # The caller talks to its nodes next: its TLS context is made while they start, not after.
        spec.keys.context(server=False)
        finish_later(args, run.wait, run.stop, run.cleanup_after_test)
    return run


def _backend_type(value: object, plan: LaunchPlan, terminal: str | None) -> BackendType:
    """The backend of ``launch_type`` (by default: SSH if a node has a remote host, else local_mp)."""
    if terminal is not None and terminal not in _TERMINALS:
        raise LaunchError(
            f"terminal {terminal!r} is not one of {list(_TERMINALS)}; use e.g. terminal='current_terminal'"
        )
    if value is not None and not isinstance(value, (str, enum.Enum)):
        return check_backend_type(value)  # a backend class
    if value is None:
        remote = [n for n in plan.nodes if n.host is not None and not n.host.is_local]
        value = "ssh" if remote or terminal == "ssh_tmux_session" else "local_mp"
        claimant = claiming_backend(plan)  # the environment is a backend's own (a SLURM allocation)
        if claimant is not None and (terminal is None or terminal in claimant.terminals):
            return claimant
    text = str(getattr(value, "value", value))
    names = backend_names()
    for lt in LaunchType:
        if text in (lt.value, lt.name) or text.lower() == lt.name.lower():
            text = lt.value
    if text in _ELSEWHERE:
        raise LaunchError(
            f"launch_type {text!r} ({_ELSEWHERE[text]}) is Launchpad's and tlaunch does not run it; "
            f"use one of {names}"
        )
    if text not in names:
        raise LaunchError(
            f"launch_type {value!r} is not one of {names} (or the LaunchType names); "
            "use e.g. launch_type='local_mp'"
        )
    kind = get_backend(text)
    if kind.placement != "hosts":
        remote = [n for n in plan.nodes if n.host is not None and not n.host.is_local]
        if remote:
            raise LaunchError(
                f"node {remote[0].key!r} is placed on host {str(remote[0].host)!r} but "
                f"launch_type {text!r} runs every node on this machine; use "
                "launch_type='ssh' (or terminal='ssh_tmux_session'), or drop .to_host()"
            )
    return kind


def _submit(
    kind: BackendType, program: Program, plan: LaunchPlan, own: dict[str, Any], given: dict[str, Any]
) -> Any:
    """``submit=True``: hand the whole program to the backend's scheduler; the job's handle."""
    if not kind.can_submit:
        submitters = [n for n in backend_names() if get_backend(n).can_submit]
        raise LaunchError(
            f"submit=True: launch_type {kind.name!r} does not submit jobs; use one that does: {submitters}"
        )
    options = kind.Options.from_kwargs(own, kind.name)
    run_dir = os.path.join(runs_dir(), plan.run_id)
    private_dirs(run_dir, top=os.path.dirname(runs_dir()))
    try:
        return kind.submit(program, plan, run_dir, options, given)
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _make_backend(kind: BackendType, plan: LaunchPlan, terminal: str | None, own: dict[str, Any]) -> Backend:
    """The backend with its typed options; an option it does not take is named with the backend that does."""
    try:
        options = kind.Options.from_kwargs(own, kind.name)
    except LaunchError:
        for name in backend_names():
            other = get_backend(name)
            fields = set(getattr(other.Options, "__dataclass_fields__", {}))
            if other is not kind and own and set(own) <= fields:
                raise LaunchError(
                    f"options {sorted(own)} belong to launch_type {name!r}, not to {kind.name!r}; "
                    f"drop them, or launch with launch_type={name!r}"
                ) from None
        raise
    return kind(plan, terminal or kind.terminals[0], options)


def _run_spec(
    program: Program,
    plan: LaunchPlan,
    kind: BackendType,
    backend: Backend,
    common: LaunchOptions,
    terminal: str,
    phases: Phases,
    launch_type: Any,
) -> RunSpec:
    """Everything the backend gets: keys, environment, restart policies, the pickled nodes."""
    nodes = {n.key or "": n for n in placed_nodes(program)}
    restarts = restart_policies(plan, common)
    payloads, shared = _pickled(nodes, kind)
    for note in heavy_notes(plan, payloads, shared):  # on the display: a notebook's cell shows it too
        phases.note(note)
        _cost_log.warning(note)
    return RunSpec(
        plan=plan,
        keys=RunKeys.generate(),
        settings=RunSettings(
            common.stop_grace,
            common.resolve_timeout,
            common.coordinator_timeout,
            common.on_failure,
            common.failure_grace,
        ),
        restarts=restarts,
        env=common.node_env(),
        terminal=terminal,
        run_dir=os.path.join(runs_dir(), plan.run_id),
        nodes=nodes,
        payloads=payloads,
        sink=(common.output or Printer()) if terminal in _STREAMING else None,
        progress=phases,
        launch_type=str(launch_type.value if isinstance(launch_type, enum.Enum) else launch_type)
        if isinstance(launch_type, (str, enum.Enum))
        else kind.name,
        flags=parsed_flags(),
        setups=node_setups(),
        buffers=shared.buffers if shared is not None else {},
        blobs=shared.blobs if shared is not None else {},
    )


def _pickled(nodes: dict[str, Any], kind: BackendType) -> tuple[dict[str, bytes], SharedPayloads | None]:
    """The nodes' payloads; for a backend that ships shared values once per host, their buffers apart."""
    if kind.placement == "threads":
        return {}, None
    by_value = kind.placement == "hosts"  # other machines cannot import the user's own modules
    if kind.shares_values:
        shared = pickle_nodes_shared(nodes, by_value=by_value)
        return shared.payloads, shared
    return pickle_nodes(nodes, by_value=by_value), None


def _start(backend: Backend, spec: RunSpec, phases: Phases) -> CoordinatorLink:
    """Prepare and start the run on its backend; on any failure nothing is left and the run dir goes."""
    private_dirs(os.path.join(spec.run_dir, "logs"), top=os.path.dirname(runs_dir()))
    try:
        with phases:
            backend.prepare(spec)
            return backend.start(spec)
    except BaseException:
        with contextlib.suppress(Exception):
            backend.stop(0.0)
        shutil.rmtree(spec.run_dir, ignore_errors=True)
        raise


def _hold(
    spec: RunSpec,
    link: CoordinatorLink,
    backend: Backend,
    common: LaunchOptions,
    phases: Phases,
    workers_exited_error: bool,
) -> Run:
    """The launcher's side of a started run: its runtime (handles in the launcher), record and Run."""
    record = None
    if link.address is not None:  # other processes can reach it: `tlaunch ps/logs/stop`
        fields = dict(backend.record)
        record = RunRecord(
            spec.run_id,
            spec.plan.program_name,
            type(backend).name,  # type: ignore[attr-defined]
            link.address,
            os.getpid(),
            launcher_start=process_start(os.getpid()),
            launcher_pid_space=pid_space(),
            hosts=list(fields.pop("hosts", ["localhost"])),
            log_dir=fields.pop("log_dir", os.path.join(spec.run_dir, "logs")),
            graph=spec.plan.graph(),
            **fields,
        )
        write_record(spec.run_dir, record, spec.keys)
    config = RuntimeConfig(
        spec.run_id, spec.plan.program_name, spec.keys, resolve_timeout=common.resolve_timeout
    )
    runtime = NodeRuntime(config, link, None)
    runtime.start_watcher()
    context.install(runtime, program_id=spec.plan.program_id)
    run = Run(
        spec.plan, link, backend, spec.run_dir, runtime, record, phases.times, spec.launch_type,
        workers_exited_error,
    )  # fmt: skip
    run.watch()
    return run


def _wait(run: Run, can_detach: bool) -> None:
    """Wait for the run; any interruption (Ctrl-C) stops it; Ctrl-\\ detaches where possible."""
    with _detach_on_sigquit(run) if can_detach else contextlib.nullcontext():
        try:
            run.wait()
        except BaseException:
            run.stop()
            raise


@contextlib.contextmanager
def _detach_on_sigquit(run: Run) -> Iterator[None]:
    """While waiting, Ctrl-\\ (SIGQUIT) detaches: the run goes on, the launcher returns."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def detach(signum: int, frame: object) -> None:
        run.detach()

    previous = signal.signal(signal.SIGQUIT, detach)
    try:
        yield
    finally:
        signal.signal(signal.SIGQUIT, previous)
