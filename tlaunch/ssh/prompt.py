"""TCP sockets for SSH connections that send each write and acknowledge each read at once.

Without either, every round trip of a connection's start waits ~40 ms here:
paramiko writes a packet while the peer has not yet acknowledged the last one,
so Nagle's algorithm holds it back until the peer's delayed acknowledgement
(40 ms on Linux); and sshd, which sends without ``TCP_NODELAY`` outside a
terminal session, holds its answers back the same way until we acknowledge what
it sent before them. One connection to a test host and its first command took
60 + 47 ms so, 19 + 3 ms with a :class:`PromptSocket` (``TCP_NODELAY`` before the
handshake, ``TCP_QUICKACK`` after every read).
"""

from __future__ import annotations

import contextlib
import socket

__all__ = ["PromptSocket", "prompt_socket"]

_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)  # Linux's; elsewhere acks stay delayed


class PromptSocket(socket.socket):
    """A TCP socket that acknowledges what it reads at once.

    ``TCP_QUICKACK`` lasts until the kernel's next change of mode only, so it is set
    again after every read (a system call, ~1 µs).
    """

    __slots__ = ()

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        """``socket.recv``, then this read acknowledged now, not after the delayed-ack timer."""
        data = super().recv(bufsize, flags)
        if data and _QUICKACK is not None:
            with contextlib.suppress(OSError):
                self.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        return data


def prompt_socket(sock: socket.socket) -> socket.socket:
    """``sock`` (connected, before its first byte) as a :class:`PromptSocket` with
    ``TCP_NODELAY``; a socket that is not TCP (a Unix socket) as it is.

    ``sock`` is detached: its descriptor belongs to the socket returned.
    """
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        return sock
    timeout = sock.gettimeout()
    prompt = PromptSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    prompt.settimeout(timeout)
    prompt.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return prompt
