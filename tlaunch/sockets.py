"""Socket helpers shared by every layer (no tlaunch imports)."""

from __future__ import annotations

import contextlib
import socket

__all__ = ["copy_until_end"]


def copy_until_end(source: socket.socket, target: socket.socket) -> None:
    """Copy ``source``'s bytes to ``target`` until ``source`` ends; then end ``target``'s writing side.

    One direction of a relay between two connections (a thread runs each): an
    error on either socket ends the copy as the end of ``source`` does, so the
    other side sees the relayed connection end rather than hang.
    """
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)
