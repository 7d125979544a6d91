"""The pool's description, ``pool.yaml`` (``tlaunch server --pool pool.yaml``), read and checked.

::

    ssh_config: ~/.ssh/config      # optional: where the host names are defined
    probe_every: 30                # seconds between probes of every host (default 30)
    limits:                        # optional: GPUs a user's jobs may hold at once
      gpus: 8
      users: {alice: 16, ci: 2}
    pools:                         # named pools (or just `hosts:`, one pool named "default")
      lab:
        hosts:
          - gpu1                   # probed: nproc, memory, nvidia-smi
          - name: gpu2             # or declared by hand (what is given wins over the probe)
            gpus: 8
            cpus: 64
            memory: 512Gi
            labels: [a100]

Every mistake is refused before the server starts, naming where it is
(``pools.lab.hosts[1].memory``), the value, and what is valid.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tlaunch.errors import ProgramError
from tlaunch.extras import MissingExtraError, require
from tlaunch.hosts import parse_host
from tlaunch.pool.errors import PoolConfigError
from tlaunch.pool.queue import Limits
from tlaunch.pool.resources import Gpu, Host, HostFacts, parse_memory

__all__ = ["HostDecl", "PoolConfig", "load_pool", "parse_pool"]

_TOP = ("ssh_config", "probe_every", "limits", "pools", "hosts")
_HOST = ("name", "gpus", "cpus", "memory", "labels")


@dataclass(frozen=True)
class HostDecl:
    """One host as ``pool.yaml`` gives it: its name and pool, and what is declared by hand.

    Attributes:
        name: the host's name as the ssh config knows it.
        pool: the named pool it is in.
        gpus, cpus, memory: declared counts (None: probed).
        labels: words a job's ``gpu_label`` may ask for.
    """

    name: str
    pool: str = "default"
    gpus: int | None = None
    cpus: int | None = None
    memory: int | None = None
    labels: frozenset[str] = frozenset()

    @property
    def declared(self) -> bool:
        """Its resources are all declared: known without a probe."""
        return self.gpus is not None and self.cpus is not None and self.memory is not None

    def host(self, facts: HostFacts | None, up: bool, reason: str | None = None) -> Host:
        """The host as the server knows it, from its last probe's ``facts`` (None: never probed).

        What is declared wins: ``gpus: 4`` on an 8-GPU host hands out GPUs 0-3 (with
        the probe's UUIDs), ``cpus: 16`` the first 16 CPU ids the probe found.
        """
        known = facts is not None or self.declared
        cpus: tuple[int, ...] = facts.cpus if facts is not None else ()
        if self.cpus is not None:
            cpus = cpus[: self.cpus] if len(cpus) >= self.cpus else tuple(range(self.cpus))
        memory = self.memory if self.memory is not None else (facts.memory if facts is not None else 0)
        gpus: tuple[Gpu, ...] = facts.gpus if facts is not None else ()
        if self.gpus is not None:
            probed = {g.index: g for g in gpus}
            gpus = tuple(probed.get(i, Gpu(i)) for i in range(self.gpus))
        return Host(
            self.name,
            cpus,
            memory,
            gpus,
            self.labels,
            self.pool,
            up=up and known,
            reason=reason if not up else (None if known else "not probed yet"),
            gpu_processes=facts.gpu_processes if facts is not None else (),
            known=known,
        )


@dataclass(frozen=True)
class PoolConfig:
    """The whole of ``pool.yaml``.

    Attributes:
        hosts: every host, in the order given.
        ssh_config: the ssh config that defines their names (None: ``~/.ssh/config``).
        probe_every: seconds between probes of every host.
        limits: the per-user GPU limits.
    """

    hosts: tuple[HostDecl, ...]
    ssh_config: str | None = None
    probe_every: float = 30.0
    limits: Limits = field(default_factory=Limits)

    @property
    def pools(self) -> tuple[str, ...]:
        """The pools' names, in the order given."""
        return tuple(dict.fromkeys(h.pool for h in self.hosts))


def load_pool(path: str) -> PoolConfig:
    """Read and check the pool's file (YAML, or JSON, which is YAML).

    Raises:
        PoolConfigError: the file is missing, not YAML, or wrong (the message says where and how).
    """
    try:
        yaml = require("yaml", f"--pool {path}")
    except MissingExtraError:
        raise PoolConfigError(f"--pool {path}: reading it needs PyYAML: pip install pyyaml") from None
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise PoolConfigError(f"--pool {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise PoolConfigError(f"{path} is not YAML: {exc}") from None
    return parse_pool(data, where=path)


def parse_pool(data: object, where: str = "pool.yaml") -> PoolConfig:
    """Check the loaded contents of ``pool.yaml`` (a mapping).

    Raises:
        PoolConfigError: what is wrong, and where (see the module docstring for the form).
    """
    top = _mapping(data, where, "the file")
    _keys(top, _TOP, where, "the file")
    if ("pools" in top) == ("hosts" in top):
        raise PoolConfigError(
            f"{where}: give either `hosts:` (one pool) or `pools:` (named pools, each with `hosts:`)"
        )
    hosts: list[HostDecl] = []
    if "hosts" in top:
        hosts += _hosts(top["hosts"], "default", where, "hosts")
    else:
        pools = _mapping(top["pools"], where, "pools")
        if not pools:
            raise PoolConfigError(f"{where}: pools is empty; name at least one pool with its hosts")
        for name, body in pools.items():
            if not isinstance(name, str) or not name:
                raise PoolConfigError(f"{where}: pools: {name!r} is not a pool name (a word, e.g. lab)")
            section = _mapping(body, where, f"pools.{name}")
            _keys(section, ("hosts",), where, f"pools.{name}")
            hosts += _hosts(section.get("hosts"), name, where, f"pools.{name}.hosts")
    seen: dict[str, str] = {}
    for h in hosts:
        if h.name in seen:
            raise PoolConfigError(
                f"{where}: host {h.name!r} is given twice (in pools {seen[h.name]!r} and {h.pool!r}); "
                "a host belongs to one pool, or its GPUs would be handed out twice"
            )
        seen[h.name] = h.pool
    ssh_config = top.get("ssh_config")
    if ssh_config is not None and (not isinstance(ssh_config, str) or not ssh_config):
        raise PoolConfigError(f"{where}: ssh_config: {ssh_config!r} is not a path")
    every = top.get("probe_every", 30)
    if isinstance(every, bool) or not isinstance(every, (int, float)) or not 1 <= every <= 3600:
        raise PoolConfigError(f"{where}: probe_every: {every!r} must be seconds from 1 to 3600 (e.g. 30)")
    return PoolConfig(
        tuple(hosts),
        os.path.expanduser(ssh_config) if ssh_config else None,
        float(every),
        _limits(top.get("limits"), where),
    )


def _hosts(value: object, pool: str, where: str, at: str) -> list[HostDecl]:
    if not isinstance(value, list) or not value:
        raise PoolConfigError(
            f"{where}: {at}: give a list of hosts (names, or mappings with name:), e.g. [gpu1]"
        )
    return [_host(item, pool, where, f"{at}[{i}]") for i, item in enumerate(value)]


def _host(item: object, pool: str, where: str, at: str) -> HostDecl:
    body: Mapping[str, Any] = {"name": item} if isinstance(item, str) else _mapping(item, where, at)
    _keys(body, _HOST, where, at)
    name = body.get("name")
    try:
        spec = parse_host(name)
    except ProgramError as exc:
        raise PoolConfigError(f"{where}: {at}.name: {exc}") from None
    if spec.is_local:
        raise PoolConfigError(
            f"{where}: {at}.name: {name!r} is this machine; the pool is of SSH hosts (use the name "
            "by which ssh reaches it, or run jobs here without a pool)"
        )
    counts: dict[str, int | None] = {}
    for key in ("gpus", "cpus"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise PoolConfigError(f"{where}: {at}.{key}: {value!r} must be a whole number >= 0 (e.g. 8)")
        counts[key] = value
    memory = body.get("memory")
    try:
        size = None if memory is None else parse_memory(memory)
    except ValueError as exc:
        raise PoolConfigError(f"{where}: {at}.memory: {exc}") from None
    labels = body.get("labels", [])
    if isinstance(labels, str):
        labels = [labels]
    if not isinstance(labels, list) or not all(isinstance(x, str) and x and x.strip() == x for x in labels):
        raise PoolConfigError(
            f"{where}: {at}.labels: {labels!r} must be a list of words (e.g. [a100, nvlink])"
        )
    return HostDecl(str(name), pool, counts["gpus"], counts["cpus"], size, frozenset(labels))


def _limits(value: object, where: str) -> Limits:
    if value is None:
        return Limits()
    body = _mapping(value, where, "limits")
    _keys(body, ("gpus", "users"), where, "limits")
    gpus = _limit(body.get("gpus"), where, "limits.gpus")
    users = _mapping(body.get("users", {}), where, "limits.users")
    return Limits(gpus, {str(u): _limit(n, where, f"limits.users.{u}") for u, n in users.items()})


def _limit(value: object, where: str, at: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PoolConfigError(f"{where}: {at}: {value!r} must be a number of GPUs >= 0, or null (no limit)")
    return value


def _mapping(value: object, where: str, at: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise PoolConfigError(f"{where}: {at} must be a mapping (key: value), not {type(value).__name__}")
    return value


def _keys(body: Mapping[str, Any], valid: Sequence[str], where: str, at: str) -> None:
    unknown = [k for k in body if k not in valid]
    if unknown:
        raise PoolConfigError(f"{where}: {at}: unknown key {unknown[0]!r}; valid keys are {list(valid)}")
