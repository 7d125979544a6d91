"""Debugging a run's nodes from outside it: which wait in a debugger, and a connection to one.

A node that calls ``breakpoint()`` (or raised, under ``debug="post-mortem"``) waits
for a debugger and says so in its run's state (:mod:`tlaunch.runtime.debugger`).
Here a second process finds those pauses and opens one, with the run's key (which
only this machine's record of the run holds, 0600)::

    from tlaunch import control
    from tlaunch.control import debug

    run = control.find_run("trainer-2026")
    for p in debug.paused(run):
        print(p.node, p.host, p.pause.at)            # learner/0 th3 train.py:42
    session = debug.connect(run, "learner/0")        # pdb's terminal: session.sock

A run on Kubernetes (:class:`~tlaunch.backends.reaching.Reachable`: pod IPs are the
cluster's) is reached through the API server's port-forward, which the cluster opens
only to whom RBAC allows (``pods/portforward``): its coordinator, for where its nodes
wait, and the paused node's pod. What passes is the run's mutual TLS, end to end.

Returns data and raises :class:`~tlaunch.errors.DebugError`; prints nothing
(``tlaunch debug`` is its renderer).
"""

from __future__ import annotations

import os
import ssl
import time
from dataclasses import dataclass

from tlaunch.backends.handle import NodeStatus, RunHandle, RunSnapshot
from tlaunch.backends.reaching import Forward, Reachable
from tlaunch.control.runs import list_runs
from tlaunch.errors import DebugError, LaunchError, RPCError
from tlaunch.rpc.security import RunKeys
from tlaunch.runtime.debugger import channel
from tlaunch.runtime.debugger.pause import Pause
from tlaunch.runtime.records import coordinator_client, read_keys, read_record

__all__ = ["Attached", "PausedNode", "connect", "paused", "paused_everywhere", "run_keys", "wait_paused"]

GREETING_WAIT = 10.0
"""Seconds a debugger waits for the node's first line (``tlaunch: attached to ...``)."""


@dataclass(frozen=True)
class PausedNode:
    """A node of a run that waits in a debugger.

    Attributes:
        run_id: its run.
        node: its key (``learner/0``).
        host: its host.
        pause: where and how it waits.
    """

    run_id: str
    node: str
    host: str
    pause: Pause


def _nodes(handle: RunHandle) -> tuple[RunSnapshot, tuple[NodeStatus, ...]]:
    """The run now, and its nodes as its coordinator knows them: through the run's backend's channel
    for a :class:`Reachable` run (its snapshot knows where a node waits, not at which address).

    Raises:
        DebugError: a Reachable run's coordinator cannot be reached (the message says why).
    """
    snap = handle.snapshot()
    if snap.ended or not isinstance(handle, Reachable):
        return snap, snap.nodes
    run_dir = getattr(handle, "run_dir", None)
    try:
        record = read_record(str(run_dir))
        forward = handle.reach(record.coordinator)
    except (OSError, ValueError, LaunchError) as exc:
        raise DebugError(f"cannot ask the coordinator of run {snap.run_id}: {exc}") from None
    try:
        client = coordinator_client(str(run_dir), record, forward.address)
        try:
            status = client.status()
        finally:
            client.close()
    except (OSError, RPCError) as exc:
        raise DebugError(f"cannot ask the coordinator of run {snap.run_id}: {exc}") from None
    finally:
        forward.close()
    return snap, tuple(NodeStatus.from_record(r) for r in dict(status).values())


def paused(handle: RunHandle) -> list[PausedNode]:
    """The nodes of ``handle``'s run that wait in a debugger now, in program order.

    Raises:
        DebugError: the run's coordinator is reached through its backend's channel
            (Kubernetes), which refused or cannot be reached.
    """
    snap, nodes = _nodes(handle)
    if snap.ended:
        return []
    return [PausedNode(snap.run_id, n.key, n.host, n.paused) for n in nodes if n.paused is not None]


def paused_everywhere(home: str | None = None) -> list[PausedNode]:
    """The paused nodes of every run of the run store that has not ended (newest run first)."""
    found: list[PausedNode] = []
    for handle in list_runs(home):
        try:
            found.extend(paused(handle))
        except (RPCError, OSError, DebugError):  # a run that cannot be asked now has no pause to show
            continue
    return found


def wait_paused(handle: RunHandle, node: str, timeout: float, poll: float = 0.25) -> PausedNode:
    """Node ``node`` once it waits in a debugger (it may be on its way to a ``breakpoint()``).

    Raises:
        KeyError: the run has no such node.
        DebugError: it did not pause within ``timeout`` s, or the run ended first.
    """
    deadline = time.monotonic() + timeout
    while True:
        snap, nodes = _nodes(handle)
        status = next((n for n in nodes if n.key == node), None) or snap.node(node)
        if status.paused is not None:
            return PausedNode(snap.run_id, status.key, status.host, status.paused)
        if snap.ended or time.monotonic() >= deadline:
            others = [p.node for p in paused(handle)] if not snap.ended else []
            why = f"the run has ended ({snap.state})" if snap.ended else f"its state: {status.state}"
            raise DebugError(
                f"node {node} of run {snap.run_id} is not waiting in a debugger ({why}); "
                f"paused nodes of the run: {others or 'none'}. A node pauses at breakpoint() or "
                "tlaunch.set_trace(), or when it raises under debug='post-mortem'"
            )
        time.sleep(poll)


@dataclass(frozen=True)
class Attached:
    """A debugger's session with a paused node: pdb's terminal over ``sock``.

    Attributes:
        sock: the connection (send lines, read pdb's output; closing it lets the node go on).
        greeting: the node's first line (``tlaunch: attached to learner/0 on th3 ...``).
        node: the paused node as it was found.
    """

    sock: ssl.SSLSocket
    greeting: str
    node: PausedNode
    forward: Forward | None = None

    def close(self) -> None:
        """End the session (the node goes on); idempotent."""
        self.sock.close()
        if self.forward is not None:
            self.forward.close()


def run_keys(handle: RunHandle) -> RunKeys:
    """The key of ``handle``'s run, as this machine's record of it holds it.

    Raises:
        DebugError: this machine holds none (the run ended, or was launched elsewhere).
    """
    run_dir = getattr(handle, "run_dir", None)
    if isinstance(run_dir, str):
        try:
            return read_keys(run_dir)
        except (OSError, TypeError, ValueError):
            pass
    raise DebugError(
        f"this machine holds no key of run {handle.run_id} (it has ended, or was launched from "
        f"another machine: run `tlaunch debug` where it was launched, as the user who launched it)"
    )


def connect(handle: RunHandle, node: str, *, wait: float = 0.0, keys: RunKeys | None = None) -> Attached:
    """Attach to node ``node``'s debugger (pdb's terminal), with the run's key.

    ``wait``: seconds to wait for the node to pause first. ``keys``: the run's keys (default:
    :func:`run_keys`). The node's first line has come when this returns: it took the key.

    Raises:
        KeyError: the run has no such node.
        DebugError: it is not paused, cannot be reached, or refused the key.
    """
    found = wait_paused(handle, node, wait)
    keys = keys if keys is not None else run_keys(handle)
    where = f"node {node} of run {handle.run_id} at {found.pause.address}"
    refused = f"{where} refused the connection: this is not its run's key"
    forward: Forward | None = None
    address = found.pause.address
    if isinstance(handle, Reachable):  # through the backend's channel to the node's host (its pod)
        try:
            forward = handle.reach(address, found.host, once=True)
        except LaunchError as exc:
            raise DebugError(f"cannot reach {where}: {exc}") from None
        address = forward.address
    try:
        try:
            sock = channel.connect(address, keys)
        except ssl.SSLError as exc:
            if not _still_paused(handle, found):  # a forward's far end closed: the node went on
                raise DebugError(f"{where} went on meanwhile: it waits no more") from exc
            raise DebugError(f"{refused} ({exc})") from exc
        except OSError as exc:
            hint = "it went on meanwhile, or its host cannot be reached from here"
            raise DebugError(f"cannot reach {where} ({exc}): {hint} ({os.uname().nodename})") from exc
        try:
            greeting = _first_line(sock)
        except BaseException:
            sock.close()
            raise
        if greeting is None:
            sock.close()
            raise DebugError(refused)
    except BaseException:
        if forward is not None:
            forward.close()
        raise
    return Attached(sock, greeting, found, forward)


def _still_paused(handle: RunHandle, found: PausedNode) -> bool:
    """Whether ``found`` still waits where it did (a failed handshake through a forward may only
    mean that its listener has closed)."""
    try:
        _, nodes = _nodes(handle)
    except DebugError:
        return True  # cannot tell: the key is the likelier cause
    now = next((n.paused for n in nodes if n.key == found.node), None)
    return now is not None and now.address == found.pause.address


def _first_line(sock: ssl.SSLSocket) -> str | None:
    """The node's first line; None if the connection ended first (the node refused the key)."""
    sock.settimeout(GREETING_WAIT)
    got = b""
    try:
        while not got.endswith(b"\n"):
            chunk = sock.recv(1)  # one line only: what follows is pdb's, read by the terminal
            if not chunk:
                return None
            got += chunk
    except ssl.SSLError:
        return None
    except TimeoutError as exc:
        raise DebugError(f"the node took no word in {GREETING_WAIT:.0f} s after the handshake") from exc
    finally:
        sock.settimeout(None)
    return got.decode("utf-8", "replace").rstrip("\n")
