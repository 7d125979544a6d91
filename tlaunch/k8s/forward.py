"""A port of a pod, reached through the API server's ``pods/portforward``.

:func:`open_port` gives a connection; :class:`LocalForward` a loopback address.

Pod IPs are the cluster's: a machine outside it reaches a pod's port only through
the API server, which opens the stream only to whom the cluster allows (RBAC:
``create`` on ``pods/portforward`` in the pod's namespace), with the credentials
:func:`tlaunch.k8s.client.connect` found. What tlaunch sends through it is the
run's own mutual TLS, end to end (the coordinator's RPC, a paused node's
debugger): the cluster carries bytes it cannot read, and a peer that may forward
ports but holds no key of the run gets nothing from them::

    tlaunch debug ──TLS (run's key)──▶ [WebSocket: API server ─▶ kubelet] ──▶ pod:PORT

:class:`LocalForward` gives a loopback address of this machine for clients that
dial addresses (the RPC client): each connection to it opens a stream of its own.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Any

from tlaunch.errors import LaunchError
from tlaunch.k8s.client import Kube
from tlaunch.sockets import copy_until_end

__all__ = ["LocalForward", "open_port"]

log = logging.getLogger(__name__)

RBAC_HINT = "forwarding a pod's port needs `create` on pods/portforward in its namespace (RBAC)"
"""What a refused port-forward most likely lacks."""


def open_port(kube: Kube, namespace: str, pod: str, port: int) -> socket.socket:
    """A connection to ``port`` of pod ``namespace/pod``, through the API server (see the module docstring).

    The connection is a socket of this process whose other end a thread of the
    ``kubernetes`` client relays over the WebSocket; a port the pod does not open
    shows as the connection's end on the first read.

    Raises:
        LaunchError: the cluster refused the stream (RBAC, the pod is gone or not running), or
            cannot be reached.
    """
    from kubernetes.stream import portforward

    try:
        forward = portforward(
            kube.core.connect_get_namespaced_pod_portforward, pod, namespace, ports=str(port)
        )
    except kube.ApiException as exc:
        said = str(getattr(exc, "reason", "") or exc)
        hint = f" ({RBAC_HINT})" if " 403 " in f" {said} " else ""
        raise LaunchError(
            f"the cluster ({kube.source}) refused to forward port {port} of pod {namespace}/{pod}: "
            f"{said.split(' -+-+- ', maxsplit=1)[0]}{hint}"
        ) from None
    except OSError as exc:
        raise LaunchError(
            f"cannot reach the cluster ({kube.source}) to forward pod {pod}'s port: {exc}"
        ) from None
    sock: Any = forward.socket(port)
    return sock  # type: ignore[no-any-return]  # the client's socket wrapper (a socket's whole surface)


class LocalForward:
    """A loopback address of this machine whose connections reach ``port`` of pod ``namespace/pod``.

    The first port-forward is opened at once (a refusal raises here); each further
    connection accepted opens one of its own (:func:`open_port`); each is relayed
    until either end closes. ``once``: accept one connection, then stop listening
    (a debugger's session). A context manager; :meth:`close` ends the
    listener and every relay.

    Attributes:
        address: ``127.0.0.1:PORT``.

    Raises:
        LaunchError: the cluster refused the port-forward, or cannot be reached.
    """

    def __init__(self, kube: Kube, namespace: str, pod: str, port: int, *, once: bool = False) -> None:
        self._kube, self._namespace, self._pod, self._port, self._once = kube, namespace, pod, port, once
        self._first: socket.socket | None = open_port(kube, namespace, pod, port)  # a refusal, said here
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(8)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=f"tlaunch-forward-{pod}", daemon=True)
        self._thread.start()

    def __enter__(self) -> LocalForward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                local, _ = self._listener.accept()
            except OSError:
                return
            try:
                remote, self._first = (
                    self._first or open_port(self._kube, self._namespace, self._pod, self._port),
                    None,
                )
            except LaunchError as exc:
                log.warning("%s", exc)
                local.close()
                continue
            with self._lock:
                self._open += [local, remote]
            for a, b in ((local, remote), (remote, local)):
                threading.Thread(
                    target=copy_until_end, args=(a, b), name="tlaunch-forward-relay", daemon=True
                ).start()
            if self._once:
                with contextlib.suppress(OSError):
                    self._listener.close()
                return

    def close(self) -> None:
        """Stop listening and end every relayed connection; idempotent."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            opened, self._open = self._open, []
            if self._first is not None:
                opened.append(self._first)
                self._first = None
        for sock in opened:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
