"""A plain ssh config's ``Host`` blocks, looked up as OpenSSH looks them up, for many hosts at once.

Only what :mod:`tlaunch.ssh.config` reads here comes this way (no ``Match``,
no tokens): for each host, the blocks whose patterns match it, in file order;
the first value of an option wins, ``IdentityFile`` (and the other options
OpenSSH allows many times) accumulate. Blocks that name hosts literally are
indexed by name, so a lookup costs the blocks with wildcards, not every block:
paramiko's ``SSHConfig.lookup`` tries every block and asks the user database
for each (``getpass.getuser()``), ~6 ms a host at 256 hosts.
"""

from __future__ import annotations

import fnmatch
import re

__all__ = ["HostBlocks"]

_SETTING = re.compile(r"(\w+)(?:\s*=\s*|\s+)(.+)")
_MANY = frozenset({"identityfile", "certificatefile", "localforward", "remoteforward", "dynamicforward"})
_WILD = re.compile(r"[*?!]")


class HostBlocks:
    """The blocks of a config's text (one with no ``Match``: see :mod:`tlaunch.ssh.config`)."""

    def __init__(self, text: str) -> None:
        self._blocks: list[tuple[list[str], list[tuple[str, str]]]] = [(["*"], [])]  # before any Host
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            m = _SETTING.match(line)
            if m is None:
                continue
            key, value = m.group(1).lower(), m.group(2).strip()
            if key == "host":
                self._blocks.append((value.split(), []))
            else:
                self._blocks[-1][1].append((key, value))
        self._named: dict[str, list[int]] = {}
        self._wild: list[int] = []
        for i, (patterns, _) in enumerate(self._blocks):
            if any(_WILD.search(p) for p in patterns):
                self._wild.append(i)
            else:
                for p in patterns:
                    self._named.setdefault(p, []).append(i)

    def lookup(self, host: str) -> dict[str, list[str]]:
        """The options for ``host``, keys lower-cased, as :func:`~tlaunch.ssh.config._ssh_g` gives them."""
        hits = set(self._named.get(host, ()))
        hits.update(i for i in self._wild if _matches(host, self._blocks[i][0]))
        opts: dict[str, list[str]] = {}
        for i in sorted(hits):
            for key, value in self._blocks[i][1]:
                if key in _MANY:
                    opts.setdefault(key, []).append(value)
                elif key not in opts:
                    opts[key] = [value]
        return opts


def _matches(host: str, patterns: list[str]) -> bool:
    """OpenSSH's rule: some pattern matches and no negated one (``!pat``) does."""
    matched = False
    for p in patterns:
        if p.startswith("!"):
            if fnmatch.fnmatchcase(host, p[1:]):
                return False
        elif fnmatch.fnmatchcase(host, p):
            matched = True
    return matched
