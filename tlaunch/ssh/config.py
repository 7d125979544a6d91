"""An ssh config read as OpenSSH reads it: a ``to_host()`` string to the options of its connection.

A config that uses only ``Host`` blocks, top-level ``Include`` and plain
values is read here, once for every host of a launch (:class:`ConfigFile`):
``Host`` patterns in order, first value wins, ``Include`` files inlined
(paramiko's parser ignores them), OpenSSH's defaults for what is not set. A
config with what only OpenSSH evaluates (``Match``, ``%`` tokens, ``${VAR}``,
quoted values, ``Canonicalize*``, an ``Include`` inside a block) or a host
name with capitals is answered by ``ssh -G HOST``, exactly as a later ``ssh
HOST`` would read it. Reading it here costs ~0.05 ms a host against ~5 ms of
CPU for an ``ssh -G`` process, which at 1000 hosts is 5 s of the launcher's
CPU; the SSH tests hold both answers equal. Without the ``ssh`` client every
config is read here (paramiko's ``Match`` support).

The options tlaunch honours: HostName, User, Port, IdentityFile,
IdentitiesOnly, UserKnownHostsFile, GlobalKnownHostsFile, HostKeyAlias,
StrictHostKeyChecking, ProxyJump, ProxyCommand, ConnectTimeout and
ServerAliveInterval.
"""

from __future__ import annotations

import dataclasses
import getpass
import glob
import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass, field

import paramiko

from tlaunch.errors import SSHError
from tlaunch.hosts import HostSpec, parse_host
from tlaunch.ssh.hostblocks import HostBlocks

__all__ = ["ConfigFile", "SSHTarget", "config_path", "resolve_target"]

_DEFAULT_KEYS = ("id_rsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk", "id_xmss", "id_dsa")
_SYSTEM_CONFIG = "/etc/ssh/ssh_config"
# OpenSSH's known_hosts files when the config names none (``ssh -G`` prints them).
_DEFAULT_KNOWN = {
    "userknownhostsfile": ["~/.ssh/known_hosts ~/.ssh/known_hosts2"],
    "globalknownhostsfile": ["/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"],
}
# What only OpenSSH evaluates: such a config goes to ``ssh -G``.
_OPENSSH_ONLY = re.compile(r"%|\$\{|\"")
_OPENSSH_ONLY_KEYS = frozenset(
    {"match", "canonicalizehostname", "canonicaldomains", "canonicalizepermittedcnames"}
)


@dataclass(frozen=True)
class SSHTarget:
    """Where and how to connect, once the ssh config is applied."""

    name: str
    hostname: str
    port: int = 22
    user: str = field(default_factory=getpass.getuser)
    key_filenames: tuple[str, ...] = ()
    known_hosts: tuple[str, ...] = ()
    jump: SSHTarget | None = None
    proxy_command: str | None = None
    identities_only: bool = False
    host_key_alias: str | None = None
    accept_new_hosts: bool = False
    connect_timeout: float | None = None
    keepalive: int | None = None


def config_path(ssh_config: str | None = None) -> str | None:
    """The ssh config file in use: ``ssh_config``, ``$TLAUNCH_SSH_CONFIG``, or ``~/.ssh/config`` if it exists.

    None means OpenSSH's defaults (no user file). A run records this path, so
    that ``tlaunch logs/stop`` from any shell reach its hosts the same way.
    """
    path = ssh_config or os.environ.get("TLAUNCH_SSH_CONFIG")
    if path:
        return os.path.abspath(os.path.expanduser(path))
    default = os.path.expanduser("~/.ssh/config")
    return default if os.path.exists(default) else None


def resolve_target(spec: HostSpec | str, ssh_config: str | None = None) -> SSHTarget:
    """Apply the ssh config to a ``to_host()`` string (see the module docstring).

    Raises:
        SSHError: the config cannot be read, or names a ProxyJump host that cannot be resolved.
    """
    return ConfigFile(ssh_config).target(spec)


class ConfigFile:
    """An ssh config, read once for the targets of many hosts (see the module docstring).

    Args:
        ssh_config: the file (see :func:`config_path` for the default).
        exact: ask ``ssh -G`` for every host, whatever the config holds (where
            the ``ssh`` client is installed).
    """

    def __init__(self, ssh_config: str | None = None, exact: bool = False) -> None:
        self.path = config_path(ssh_config)
        self.exact = exact
        self._lock = threading.Lock()
        self._read: tuple[str, bool] | None = None  # the text, and whether it is plain
        self._config: paramiko.SSHConfig | None = None  # without the ssh client: read by paramiko
        self._blocks: HostBlocks | None = None  # a plain config, read here
        self._ssh = shutil.which("ssh") is not None

    def target(self, spec: HostSpec | str) -> SSHTarget:
        """Where and how to connect to ``spec``.

        Raises:
            SSHError: the config cannot be read, or names a ProxyJump host that cannot be resolved.
        """
        spec = parse_host(spec)
        path = self.path
        if path is not None and not os.path.exists(path):
            raise SSHError(
                str(spec), f"the ssh config {path} does not exist; give an existing file as ssh_config"
            )
        opts = self._options(spec)
        jump = None
        hops = [h for h in _one(opts, "proxyjump", "").split(",") if h and h.lower() != "none"]
        for hop in hops:  # a,b: reach b through a
            hop_target = self.target(hop)
            jump = hop_target if jump is None else dataclasses.replace(hop_target, jump=jump)
        hostname = _one(opts, "hostname", spec.host)
        port = spec.port or int(_one(opts, "port", "22"))
        user = spec.user or _one(opts, "user", "") or getpass.getuser()
        proxy = _one(opts, "proxycommand", "")
        known = [*_many(opts, "userknownhostsfile"), *_many(opts, "globalknownhostsfile")]
        strict = _one(opts, "stricthostkeychecking", "ask").lower()
        timeout = _one(opts, "connecttimeout", "")
        alive = _one(opts, "serveraliveinterval", "")
        proxy_command = _tokens(proxy, hostname, port, user, spec.host) if proxy and proxy != "none" else None
        return SSHTarget(
            name=str(spec),
            hostname=hostname,
            port=port,
            user=user,
            key_filenames=_identity_files(opts),
            known_hosts=tuple(os.path.expanduser(p) for p in (known or ["~/.ssh/known_hosts"])),
            jump=jump,
            proxy_command=proxy_command,
            identities_only=_one(opts, "identitiesonly", "no").lower() == "yes",
            host_key_alias=_one(opts, "hostkeyalias", "") or None,
            accept_new_hosts=strict in ("no", "off", "accept-new"),
            connect_timeout=float(timeout) if timeout and timeout != "none" else None,
            keepalive=int(alive) if alive.isdigit() and int(alive) > 0 else None,
        )

    def _options(self, spec: HostSpec) -> dict[str, list[str]]:
        text, plain = self._text()
        if not self._ssh:
            with self._lock:
                if self._config is None:
                    self._config = paramiko.SSHConfig.from_text(text)
            return _lookup(self._config, spec)
        if self.exact or not plain or spec.host != spec.host.lower():
            return _ssh_g(spec, self.path)
        with self._lock:
            if self._blocks is None:
                self._blocks = HostBlocks(text)
        opts = self._blocks.lookup(spec.host)
        for key, value in _DEFAULT_KNOWN.items():
            opts.setdefault(key, value)
        return opts

    def _text(self) -> tuple[str, bool]:
        """The config's text, includes inlined, and whether it is plain (read once)."""
        with self._lock:
            if self._read is None:
                if self.path is not None:
                    self._read = _inline(self.path, 0, "~/.ssh")
                elif self._ssh and os.path.exists(_SYSTEM_CONFIG):  # what ssh reads without a user config
                    self._read = _inline(_SYSTEM_CONFIG, 0, "/etc/ssh")
                else:
                    self._read = ("", True)
            return self._read

    def reads_here(self) -> bool:
        """Whether hosts are looked up here, not by ``ssh -G`` (a plain config; see the module docstring)."""
        return self._ssh and not self.exact and self._text()[1]


def _ssh_g(spec: HostSpec, path: str | None) -> dict[str, list[str]]:
    """``ssh -G``'s resolved options for ``spec``, keys lower-cased, every value kept."""
    argv = ["ssh", "-G"]
    if path is not None:
        argv += ["-F", path]
    if spec.port:
        argv += ["-p", str(spec.port)]
    if spec.user:
        argv += ["-l", spec.user]
    try:
        done = subprocess.run(
            [*argv, spec.host],
            check=False,
            capture_output=True,
            text=True,
            timeout=15,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise SSHError(str(spec), f"`{' '.join(argv)} {spec.host}` did not answer within 15 s") from exc
    if done.returncode != 0:
        said = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise SSHError(str(spec), f"the ssh config {path or '(defaults)'} cannot be read: {said}")
    opts: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if value:
            opts.setdefault(key.lower(), []).append(value)
    return opts


def _lookup(config: paramiko.SSHConfig, spec: HostSpec) -> dict[str, list[str]]:
    """The options of ``spec`` from paramiko's reading of a config, keys lower-cased, every value kept."""
    found = config.lookup(spec.host)
    return {k.lower(): v if isinstance(v, list) else [str(v)] for k, v in found.items()}


def _inline(path: str, depth: int, base: str, seen_block: bool = False) -> tuple[str, bool]:
    """The text of ``path`` with each ``Include`` replaced by the files it names (as OpenSSH reads them).

    Relative includes are looked for in ``base`` (``~/.ssh`` for a user's config,
    ``/etc/ssh`` for the system's). Also returns whether the whole text is plain:
    nothing in it that only OpenSSH evaluates (see the module docstring).
    """
    if depth > 16:
        raise SSHError(path, "Include directives nest more than 16 deep")
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise SSHError(path, f"the ssh config cannot be read: {exc}") from exc
    out, plain = [], True
    for line in lines:
        words = line.strip().split()
        if not words or words[0].startswith("#"):
            out.append(line)
            continue
        keyword = words[0].split("=", 1)[0].lower()
        if keyword in _OPENSSH_ONLY_KEYS or _OPENSSH_ONLY.search(line):
            plain = False
        if keyword == "include":
            # Inlined, an Include inside a block would leave the rest of the block to the
            # included file's last Host: only OpenSSH reads that right.
            plain = plain and not seen_block
            for word in words[1:]:
                pattern = os.path.expanduser(word)
                if not os.path.isabs(pattern):
                    pattern = os.path.join(os.path.expanduser(base), pattern)
                for included in sorted(glob.glob(pattern)):
                    text, ok = _inline(included, depth + 1, base, seen_block)
                    out.append(text)
                    plain = plain and ok
                    seen_block = seen_block or bool(re.search(r"(?im)^\s*(host|match)\b", text))
        else:
            seen_block = seen_block or keyword in ("host", "match")
            out.append(line)
    return "\n".join(out), plain


def _one(opts: dict[str, list[str]], key: str, default: str) -> str:
    values = opts.get(key)
    return values[0] if values else default


def _many(opts: dict[str, list[str]], key: str) -> list[str]:
    return [p for v in opts.get(key, []) for p in v.split() if p.lower() != "none"]


def _identity_files(opts: dict[str, list[str]]) -> tuple[str, ...]:
    """The identity files named in the config (not OpenSSH's defaults), that exist."""
    files = [os.path.expanduser(p) for p in opts.get("identityfile", [])]
    defaults = {os.path.expanduser(f"~/.ssh/{k}") for k in _DEFAULT_KEYS}
    if set(files) <= defaults:
        # ssh -G lists the defaults when none is configured (and a config naming only default
        # keys reads the same): paramiko looks for them itself.
        return ()
    return tuple(f for f in files if os.path.exists(f))


def _tokens(command: str, hostname: str, port: int, user: str, original: str) -> str:
    """Expand the ``%`` tokens OpenSSH expands in a ProxyCommand."""
    out, i = [], 0
    table = {"h": hostname, "p": str(port), "r": user, "n": original, "%": "%"}
    while i < len(command):
        c = command[i]
        if c == "%" and i + 1 < len(command) and command[i + 1] in table:
            out.append(table[command[i + 1]])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)
