"""A coordinator in another process (the run's head), seen as if it were local.

:class:`RemoteCoordinator` wraps an RPC client of the head's coordinator with the
interface the launcher's :class:`~tlaunch.launcher.Run` uses (``status``,
``stopping``, ``failure``, ``wait_stopping``...), keeps the launcher's lease
alive, and turns a lost coordinator into a failure of the run instead of a hang.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

from tlaunch.errors import RPCError
from tlaunch.rpc.client import RPCClient, fixed_resolver
from tlaunch.rpc.security import RunKeys
from tlaunch.runtime.coordinator import NodeRecord
from tlaunch.runtime.records import torn_down
from tlaunch.runtime.states import REQUESTED, TERMINAL_STATES

__all__ = ["RemoteCoordinator"]


def refused_now(address: str | None) -> bool:
    """Whether ``host:port`` refuses connections right now (its process is gone, its host is up)."""
    if not address:
        return False
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


class RemoteCoordinator:
    """The head's coordinator, through ``client``; see the module docstring.

    Args:
        client: an RPC client of the coordinator.
        head: the head host's name, for error messages.
        lost_after: seconds without an answer after which the coordinator is lost.
    """

    def __init__(self, client: RPCClient, head: str, lost_after: float, address: str | None = None) -> None:
        self.client = client
        self.address = address
        self.lost_at: float | None = None
        self.head = head
        self.lost_after = lost_after
        self.lost: str | None = None
        self._summary: dict[str, Any] | None = None
        self._seen = -1  # the coordinator's change count of that summary (see Coordinator.renew)
        self._last_ok = time.monotonic()
        self._closed = threading.Event()
        self._changed = threading.Condition()
        self._lease: threading.Thread | None = None
        self._first_lease = threading.Event()  # set once the first renewal was answered (or failed)
        self._released = False
        self.detached = False

    @classmethod
    def at(
        cls, keys: RunKeys, head: str, address: str, lost_after: float, resolve_timeout: float, timeout: float
    ) -> RemoteCoordinator:
        """The coordinator serving at ``address`` on host ``head``, with the run's ``keys``."""
        client = RPCClient(
            "coordinator",
            keys,
            fixed_resolver(address),
            resolve_timeout=resolve_timeout,
            default_timeout=timeout,
            retry_refused=False,
            shared_memory=False,  # small messages: no greeting round trip
            tls_server=True,  # as every coordinator's client (RPCServer's tls_client)
        )
        return cls(client, head, lost_after, address)

    # -- the lease ------------------------------------------------------
    def start_lease(self) -> None:
        """Renew the launcher's lease now and then twice a second (a run not detached needs it),
        in a thread: the first renewal (a connection, its TLS handshake) does not hold the
        caller back."""
        self._lease = threading.Thread(target=self._renew, name="tlaunch-lease", daemon=True)
        self._lease.start()

    def wait_first_lease(self, timeout: float) -> bool:
        """Wait (up to ``timeout`` s) for the lease's first renewal: from then on the head gives a
        launcher that vanishes its ``coordinator_timeout``, not the start's time (minutes).

        Returns:
            Whether it was answered (or failed) within ``timeout``.
        """
        return self._first_lease.wait(timeout)

    def stop_lease(self) -> None:
        """Stop renewing the lease (detach, or the end)."""
        self._closed.set()

    def _renew(self) -> None:
        while True:
            try:
                self._call("renew", self._seen)
            finally:
                self._first_lease.set()
            if self._closed.wait(0.5):
                return

    def _call(self, method: str, *args: Any, timeout: float = 3.0) -> Any:
        """Call the coordinator; note a loss instead of raising."""
        if self.lost or self._released or self.detached:
            return None
        try:
            result = self.client.call(method, args, timeout=timeout)
        except RPCError as exc:
            # A call that fails once the head was let go (a lease renewed as the launcher released
            # it), or once the run was seen ended, loses nothing: the last summary stands.
            if self._released or self.detached or self.ended:
                return None
            gone = time.monotonic() - self._last_ok
            refused = refused_now(self.address)  # asked once: its answer changes as the head exits
            if self._summary and self._summary["stopping"] and refused:
                return None  # the run had ended and its head has exited: the last summary stands
            if refused or gone > self.lost_after:
                with self._changed:
                    self.lost_at = time.time()
                    self.lost = (
                        f"the coordinator on {self.head} was lost ({exc}); the run's nodes stop "
                        f"themselves within {self.lost_after:.0f} s"
                    )
                    self._changed.notify_all()
            return None
        self._last_ok = time.monotonic()
        if method == "renew":  # (changes, what changed or None): only what changed travels
            with self._changed:
                self._merge(*result)
                self._changed.notify_all()
                return self._summary
        return result

    def _merge(self, changes: int, delta: dict[str, Any] | None) -> None:
        """Take in ``renew``'s answer (its calls may cross: an older answer is dropped)."""
        if delta is None or changes <= self._seen:
            return
        since = delta.pop("since", -1)
        if since >= 0:
            if self._summary is None:  # pragma: no cover - a partial answer asks after a whole one
                self._seen = -1
                return
            delta["status"] = {**self._summary["status"], **delta["status"]}
        self._summary, self._seen = delta, changes

    # -- what Run uses --------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Status, stop reason and first failure (the last known, if lost)."""
        self._call("renew", self._seen)  # also a lease; what changed since the last answer
        return self._summary or {
            "status": {},
            "stopping": bool(self.lost),
            "stop_reason": None,
            "failure": None,
        }

    def status(self) -> dict[str, dict[str, Any]]:
        """Every node's record."""
        status: dict[str, dict[str, Any]] = self.summary()["status"]
        return status

    @property
    def ended(self) -> bool:
        """Whether the last summary shows the run ended: stopping, and every node's end recorded."""
        summary = self._summary
        return bool(
            summary
            and summary["stopping"]
            and all(rec.get("state") in TERMINAL_STATES for rec in summary["status"].values())
        )

    @property
    def stopping(self) -> bool:
        """Whether the run is stopping (or its coordinator is lost, or we detached)."""
        return self.detached or bool(self.lost) or bool(self._summary and self._summary["stopping"])

    @property
    def stop_reason(self) -> str | None:
        """Why the run stopped."""
        return self.lost or (self._summary or {}).get("stop_reason")

    @property
    def failure(self) -> NodeRecord | None:
        """The first node to fail; a lost coordinator counts as a failure."""
        rec = (self._summary or {}).get("failure")
        if rec is not None:
            return NodeRecord(**rec)
        if self.lost:
            return NodeRecord("coordinator", self.head, reason=self.lost)
        return None

    @property
    def stop_kind(self) -> str | None:
        """Why the stop began (a lost coordinator: ``requested``, with the loss as the reason)."""
        if self.lost and not (self._summary or {}).get("stop_kind"):
            return REQUESTED
        kind: str | None = (self._summary or {}).get("stop_kind")
        return kind

    def stop(self, reason: str = "stop() was called", kind: str = REQUESTED) -> None:
        """Ask the run to stop."""
        self._call("stop", reason, kind)
        self._call("renew", self._seen)  # the stop, merged

    def stop_grace(self, default: float = 5.0) -> float:
        """Seconds nodes get after the current stop; ``default`` if the coordinator cannot say."""
        answer = self._call("stop_grace")
        return float(answer) if isinstance(answer, (int, float)) else default

    def wait_stopping(self, timeout: float | None) -> bool:
        """Wait until the run is stopping (or the coordinator is lost); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if self.stopping:
                return True
            if left is not None and left <= 0:
                return False
            poll = 2.0 if left is None else min(2.0, left)
            answer = self._call("wait_stop", None, poll, timeout=poll + 3.0)
            if answer:
                self._call("renew", self._seen)  # the final state, merged
                return True

    def wait_ready(self, keys: list[str] | None, timeout: float | None) -> bool:
        """Wait until every node of ``keys`` (None: all) is up (a long poll, in slices); False on
        timeout, once the run stopped with one of them not up, or when the coordinator is lost."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            poll = 2.0 if left is None else min(2.0, left)
            answer = self._call("wait_ready", keys, poll, timeout=poll + 3.0)
            self._call("renew", self._seen)  # the state they are in, merged (a lease too)
            if answer:
                return True
            if self.stopping or (deadline is not None and time.monotonic() >= deadline):
                return False

    def wait_ended(self, timeout: float) -> bool:
        """Wait until every node has ended; False on timeout or loss."""
        deadline = time.monotonic() + timeout
        while not self.lost:
            if self.ended:  # seen already: nothing to ask (its head may have exited since)
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # The final state comes with the answer: a detached run's head exits at once.
            answer = self._call("wait_ended_renew", min(2.0, left), self._seen, timeout=min(2.0, left) + 3.0)
            if answer is not None and answer[0]:
                with self._changed:
                    self._merge(*answer[1:])
                    self._changed.notify_all()
                return True
        return False

    def torn_down(self) -> None:
        """The run's teardown has confirmed that nothing of it is left on any host: a node whose
        end the last summary lacks ended with it (:func:`~tlaunch.runtime.records.torn_down`)."""
        with self._changed:
            if self._summary is not None:
                self._summary = {**self._summary, "status": torn_down(self._summary["status"])}

    def release(self) -> None:
        """Let the head exit (its final state has been read)."""
        self.stop_lease()
        with contextlib.suppress(RPCError):
            if not self.lost and not self._released:
                self.client.call("release", timeout=5.0)
        self._released = True

    def detach(self) -> None:
        """Tell the head the launcher leaves."""
        self._call("detach")
        self.detached = True
        self.stop_lease()

    def __getattr__(self, method: str) -> Any:
        # The launcher's NodeRuntime calls resolve, wait_stop, register... directly.
        if method.startswith("_"):
            raise AttributeError(method)
        return getattr(self.client, method)

    def close(self) -> None:
        """Stop the lease and close the client."""
        self.stop_lease()
        self.client.close()
