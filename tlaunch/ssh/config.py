"""An ssh config read as OpenSSH reads it: a ``to_host()`` string to the options of its connection.

Where the ``ssh`` client is installed, ``ssh -G HOST`` answers: it follows
``Include``, evaluates ``Match``, applies ``Host`` patterns in order and
``%`` tokens in host names, exactly as a later ``ssh HOST`` would. Without
it, the file is parsed here with its ``Include`` files inlined (paramiko's
parser ignores them) and paramiko's ``Match`` support.

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
import shutil
import subprocess
from dataclasses import dataclass, field

import paramiko

from tlaunch.errors import SSHError
from tlaunch.hosts import HostSpec, parse_host

__all__ = ["SSHTarget", "config_path", "resolve_target"]

_DEFAULT_KEYS = ("id_rsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk", "id_xmss", "id_dsa")


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
    spec = parse_host(spec)
    path = config_path(ssh_config)
    if path is not None and not os.path.exists(path):
        raise SSHError(
            str(spec), f"the ssh config {path} does not exist; give an existing file as ssh_config"
        )
    opts = _ssh_g(spec, path) if shutil.which("ssh") else _parse(spec, path)
    jump = None
    hops = [h for h in _one(opts, "proxyjump", "").split(",") if h and h.lower() != "none"]
    for hop in hops:  # a,b: reach b through a
        hop_target = resolve_target(hop, path)
        jump = hop_target if jump is None else dataclasses.replace(hop_target, jump=jump)
    hostname = _one(opts, "hostname", spec.host)
    port = spec.port or int(_one(opts, "port", "22"))
    user = spec.user or _one(opts, "user", "") or getpass.getuser()
    proxy = _one(opts, "proxycommand", "")
    known = [*_many(opts, "userknownhostsfile"), *_many(opts, "globalknownhostsfile")]
    strict = _one(opts, "stricthostkeychecking", "ask").lower()
    timeout = _one(opts, "connecttimeout", "")
    alive = _one(opts, "serveraliveinterval", "")
    return SSHTarget(
        name=str(spec),
        hostname=hostname,
        port=port,
        user=user,
        key_filenames=_identity_files(opts),
        known_hosts=tuple(os.path.expanduser(p) for p in (known or ["~/.ssh/known_hosts"])),
        jump=jump,
        proxy_command=_tokens(proxy, hostname, port, user, spec.host) if proxy and proxy != "none" else None,
        identities_only=_one(opts, "identitiesonly", "no").lower() == "yes",
        host_key_alias=_one(opts, "hostkeyalias", "") or None,
        accept_new_hosts=strict in ("no", "off", "accept-new"),
        connect_timeout=float(timeout) if timeout and timeout != "none" else None,
        keepalive=int(alive) if alive.isdigit() and int(alive) > 0 else None,
    )


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
    opts["_from_ssh_g"] = ["yes"]
    return opts


def _parse(spec: HostSpec, path: str | None) -> dict[str, list[str]]:
    """The config parsed here (no ``ssh`` client), ``Include`` files inlined."""
    config = paramiko.SSHConfig.from_text(_inline(path, 0) if path else "")
    found = config.lookup(spec.host)
    return {k.lower(): v if isinstance(v, list) else [str(v)] for k, v in found.items()}


def _inline(path: str, depth: int) -> str:
    """The text of ``path`` with each ``Include`` replaced by the files it names (as OpenSSH reads them)."""
    if depth > 16:
        raise SSHError(path, "Include directives nest more than 16 deep")
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise SSHError(path, f"the ssh config cannot be read: {exc}") from exc
    out = []
    for line in lines:
        words = line.strip().split()
        if words and words[0].lower() == "include":
            for word in words[1:]:
                pattern = os.path.expanduser(word)
                if not os.path.isabs(pattern):  # relative to ~/.ssh, as for a user's config
                    pattern = os.path.join(os.path.expanduser("~/.ssh"), pattern)
                out += [_inline(p, depth + 1) for p in sorted(glob.glob(pattern))]
        else:
            out.append(line)
    return "\n".join(out)


def _one(opts: dict[str, list[str]], key: str, default: str) -> str:
    values = opts.get(key)
    return values[0] if values else default


def _many(opts: dict[str, list[str]], key: str) -> list[str]:
    return [p for v in opts.get(key, []) for p in v.split() if p.lower() != "none"]


def _identity_files(opts: dict[str, list[str]]) -> tuple[str, ...]:
    """The identity files named in the config (not OpenSSH's defaults), that exist."""
    files = [os.path.expanduser(p) for p in opts.get("identityfile", [])]
    defaults = {os.path.expanduser(f"~/.ssh/{k}") for k in _DEFAULT_KEYS}
    if "_from_ssh_g" in opts and set(files) <= defaults:
        return ()  # ssh -G lists the defaults when none is configured: paramiko looks for them itself
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
