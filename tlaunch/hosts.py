"""Host strings given to ``Node.to_host()``: parsing and validation (pure)."""

from __future__ import annotations

import re
from typing import NamedTuple

from tlaunch.errors import ProgramError

__all__ = ["HostSpec", "parse_host"]

# Patterns, compiled (and cached by re) where first used: a node process that imports this module
# never parses a host, and compiling them cost every such process ~0.1 ms each.
_NAME = r"^[A-Za-z0-9_](?:[A-Za-z0-9_.\-]{0,252}[A-Za-z0-9_])?$"
_USER = r"^[A-Za-z_][A-Za-z0-9_.\-]{0,31}$"
_IPV6 = r"^[0-9A-Fa-f:.]+$"

_FORMS = "'host', 'host:port', 'user@host', 'user@host:port', '[ipv6]:port' or an ssh-config alias"


class HostSpec(NamedTuple):
    """Where a node runs: a host name (or ssh-config alias), optional user and port."""

    host: str
    user: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port is not None else ""
        return f"{user}{host}{port}"

    @property
    def is_local(self) -> bool:
        """True for names that always mean this machine."""
        return self.host in ("localhost", "127.0.0.1", "::1") and self.user is None


def _bad(value: object, why: str) -> ProgramError:
    return ProgramError(f"invalid host {value!r}: {why}; valid forms are {_FORMS}")


def parse_host(value: object) -> HostSpec:
    """Parse and validate a ``to_host()`` string.

    Raises:
        ProgramError: the value is not a host string of a valid form; the message
            names the value and the valid forms.
    """
    if isinstance(value, HostSpec):
        return value
    if not isinstance(value, str):
        raise _bad(value, f"expected a str, got {type(value).__name__}")
    if not value or value != value.strip():
        raise _bad(value, "it is empty or has surrounding whitespace")
    rest = value
    user: str | None = None
    if "@" in rest:
        user, rest = rest.rsplit("@", 1)
        if not re.match(_USER, user):
            raise _bad(value, f"user {user!r} is not a valid user name")
    port: int | None = None
    if rest.startswith("["):
        end = rest.find("]")
        if end < 0:
            raise _bad(value, "unclosed '[' in an IPv6 address")
        host, tail = rest[1:end], rest[end + 1 :]
        if not host or not re.match(_IPV6, host):
            raise _bad(value, f"{host!r} is not an IPv6 address")
        if tail:
            if not tail.startswith(":"):
                raise _bad(value, f"unexpected {tail!r} after the address")
            port = _port(value, tail[1:])
    elif rest.count(":") == 1:
        host, port_s = rest.split(":")
        port = _port(value, port_s)
    elif ":" in rest:
        if not re.match(_IPV6, rest):
            raise _bad(value, "too many ':'")
        host = rest
    else:
        host = rest
    if ":" not in host and not re.match(_NAME, host):
        raise _bad(value, f"host name {host!r} has characters other than letters, digits, '.', '-', '_'")
    return HostSpec(host=host, user=user, port=port)


def _port(value: str, text: str) -> int:
    if not text.isdigit():
        raise _bad(value, f"port {text!r} is not a number")
    port = int(text)
    if not 1 <= port <= 65535:
        raise _bad(value, f"port {port} is outside 1..65535")
    return port
