"""A run reached through its backend's own channel: :class:`Reachable` (and the :class:`Forward` it gives).

Most runs' coordinators and nodes are reached at the addresses they advertise. A
run on Kubernetes is not (pod IPs are the cluster's): its handle says how to reach
them instead, and :mod:`tlaunch.control` (``tlaunch debug``, ``tlaunch top``) asks
it, with no ``if`` on a backend.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Forward", "Reachable"]


class Forward(Protocol):
    """A loopback address of this machine that leads somewhere else while it is open."""

    address: str

    def close(self) -> None:
        """Stop forwarding (connections made through it end); idempotent."""


@runtime_checkable
class Reachable(Protocol):
    """A run whose coordinator and nodes are reached through its backend's own channel, not at the
    addresses they advertise (Kubernetes: the API server's port-forward to their pods, since pod IPs
    are the cluster's). What goes through it is the run's own mutual TLS, as anywhere else."""

    def reach(self, address: str, host: str | None = None, *, once: bool = False) -> Forward:
        """A loopback address leading to ``address`` (``host:port`` as the coordinator, or a node on
        ``host``, advertised it); ``once``: for one connection.

        Raises:
            LaunchError: it cannot be reached now (the message says why: refused, gone).
        """
