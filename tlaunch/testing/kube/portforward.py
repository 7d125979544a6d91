"""The stand-in API server's ``pods/portforward``: Kubernetes' WebSocket port-forward protocol.

What the ``kubernetes`` client (``kubernetes.stream.portforward``) and ``kubectl``
speak to a real API server, which passes the stream to the pod's kubelet::

    GET /api/v1/namespaces/NS/pods/NAME/portforward?ports=P1,P2   (Upgrade: websocket)
      server: 101; then, for the i-th port, channel 2i (data) and 2i+1 (errors) each
              open with a frame [channel, port & 0xff, port >> 8]
      either side: binary frames [channel, bytes...] (data on 2i; an error on 2i+1 ends the port)
      the pod's end closes: the server closes the WebSocket

The WebSocket framing is :mod:`wsproto`'s (sans I/O). The stand-in kubelet runs
every pod on this machine's loopback, so a pod's port ``P`` is ``127.0.0.1:P``.
"""

from __future__ import annotations

import contextlib
import select
import socket
from collections.abc import Callable
from typing import Any

__all__ = ["serve"]

_CHUNK = 65536


def serve(
    conn: socket.socket, request: bytes, ports: list[int], dial: Callable[[int], socket.socket]
) -> None:
    """Serve one port-forward WebSocket on ``conn`` (its HTTP request, as received: ``request``).

    ``dial(port)`` opens the pod's port; a port that cannot be opened is said on its
    error channel and ends the stream (as a kubelet does).
    """
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Request

    ws = WSConnection(ConnectionType.SERVER)
    ws.receive_data(request)
    offered = next((e for e in ws.events() if isinstance(e, Request)), None)
    if offered is None:
        return
    protocol = offered.subprotocols[0] if offered.subprotocols else None
    conn.sendall(ws.send(AcceptConnection(subprotocol=protocol)))

    def send(channel: int, data: bytes) -> None:
        conn.sendall(ws.send(BytesMessage(data=bytes([channel]) + data)))

    for i, port in enumerate(ports):
        send(2 * i, bytes([port & 0xFF, port >> 8]))
        send(2 * i + 1, bytes([port & 0xFF, port >> 8]))
    pods: dict[int, socket.socket] = {}  # data channel -> the pod's connection
    try:
        for i, port in enumerate(ports):
            try:
                pods[2 * i] = dial(port)
            except OSError as exc:
                send(2 * i + 1, f"error forwarding port {port} to the pod: {exc}".encode())
                conn.sendall(ws.send(CloseConnection(code=1000)))
                return
        _pump(conn, ws, pods, send)
    finally:
        for sock in pods.values():
            with contextlib.suppress(OSError):
                sock.close()


def _pump(
    conn: socket.socket, ws: Any, pods: dict[int, socket.socket], send: Callable[[int, bytes], None]
) -> None:
    """Relay frames and the pods' bytes until either side ends."""
    from wsproto.events import BytesMessage, CloseConnection, Ping

    by_sock = {sock: channel for channel, sock in pods.items()}
    partial = b""  # a message comes in parts as its bytes arrive: its channel is its first byte
    while True:
        ready, _, _ = select.select([conn, *by_sock], [], [])
        for sock in ready:
            if sock is conn:
                data = conn.recv(_CHUNK)
                if not data:
                    return
                ws.receive_data(data)
                for event in ws.events():
                    if isinstance(event, CloseConnection):
                        with contextlib.suppress(OSError):
                            conn.sendall(ws.send(event.response()))
                        return
                    if isinstance(event, Ping):
                        conn.sendall(ws.send(event.response()))
                    elif isinstance(event, BytesMessage):
                        partial += bytes(event.data)
                        if not event.message_finished:
                            continue
                        target = pods.get(partial[0]) if partial else None
                        if target is not None and len(partial) > 1:
                            target.sendall(partial[1:])
                        partial = b""
                continue
            try:
                data = sock.recv(_CHUNK)
            except OSError:
                data = b""
            if not data:  # the pod's end closed: so does the stream
                with contextlib.suppress(OSError):
                    conn.sendall(ws.send(CloseConnection(code=1000)))
                return
            send(by_sock[sock], data)
