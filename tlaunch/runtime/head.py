"""The run's head: ``python -m tlaunch.runtime.head FILE``, in its own tmux window.

It serves the run's :class:`~tlaunch.runtime.coordinator.Coordinator` (sealed
with the run's keys) on the head host, so the run does not depend on the
launcher: a launcher may detach and the program goes on. It:

* reads its file (plan, keys, timeouts) and deletes it at once;
* binds every interface on a free port and writes ``host:port`` to
  ``coordinator.addr`` in the run directory, where the launcher (and
  ``tlaunch``) read it over SSH;
* fails nodes whose supervisor stopped heartbeating (host lost) and stops the
  run when an attached launcher stops renewing its lease;
* once the run stops and every node has ended, writes ``final.json`` (node
  states, stop reason, first failure) and exits when the launcher has read it,
  or at once if nobody is attached.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import sys
import time
from dataclasses import dataclass

from tlaunch.plan import LaunchPlan
from tlaunch.procs import want_descriptors
from tlaunch.rpc.security import RunKeys
from tlaunch.rpc.server import RPCServer
from tlaunch.runtime.coordinator import CLOSE_DRAIN, Coordinator
from tlaunch.runtime.private import take_file, write_private

__all__ = ["WAKE", "HeadFile", "main"]

WAKE = "coordinator.wake"
"""A FIFO the SSH backend ships beside the head's file: once ``coordinator.addr`` is
written, the head writes a line to it, which ends the launcher's wait for the address
on the head's host (:func:`tlaunch.backends.ssh.hostside.head_address`)."""

log = logging.getLogger("tlaunch.head")


@dataclass(frozen=True)
class HeadFile:
    """What the head needs, shipped as one file (mode 0600)."""

    plan: LaunchPlan
    keys: RunKeys
    advertise_host: str
    heartbeat_timeout: float
    launcher_timeout: float
    stop_grace: float
    on_failure: str = "stop"
    attached: bool = True
    failure_grace: float = 1.0
    keep: bool = False  # leave this file in place once read (keep_bundles)
    port: int = 0  # a fixed port (a pod's, known to the nodes in advance); 0: any free one


def _wake(path: str) -> None:
    """Write a line to the FIFO ``path`` if it is there and read (a head of a launch that does not
    wait on it, or whose reader has not opened it yet, writes nothing: that reader looks at
    ``coordinator.addr`` after it opened the FIFO)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # none (ENOENT), or nobody reads it (ENXIO)
        return
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, b"\n")
    except OSError:
        pass
    finally:
        os.close(fd)


def serve(spec: HeadFile, run_dir: str) -> int:
    """Serve the coordinator until the run has ended and been read."""
    coord = Coordinator(spec.plan, spec.on_failure, spec.stop_grace, spec.failure_grace)
    coord.attached = spec.attached
    # Three sockets a node (its supervisor's heartbeat, its stop poll, its calls), and headroom.
    want_descriptors(4 * len(spec.plan.nodes) + 1024)
    for sig in (signal.SIGHUP, signal.SIGTERM):  # its tmux window killed, or a kill: end the run cleanly
        signal.signal(sig, lambda signum, _: coord.stop(f"the coordinator got {signal.Signals(signum).name}"))
    server = RPCServer(coord, spec.keys, "0.0.0.0", spec.advertise_host, spec.port, tls_client=True)
    try:
        addr = {"address": server.address, "pid": os.getpid()}
        write_private(os.path.join(run_dir, "coordinator.addr"), json.dumps(addr).encode())
        _wake(os.path.join(run_dir, WAKE))
        log.info("coordinator of run %s at %s", spec.plan.run_id, server.address)
        while not coord.wait_stopping(0.25):
            coord.check_health(spec.heartbeat_timeout, spec.launcher_timeout)
        log.info("stopping: %s", coord.stop_reason)
        # Supervisors end their nodes (grace, SIGTERM, SIGKILL); lost hosts time out.
        deadline = time.monotonic() + spec.stop_grace + spec.heartbeat_timeout + 5.0
        while not coord.wait_ended(0.25) and time.monotonic() < deadline:
            coord.check_health(spec.heartbeat_timeout, float("inf"))
        summary = coord.summary()
        write_private(os.path.join(run_dir, "final.json"), json.dumps(summary, indent=1).encode())
        # An attached launcher reads the final state, then releases us.
        # It may take its time (tearing down many hosts): wait while its lease is renewed.
        while (
            coord.attached
            and time.time() - coord.launcher_seen < spec.launcher_timeout
            and not coord.released.wait(0.25)
        ):
            pass
        log.info("run %s ended: %s", spec.plan.run_id, coord.stop_reason)
        return 0
    finally:
        server.close(drain=CLOSE_DRAIN)


def main(argv: list[str]) -> int:
    """Run the head described by file ``argv[0]``."""
    if len(argv) != 1:
        print("usage: python -m tlaunch.runtime.head HEAD_FILE", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    path = argv[0]
    try:
        spec = take_file(path, HeadFile)
    except (OSError, TypeError) as exc:
        print(f"tlaunch head: {exc}", file=sys.stderr)
        return 2
    return serve(spec, os.path.dirname(os.path.abspath(path)))


if __name__ == "__main__":
    from tlaunch.runtime import settle
    from tlaunch.runtime.head import main as _main  # the pickled classes live in the module, not __main__

    settle()  # its imports are done: collections again
    code = _main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)
