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
from typing import Any, Literal, overload

from tlaunch import context
from tlaunch.backends.base import Backend, BackendOptions, BackendType, CoordinatorLink, RunSettings, RunSpec
from tlaunch.backends.handle import RunHandle
from tlaunch.display import Phases, Printer
from tlaunch.errors import LaunchError
from tlaunch.flags import parsed_flags
from tlaunch.launch_types import LaunchType
from tlaunch.launcher import notebook
from tlaunch.launcher.choice import backend_type, submit_program
from tlaunch.launcher.submitted import Submitted
from tlaunch.launchpad_args import bind_addresses, check_serializable, finish_later, read_args
from tlaunch.options import LaunchOptions, restart_policies, typed_options
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
_STREAMING = ("current_terminal", "ssh_tmux_session")  # terminals whose output the launcher shows
Programs = Program | Sequence[Program]
LaunchTypeArg = LaunchType | str | BackendType | None
TerminalArg = TerminalName | str | None


# The two forms' types, stated compactly (the implementation below spells each argument out).
# fmt: off
@overload
def launch(programs: Programs, launch_type: LaunchTypeArg = None, xm_resources: Any = None,
           local_resources: Mapping[str, Any] | None = None, test_case: Any = None,
           terminal: TerminalArg = None, *, submit: Literal[True], options: LaunchOptions | None = None,
           backend_options: BackendOptions | None = None, run_id: str | None = None,
           **kwargs: Any) -> RunHandle: ...
@overload
def launch(programs: Programs, launch_type: LaunchTypeArg = None, xm_resources: Any = None,
           local_resources: Mapping[str, Any] | None = None, test_case: Any = None,
           terminal: TerminalArg = None, *, wait: bool | None = None, serialize_py_nodes: bool | None = None,
           submit: Literal[False] = False, options: LaunchOptions | None = None,
           backend_options: BackendOptions | None = None, run_id: str | None = None,
           **kwargs: Any) -> Run: ...
# fmt: on


def launch(
    programs: Programs,
    launch_type: LaunchTypeArg = None,
    xm_resources: Any = None,
    local_resources: Mapping[str, Any] | None = None,
    test_case: Any = None,
    terminal: TerminalArg = None,
    *,
    wait: bool | None = None,
    serialize_py_nodes: bool | None = None,
    controller_xm_requirements: Any = None,
    submit: bool = False,
    options: LaunchOptions | None = None,
    backend_options: BackendOptions | None = None,
    run_id: str | None = None,
    **kwargs: Any,
) -> Run | RunHandle:
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
            ``--lp_launch_type`` if given.
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
        submit: hand the whole program to the backend's scheduler (``launch_type="slurm"``
            with its resources in ``SlurmOptions``: a batch job) and return its
            :class:`~tlaunch.backends.handle.RunHandle` (a ``SlurmJob``) at once.
        options: the options of every launch (:class:`~tlaunch.options.LaunchOptions`:
            ``stop_grace``, ``env``, ``max_restarts``, ``on_failure``, ``detach``...).
        backend_options: the backend's own (``SSHOptions`` for ``ssh``, ``SlurmOptions``...).
        run_id: the run's id (default: made from the program's name). A process
            that recorded the run before launching it (a submitted job's
            launcher, building its runtime environment: ``runtime.pyenv``)
            passes the id of that record; the launch's record replaces it.
        **kwargs: Launchpad's form: each option of ``options`` and of the backend's
            as a keyword (``stop_grace=1``, ``ssh_config=...``), over the typed ones.

    Returns:
        The :class:`Run` (already ended when it waited); with ``submit=True``, the job's handle.

    Raises:
        LaunchError: bad options or a node that cannot be shipped; nothing started.
        RunFailedError: (when waiting) a node failed.
        ProgramError: the program graph is invalid.
    """
    args = read_args(programs, launch_type, terminal, wait, test_case, serialize_py_nodes, xm_resources)
    plan = make_plan(args.program, None if run_id is None else free_run_id(runs_dir(), run_id))
    kind = backend_type(args.launch_type, plan, args.terminal)
    if local_resources is not None:
        kwargs["local_resources"] = local_resources
    common, own = typed_options(kind, kwargs if not submit else {**kwargs, "submit": True}, options,
                                backend_options)  # fmt: skip
    if getattr(own, "submit", False):
        return submit_program(kind, args.program, plan, own, Submitted(kind.name, common, args.terminal))
    backend = kind(plan, args.terminal or kind.terminals[0], own)
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
        _wait(run, kind.can_detach, spec.keys)
    else:
        # The caller talks to its nodes next: its TLS context is made while they start, not after.
        spec.keys.context(server=False)
        finish_later(args, run.wait, run.stop, run.cleanup_after_test)
    return run


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


def _wait(run: Run, can_detach: bool, keys: RunKeys) -> None:
    """Wait for the run; any interruption (Ctrl-C) stops it; Ctrl-\\ detaches where possible. In a
    Jupyter cell that can ask for input, a node that pauses is attached from the cell (:mod:`.notebook`)."""
    with _detach_on_sigquit(run) if can_detach else contextlib.nullcontext():
        try:
            if notebook.can_ask():
                notebook.wait_attaching(run, keys)
            else:
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
