"""known_hosts files read once for the connections of a launch, each host given its own lines.

paramiko's ``SSHClient.load_host_keys`` parses a whole file for every
connection, and ``HostKeys.load`` compares each line with every line before
it: connecting to H hosts listed in one known_hosts file cost O(H^3) line
comparisons and H^2 key parses (2 ms a host at 32 hosts here, ~50 ms a host
at 256, seconds at 1000). :class:`KnownHosts` reads each file once, indexes
its plain host names, and hands each connection the keys of its own host
only, in the file's order, so that paramiko's check (the first key of the
server's key type must match) is the one it made before. Hashed names
(``HashKnownHosts yes``) cannot be indexed: each costs one HMAC per host
looked up, as in OpenSSH. A key marked ``@revoked`` for a host is never
given to it (paramiko's loader fails on marked lines); ``@cert-authority``
lines are ignored, as tlaunch does not use host certificates.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field

import paramiko

__all__ = ["KnownHosts"]


@dataclass
class _File:
    """One known_hosts file: its lines, plain names to line numbers, hashed names."""

    stamp: tuple[int, int]
    lines: list[str] = field(default_factory=list)
    plain: dict[str, list[int]] = field(default_factory=dict)
    hashed: list[tuple[int, str]] = field(default_factory=list)
    revoked: list[tuple[list[str], str]] = field(default_factory=list)  # host names, "type base64"


class KnownHosts:
    """The known_hosts files of many connections, each read once (thread-safe)."""

    def __init__(self) -> None:
        self._files: dict[str, _File] = {}
        self._lock = threading.Lock()

    def keys(self, paths: tuple[str, ...] | list[str], name: str) -> list[paramiko.PKey]:
        """The keys listed for ``name`` (``host`` or ``[host]:port``) in ``paths``, in file order."""
        keys: list[paramiko.PKey] = []
        for path in paths:
            known = self._file(path)
            if known is None:
                continue
            numbers = set(known.plain.get(name, ()))
            if not name.startswith("|1|"):
                numbers.update(i for i, h in known.hashed if _matches(name, h))
            revoked = {key for names, key in known.revoked if any(_matches(name, h) for h in names)}
            for i in sorted(numbers):
                try:
                    entry = paramiko.hostkeys.HostKeyEntry.from_line(known.lines[i], i + 1)
                except (paramiko.SSHException, paramiko.hostkeys.InvalidHostKey):
                    continue  # a line that cannot be read gives no key (fails closed)
                if entry is None or entry.key is None:
                    continue
                if f"{entry.key.get_name()} {entry.key.get_base64()}" not in revoked:
                    keys.append(entry.key)
        return keys

    def add_to(self, client: paramiko.SSHClient, paths: tuple[str, ...] | list[str], name: str) -> None:
        """Give ``client`` the keys of ``name`` from ``paths``, as ``load_host_keys`` of each would.

        paramiko checks the first key of the server's type it holds for the
        host: the first line of each type is kept, as its loader does.
        """
        host_keys = client.get_host_keys()
        kinds: set[str] = set()
        for key in self.keys(paths, name):
            if key.get_name() not in kinds:
                kinds.add(key.get_name())
                host_keys.add(name, key.get_name(), key)

    def _file(self, path: str) -> _File | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        with self._lock:
            known = self._files.get(path)
            if known is not None and known.stamp == stamp:
                return known
            known = _File(stamp)
            with open(path) as f:
                for raw in f:
                    line = raw.strip()
                    if not line or line.startswith("#"):
                        continue
                    fields = re.split(" |\t", line)
                    if fields[0].startswith("@"):  # a marker: @revoked NAMES TYPE KEY, @cert-authority ...
                        if fields[0] == "@revoked" and len(fields) >= 4:
                            known.revoked.append((fields[1].split(","), f"{fields[2]} {fields[3]}"))
                        continue
                    i = len(known.lines)
                    known.lines.append(line)
                    for host in fields[0].split(","):
                        if host.startswith("|1|"):
                            known.hashed.append((i, host))
                        else:
                            known.plain.setdefault(host, []).append(i)
            self._files[path] = known
            return known


def _matches(name: str, pattern: str) -> bool:
    """Whether host ``name`` is ``pattern``, a known_hosts name (plain, or hashed ``|1|salt|hash``)."""
    if pattern.startswith("|1|"):
        return not name.startswith("|1|") and paramiko.HostKeys.hash_host(name, pattern) == pattern
    return name == pattern
