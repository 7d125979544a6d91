"""The bundle: what a node process needs to run its node (config, keys, coordinator, the node).

Each node is pickled on its own by the launcher (:mod:`tlaunch.runtime.packing`),
so a process unpickles only its node. For hosts that should get a value several
nodes share once, large buffers go out of band and the bundle names the files
that hold them. A bundle holds the run's keys: it reaches its node process on
stdin, from the node's supervisor, never through a file.

This module is what a node process imports (the launcher's pickling is apart:
cloudpickle and the program model are imported where a node's pickle needs them).
"""

from __future__ import annotations

import functools
import os
import pickle
from collections.abc import Mapping
from typing import Any, NamedTuple

from tlaunch.allocation import LAUNCH_NODE, address_towards, launch_node_address
from tlaunch.runtime.node_runtime import RuntimeConfig

__all__ = ["Bundle", "absl_flags", "lru_cached", "read_buffer", "read_bundle_bytes"]


class Bundle(NamedTuple):
    """A run's config, its coordinator's address and its pickled nodes.

    ``buffers``: for a node pickled with out-of-band buffers (values several
    nodes share, shipped once per host), the files that hold them, in order.
    """

    config: RuntimeConfig
    coordinator_address: str
    nodes: dict[str, bytes]
    buffers: Mapping[str, tuple[str, ...]] = {}  # shared by every bundle without: read only

    def node(self, key: str) -> Any:
        """Node ``key``, unpickled (its out-of-band buffers read from their files, writable)."""
        return pickle.loads(self.nodes[key], buffers=[read_buffer(p) for p in self.buffers.get(key, ())])

    def at_launch_node(self, environ: Mapping[str, str] | None = None) -> Bundle:
        """This bundle as a SLURM step reads it: where the coordinator's host, or the node's own
        advertised one, is :data:`~tlaunch.allocation.LAUNCH_NODE`, the machine that launched
        the step (``$SLURM_LAUNCH_NODE_IPADDR``) and this machine's address on the route to it.

        A launch in its own allocation gives its steps these names, so that it needs
        not ask ``scontrol`` where its nodes are while they start. Any other bundle
        is returned as it is.

        Raises:
            LaunchError: the bundle names the launch node, and this process is no SLURM step.
        """
        host, _, port = self.coordinator_address.rpartition(":")
        if host != LAUNCH_NODE:
            return self
        launcher = launch_node_address(environ)
        config = self.config
        if config.advertise_host == LAUNCH_NODE:
            config = config._replace(advertise_host=address_towards(launcher))
        host = f"[{launcher}]" if ":" in launcher else launcher  # as RPCServer writes an IPv6 host
        return self._replace(config=config, coordinator_address=f"{host}:{port}")


def read_buffer(path: str) -> bytearray:
    """The content of ``path`` as a writable buffer (an array made over it can be written to)."""
    with open(path, "rb") as f:
        data = bytearray(os.fstat(f.fileno()).st_size)
        f.readinto(data)
    return data


# Named in nodes' pickles (tlaunch.runtime.packing): the unpickling process calls them.


def absl_flags() -> Any:
    """absl's ``FLAGS`` of the unpickling process (a node's pickle holds the launcher's by reference)."""
    from absl import flags

    return flags.FLAGS


def lru_cached(function: Any, parameters: dict[str, Any]) -> Any:
    """``function`` in a fresh, empty ``lru_cache`` of ``parameters`` (a by-value function's cache)."""
    return functools.lru_cache(**parameters)(function)


def read_bundle_bytes(data: bytes, where: str = "stdin") -> Bundle:
    """A bundle from its pickled bytes."""
    bundle = pickle.loads(data)
    if not isinstance(bundle, Bundle):
        raise TypeError(f"{where} holds no tlaunch bundle")
    return bundle
