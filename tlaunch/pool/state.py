"""The pool as the server knows it now: every host of ``pool.yaml`` with its last probe (thread-safe).

A host that answered is up with what it answered (what ``pool.yaml`` declares
wins); one that did not is down with the reason, and keeps what it last
answered, so a job that fits it still waits for it rather than being refused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import replace

from tlaunch.pool.config import PoolConfig
from tlaunch.pool.resources import GpuProcess, Host, HostFacts

__all__ = ["PoolState"]


class PoolState:
    """Each host of ``config`` as its last probe left it (none yet: down, "not probed yet")."""

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._facts: dict[str, HostFacts] = {}
        self._hosts: dict[str, Host] = {
            d.name: d.host(None, up=False, reason="not probed yet") for d in config.hosts
        }
        self._seen: dict[str, float] = {}

    @property
    def names(self) -> list[str]:
        """The hosts' names, in the order of ``pool.yaml``."""
        return [d.name for d in self.config.hosts]

    def hosts(self) -> list[Host]:
        """Every host as it is now, in the order of ``pool.yaml``."""
        with self._lock:
            return [self._hosts[d.name] for d in self.config.hosts]

    def host(self, name: str) -> Host | None:
        """Host ``name`` as it is now (None: not in the pool)."""
        with self._lock:
            return self._hosts.get(name)

    def last_answer(self, name: str) -> float | None:
        """When ``name`` last answered a probe (seconds since the epoch)."""
        with self._lock:
            return self._seen.get(name)

    def seen_gpu_processes(self, name: str, processes: tuple[GpuProcess, ...]) -> bool:
        """Take a fresh look at ``name``'s GPU processes (after a job left it); whether anything changed."""
        decl = next((d for d in self.config.hosts if d.name == name), None)
        with self._lock:
            facts = self._facts.get(name)
            if decl is None or facts is None or not self._hosts[name].up:
                return False
            self._facts[name] = replace(facts, gpu_processes=processes)
            host = decl.host(self._facts[name], up=True)
            changed = host != self._hosts[name]
            self._hosts[name] = host
            return changed

    def update(self, results: Mapping[str, HostFacts | str], now: float | None = None) -> list[str]:
        """Take probes' ``results`` (facts, or why a host gave none); the hosts that changed."""
        now = time.time() if now is None else now
        changed = []
        decls = {d.name: d for d in self.config.hosts}
        with self._lock:
            for name, result in results.items():
                decl = decls.get(name)
                if decl is None:
                    continue
                if isinstance(result, HostFacts):
                    self._facts[name] = result
                    self._seen[name] = now
                    host = decl.host(result, up=True)
                else:
                    host = decl.host(self._facts.get(name), up=False, reason=result)
                if host != self._hosts[name]:
                    self._hosts[name] = host
                    changed.append(name)
        return changed
