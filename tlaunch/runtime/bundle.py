"""The bundle: everything a host needs to run its nodes, in one file.

Each node is cloudpickled on its own (functions and classes of ``__main__`` go by
value), so a process unpickles only its node, and a node that cannot be pickled
is named before anything starts. The file holds the run's keys: it is written
with mode 0600 in a 0700 directory.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass

import cloudpickle

from tlaunch.errors import PicklingError
from tlaunch.nodes.base import Node
from tlaunch.runtime.node_runtime import RuntimeConfig

__all__ = ["Bundle", "pickle_node", "read_bundle", "read_bundle_bytes", "write_bundle"]


@dataclass(frozen=True)
class Bundle:
    """A run's config, its coordinator's address and its pickled nodes."""

    config: RuntimeConfig
    coordinator_address: str
    nodes: dict[str, bytes]


def pickle_node(node: Node) -> bytes:
    """Cloudpickle ``node``.

    Raises:
        PicklingError: naming the node and, where it can be found, the attribute
            that failed.
    """
    try:
        data: bytes = cloudpickle.dumps(node, protocol=pickle.HIGHEST_PROTOCOL)
        return data
    except Exception as exc:
        culprit = _find_unpicklable(node)
        where = f" (attribute {culprit})" if culprit else ""
        raise PicklingError(
            f"node {node.key!r} ({node!r}) cannot be pickled{where}: {exc}; nodes are "
            "shipped to their process, so their arguments must be picklable — build "
            "locks, sockets, files and clients inside the node instead"
        ) from exc


def _find_unpicklable(obj: object, path: str = "", depth: int = 0) -> str | None:
    """The dotted path of the first attribute or argument that fails to pickle."""
    if depth > 4:
        return path or None
    children: list[tuple[str, object]] = []
    if isinstance(obj, dict):
        children = [(f"{path}[{k!r}]", v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple)):
        children = [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
    elif hasattr(obj, "__dict__"):
        children = [(f"{path}.{k}" if path else k, v) for k, v in vars(obj).items()]
    for name, value in children:
        try:
            cloudpickle.dumps(value)
        except Exception:
            return _find_unpicklable(value, name, depth + 1) or name
    return None


def write_bundle(path: str, bundle: Bundle) -> None:
    """Write ``bundle`` to ``path`` with mode 0600 (its directory must exist)."""
    data = pickle.dumps(bundle, protocol=pickle.HIGHEST_PROTOCOL)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def read_bundle(path: str) -> Bundle:
    """Read a bundle written by :func:`write_bundle`."""
    with open(path, "rb") as f:
        return read_bundle_bytes(f.read(), path)


def read_bundle_bytes(data: bytes, where: str = "stdin") -> Bundle:
    """A bundle from its pickled bytes."""
    bundle = pickle.loads(data)
    if not isinstance(bundle, Bundle):
        raise TypeError(f"{where} holds no tlaunch bundle")
    return bundle
