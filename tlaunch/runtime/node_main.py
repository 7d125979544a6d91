"""Entry point of a node process: ``python -m tlaunch.runtime.node_main - KEY [RUN_ID]``.

Every node runs under a supervisor (the supervisor process on a host, or a
thread of a local launcher): the bundle comes on stdin, the node reports to the
coordinator, runs, and notes its traceback if it raised; the supervisor
reports the end (and may restart it). The node's whole process group dies with
its supervisor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import threading
import time
import traceback
from typing import Any

# What unpickling a node needs (cloudpickle's reconstructors, for code that goes by value; the
# node types most programs use) is imported with this module: a supervisor has it before it forks
# its node, so what the node does once its bundle comes is its own work only.
import cloudpickle  # noqa: F401

import tlaunch.nodes.courier  # noqa: F401  (as cloudpickle, above)
from tlaunch import context
from tlaunch.errors import RPCError
from tlaunch.rpc import shm
from tlaunch.rpc.client import RPCClient, fixed_resolver
from tlaunch.runtime import debugger
from tlaunch.runtime.bundle import read_bundle_bytes
from tlaunch.runtime.node_runtime import NodeRuntime, RuntimeConfig

__all__ = ["SETTLE", "coordinator_client", "main"]

SETTLE = 0.5
"""Seconds a node's stop watcher waits for the node's first state before its first long poll."""


_inherited: tuple[str, RPCClient] | None = None
"""The supervisor's client of the coordinator (and its address), which its forked node goes on
with (:func:`inherit`)."""


def inherit(address: str | None, client: RPCClient | None = None) -> None:
    """Have the node forked next go on with ``client`` (its supervisor's client of the coordinator
    at ``address``, with its connection: the node's first calls as it starts, a TLS handshake
    less); the supervisor then gives the connection up (:meth:`RPCClient.hand_off`). None: no
    longer (the supervisor, once it forked)."""
    global _inherited
    _inherited = None if address is None or client is None else (address, client)


def _client(address: str, config: RuntimeConfig) -> RPCClient:
    """The client inherited from the supervisor where it calls the coordinator at ``address``,
    else a new one; this process inherits none afterwards."""
    global _inherited
    given, _inherited = _inherited, None
    if given is not None and given[0] == address:
        return given[1]
    return coordinator_client(address, config)


def coordinator_client(address: str, config: RuntimeConfig) -> RPCClient:
    """An RPC client of the coordinator at ``address``."""

    return RPCClient(
        "coordinator",
        config.keys,
        fixed_resolver(address),
        resolve_timeout=config.coordinator_lost_after,
        default_timeout=30.0,
        retry_refused=False,  # the coordinator never moves: refused means gone
        shared_memory=False,  # its messages are small: no greeting round trip on the way to serving
        tls_server=True,  # as every coordinator's client (RPCServer's tls_client)
    )


def _ready_to_serve(parent: int | None) -> None:
    """Make what the node's server needs: this host's key, which answers a caller's greeting
    (its TLS context is the one its calls to the coordinator use); then watch the supervisor.

    ``parent``: a pidfd of the supervisor (:func:`_die_with_supervisor`); when it ends, this
    process gets SIGTERM, as ``PR_SET_PDEATHSIG`` would send it. The thread lives as long as
    the process.
    """
    shm.host_key()
    if parent is not None:
        watch = select.poll()
        watch.register(parent, select.POLLIN)  # a pidfd reads as ready once its process has ended
        watch.poll()
        os.kill(os.getpid(), signal.SIGTERM)


def restore_flags(values: dict[str, tuple[str, Any]]) -> None:
    """:func:`tlaunch.flags.restore_flags`, imported only by nodes that have flags (absl: ~10 ms)."""
    from tlaunch.flags import restore_flags as restore

    restore(values)


def _kill_group_after(grace: float, why: str) -> None:
    """End this node's whole process group ``grace`` seconds from now."""

    def kill() -> None:
        logging.getLogger(__name__).error("%s: ending the node's process group", why)
        os.killpg(os.getpgid(0), signal.SIGKILL)

    timer = threading.Timer(grace, kill)
    timer.daemon = True
    timer.start()


def _end_after_stop(coord: RPCClient, grace: float) -> None:
    """The run stops: this node's group ends a second after the stop's grace, whatever else happens.

    The run's grace holds at once, whether or not the coordinator still answers;
    a shorter one (a failure stopped the run) is asked of it next.
    """
    seen = time.monotonic()
    _kill_group_after(grace + 1.0, f"stopped {grace + 1.0:.1f} s ago")
    with contextlib.suppress(RPCError, TypeError, ValueError):
        now_grace = float(coord.call("stop_grace", timeout=2.0))
        if now_grace < grace:
            left = max(0.0, now_grace + 1.0 - (time.monotonic() - seen))
            _kill_group_after(left, f"stopped {now_grace + 1.0:.1f} s ago")


def scheduler_ended(scheduler: str | None) -> str | None:
    """Why the scheduler signalled this node, when it runs as a step of a scheduler's job; else None.

    SLURM signals every step with SIGTERM when the job is cancelled, reaches its
    time limit or is preempted. While its steps end the job is ``COMPLETING``
    (its final state comes after): a run time at the time limit means the
    limit, else it was cancelled. A job still ``RUNNING``: only this step was.
    """
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    if scheduler != "slurm" or not job:
        return None
    import subprocess  # here: only a node of a SLURM job that got a SIGTERM asks

    fields: dict[str, str] = {}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["scontrol", "show", "-o", "job", job], capture_output=True, text=True, timeout=3.0, check=False
        ).stdout
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    state = fields.get("JobState", "")
    if state == "RUNNING":
        return f"SLURM step {job}.{step} was cancelled (scancel {job}.{step})"
    if state and state != "COMPLETING":
        return f"SLURM job {job} is {state}"
    limit, ran = _seconds(fields.get("TimeLimit", "")), _seconds(fields.get("RunTime", ""))
    if limit is not None and ran is not None and ran >= limit:
        return f"SLURM job {job} reached its time limit ({fields['TimeLimit']})"
    return f"SLURM job {job} was cancelled (scancel, or preempted)"


def _seconds(text: str) -> int | None:
    """``1-02:03:04``, ``02:03:04`` or ``03:04`` in seconds; None for ``UNLIMITED`` and the like."""
    days, _, rest = text.rpartition("-")
    parts = rest.split(":")
    if not all(p.isdigit() for p in parts) or (days and not days.isdigit()):
        return None
    total = 0
    for p in parts:
        total = total * 60 + int(p)
    return total + (int(days) * 86400 if days else 0)


def _die_with_supervisor(
    coord: RPCClient, key: str, stopping: threading.Event, scheduler: str | None = None
) -> int | None:
    """Under a supervisor: SIGTERM (its stop, or its death) ends the node's process group.

    Returns a pidfd of the supervisor, which :func:`_ready_to_serve` watches (no ctypes:
    loading it for ``PR_SET_PDEATHSIG`` cost a node ~2 ms on its way to serving, and that
    setting belongs to the thread that makes it); None where there are no pidfds (Linux
    before 5.3, other systems), which get ``PR_SET_PDEATHSIG`` on Linux.
    """
    supervisor = os.getppid()
    parent = None
    try:
        parent = os.pidfd_open(supervisor)
    except (AttributeError, OSError):
        if sys.platform.startswith("linux"):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    def on_term(signum: int, frame: object) -> None:
        try:
            if not stopping.is_set():  # not the supervisor's stop: its death, or a stray kill
                deadline = time.monotonic() + 0.5
                while os.getppid() == supervisor and time.monotonic() < deadline:
                    time.sleep(0.01)  # the kernel may signal before it reparents us
                ended = scheduler_ended(scheduler) if os.getppid() == supervisor else None
                if ended is not None:  # the scheduler ended the job: the run stops, nothing failed
                    coord.call("stop", (ended,), timeout=3.0)
                    coord.call("node_finished", (key, True, None, None, ended), timeout=3.0)
                    return
                why = "its supervisor died" if os.getppid() != supervisor else "it got SIGTERM"
                coord.call("node_finished", (key, False, None, None, why), timeout=3.0)
        except Exception:  # nobody to tell: the coordinator's heartbeat check will notice
            pass
        finally:
            os.killpg(0, signal.SIGKILL)

    signal.signal(signal.SIGTERM, on_term)
    if os.getppid() != supervisor:  # it died before it could be watched: as if it had signalled
        os.kill(os.getpid(), signal.SIGTERM)
    return parent


def _sample_self(coord: RPCClient, key: str, stopping: threading.Event) -> None:
    """Once a second until the run stops: a sample of this process and its descendants, to the
    coordinator (what a supervisor's heartbeat carries for a node it watches; a SLURM step has none)."""
    from tlaunch.runtime.sampling import GpuSampler, TreeSampler

    sampler = TreeSampler(GpuSampler())
    while not stopping.wait(1.0):
        sample = sampler.sample(os.getpid())
        if sample is not None:
            with contextlib.suppress(RPCError):
                coord.add_samples({key: sample})


def main(argv: list[str]) -> int:
    """Run node ``argv[1]`` of the bundle on stdin (``argv[0]`` is ``-``); returns the exit code."""
    if len(argv) not in (2, 3) or argv[0] != "-":  # a third argument (the run id) names it in `ps`
        print(
            "usage: python -m tlaunch.runtime.node_main - NODE_KEY [RUN_ID]  (bundle on stdin)",
            file=sys.stderr,
        )
        return 2
    key = argv[1]
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    bundle = read_bundle_bytes(sys.stdin.buffer.read()).at_launch_node()
    for setup in bundle.config.setups:  # as the launcher's process imports (tlaunch.compat)
        setup()
    if bundle.config.flags is not None:  # before the node is unpickled: it may read FLAGS
        restore_flags(bundle.config.flags)
    coord = _client(bundle.coordinator_address, bundle.config)
    runtime = NodeRuntime(bundle.config, coord, key)
    parent = _die_with_supervisor(coord, key, runtime.stop_event(), bundle.config.scheduler)
    # This host's key (a caller's greeting needs it) is made while this thread waits on its
    # first call (a TLS handshake); that thread then watches the supervisor.
    threading.Thread(target=_ready_to_serve, args=(parent,), daemon=True).start()
    coord.node_started(key, os.getpid(), os.getpgid(0))
    grace = bundle.config.stop_grace
    runtime.on_orphaned = lambda: _kill_group_after(grace, "no coordinator")
    # Whatever becomes of its supervisor or launcher, a node outlives a stop it has
    # seen by its grace at most (its supervisor normally ends it a second earlier).
    runtime.register_stop_handler(lambda: _end_after_stop(coord, grace))
    context.install(runtime)
    debugger.install()  # breakpoint() pauses the node for `tlaunch debug`
    debugger.share(bundle.config, bundle.coordinator_address, key)  # its children's too (torch workers)
    # The stop watcher's long poll shares the node's connection to the coordinator once the
    # node has said its first state (within 0.5 s): the calls a node makes as it starts
    # (register, set_state) find the connection free, and it opens one as it starts.
    runtime.start_watcher(settle=SETTLE)
    if bundle.config.scheduler == "slurm":  # a step: no supervisor beside it samples it, so it does
        threading.Thread(
            target=_sample_self, args=(coord, key, runtime.stop_event()), name="tlaunch-sampler", daemon=True
        ).start()
    code = 0
    post_mortem = os.environ.get("TLAUNCH_DEBUG") == debugger.POST_MORTEM  # launch(debug=) sets it
    try:
        node = bundle.node(key)
        if bundle.config.flags is not None:  # modules the node imported may have defined them again
            restore_flags(bundle.config.flags)
        del bundle
        node.execute(runtime)
    except BaseException as exc:
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        sys.stderr.write(tb)
        with contextlib.suppress(RPCError):
            coord.note_traceback(key, tb)
        if post_mortem and debugger.worth_a_post_mortem(exc, runtime.stop_event()):
            debugger.post_mortem(exc)  # held at its frames, before its end is reported
    finally:
        runtime.close()
        coord.close()
    return code


if __name__ == "__main__":
    from tlaunch.runtime import settle

    settle()  # its imports are done: collections again, before the node's own code
    sys.stdout.flush()
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    import atexit

    atexit._run_exitfuncs()  # the user's exit handlers still run
    os._exit(code)  # but daemon threads (long polls) must not delay the exit
