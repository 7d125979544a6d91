"""How the launcher pickles nodes for their processes (read there by :mod:`tlaunch.runtime.bundle`).

Each node is cloudpickled on its own (functions and classes of ``__main__`` go by
value), so a process unpickles only its node, and a node that cannot be pickled
is named before anything starts. For hosts that should get a value several
nodes share once (:func:`pickle_nodes_shared`), large buffers go out of band.
absl's global ``FLAGS`` goes by reference (a node process holds the launcher's
values, see :mod:`tlaunch.flags`), and an ``lru_cache`` of a function that goes
by value is rebuilt around it, empty.
"""

from __future__ import annotations

import contextlib
import functools
import io
import pickle
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import cloudpickle

from tlaunch.errors import PicklingError
from tlaunch.nodes.base import Node
from tlaunch.pickling import Pickler, dumps
from tlaunch.plan import LaunchPlan
from tlaunch.runtime.bundle import absl_flags, lru_cached

__all__ = [
    "SHARED_MIN",
    "SharedPayloads",
    "heavy_notes",
    "pickle_node",
    "pickle_nodes",
    "pickle_nodes_shared",
    "pickle_with_nodes",
    "user_module",
]


def _importable(obj: Any, by_value: frozenset[str]) -> bool:
    """Whether ``obj`` unpickles by reference in another process (its module imports it by name)."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    if module is None or module.__name__ == "__main__" or module.__name__ in by_value:
        return False
    target: Any = module
    for part in getattr(obj, "__qualname__", "<none>").split("."):
        target = getattr(target, part, None)
    return target is obj


class _NodePickler(Pickler):
    """cloudpickle, with absl's FLAGS by reference and lru_caches of by-value functions rebuilt."""

    def __init__(
        self, file: io.BytesIO, by_value: frozenset[str], buffer_callback: Callable[[Any], Any] | None = None
    ) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=buffer_callback)
        self._by_value = by_value
        flags_module = sys.modules.get("absl.flags")
        self._flags = getattr(flags_module, "FLAGS", None)

    def reducer_override(self, obj: Any) -> Any:
        if obj is self._flags and obj is not None:
            return absl_flags, ()
        if isinstance(obj, functools._lru_cache_wrapper) and not _importable(obj, self._by_value):
            return lru_cached, (obj.__wrapped__, obj.cache_parameters())
        return super().reducer_override(obj)


def pickle_node(
    node: Node, by_value: frozenset[str] = frozenset(), buffer_callback: Callable[[Any], Any] | None = None
) -> bytes:
    """Cloudpickle ``node`` (``by_value``: names of modules registered to go by value).

    ``buffer_callback``: pickle's, for out-of-band buffers (protocol 5).

    Raises:
        PicklingError: naming the node and, where it can be found, the attribute
            that failed.
    """
    try:
        buffer = io.BytesIO()
        _NodePickler(buffer, by_value, buffer_callback).dump(node)
        return buffer.getvalue()
    except Exception as exc:
        culprit = _find_unpicklable(node)
        where = f" (attribute {culprit})" if culprit else ""
        raise PicklingError(
            f"node {node.key!r} ({node!r}) cannot be pickled{where}: {exc}; nodes are "
            "shipped to their process, so their arguments must be picklable — build "
            "locks, sockets, files and clients inside the node instead"
        ) from exc


def pickle_nodes(nodes: Mapping[str, Node], by_value: bool = False) -> dict[str, bytes]:
    """Cloudpickle every node, by key.

    With ``by_value``, the modules of the nodes' code that other hosts cannot
    import (the user's own files, outside site-packages) are pickled by value.

    Raises:
        PicklingError: naming the first node that cannot be pickled.
    """
    with _by_value(nodes, by_value) as names:
        return {key: pickle_node(node, names) for key, node in nodes.items()}


@dataclass(frozen=True)
class SharedPayloads:
    """Nodes pickled with their large buffers apart, each distinct buffer once.

    Attributes:
        payloads: each node's pickle, by key; its large buffers are out of band.
        buffers: the digests of each node's out-of-band buffers, in the order
            its pickle takes them, by key.
        blobs: each distinct buffer's bytes, by digest (views: no copy).
    """

    payloads: dict[str, bytes]
    buffers: dict[str, tuple[str, ...]]
    blobs: dict[str, memoryview]

    def size(self, key: str) -> int:
        """Bytes node ``key`` needs: its pickle and its buffers."""
        return len(self.payloads[key]) + sum(self.blobs[d].nbytes for d in self.buffers[key])


SHARED_MIN = 1 << 20
"""Buffers this large (numpy arrays...) travel apart from the node's pickle, once per host."""


def pickle_nodes_shared(
    nodes: Mapping[str, Node], by_value: bool = False, min_size: int = SHARED_MIN
) -> SharedPayloads:
    """Cloudpickle every node; buffers of ``min_size`` bytes or more go out of band, each distinct one once.

    A value several nodes hold (4 nodes given the same 100 MB array) is then
    one blob, which a backend ships once per host instead of once per node.
    Buffers are told apart by a BLAKE2 digest of their bytes (an object seen
    before is not hashed again). ``by_value`` as for :func:`pickle_nodes`.

    Raises:
        PicklingError: naming the first node that cannot be pickled.
    """
    blobs: dict[str, memoryview] = {}
    known: dict[tuple[int, int], tuple[str, Any]] = {}  # (id of the exporter, size) -> digest, exporter
    buffers: dict[str, tuple[str, ...]] = {}

    def pickled(key: str, node: Node, names: frozenset[str]) -> bytes:
        taken: list[str] = []

        def out_of_band(buffer: pickle.PickleBuffer) -> bool:
            raw = buffer.raw()
            if raw.nbytes < min_size:
                return True  # in band
            seen = known.get((id(raw.obj), raw.nbytes))
            if seen is None:
                import hashlib  # the launcher's only

                digest = hashlib.blake2b(raw, digest_size=16).hexdigest()
                known[(id(raw.obj), raw.nbytes)] = seen = (digest, raw.obj)  # the exporter stays alive
                blobs.setdefault(digest, raw)
            taken.append(seen[0])
            return False

        data = pickle_node(node, names, out_of_band)
        buffers[key] = tuple(taken)
        return data

    with _by_value(nodes, by_value) as names:
        payloads = {key: pickled(key, node, names) for key, node in nodes.items()}
    return SharedPayloads(payloads, buffers, blobs)


_HEAVY_NODE = 128 << 20
_HEAVY_TOTAL = 256 << 20


def heavy_notes(plan: LaunchPlan, payloads: Mapping[str, bytes], shared: SharedPayloads | None) -> list[str]:
    """What large arguments cost, to tell the user: once per host where shared, else once per node process."""
    sizes = {k: shared.size(k) if shared else len(p) for k, p in payloads.items()}
    heavy = sorted(((n, k) for k, n in sizes.items() if n >= 16 << 20), reverse=True)
    listed = ", ".join(f"{k} ({n / 2**20:.0f} MiB)" for n, k in heavy[:6]) + (
        ", ..." if len(heavy) > 6 else ""
    )
    advice = "Pass a path and load the data in the node, or serve it from a node (CourierNode, TransmitNode)."
    if shared is None:
        total = sum(sizes.values())
        if total < _HEAVY_TOTAL and not any(n >= _HEAVY_NODE for n, _ in heavy):
            return []
        return [
            f"warning: the nodes' arguments take {total / 2**20:.0f} MiB ({listed}): every node process "
            f"gets its own copy, so an array passed to four nodes is copied four times. {advice}"
        ]
    notes = []
    users: dict[str, int] = {}
    for digests in shared.buffers.values():
        for d in set(digests):
            users[d] = users.get(d, 0) + 1
    common = [d for d, n in users.items() if n > 1]
    if common:
        size = sum(shared.blobs[d].nbytes for d in common)
        one = len(common) == 1
        notes.append(
            f"{len(common)} value{'' if one else 's'} that several nodes share ({size / 2**20:.1f} MiB) "
            f"travel{'s' if one else ''} once per host, not once per node"
        )
    keys_of: dict[str, list[str]] = {}
    for n in plan.nodes:
        if n.key in payloads:
            keys_of.setdefault(str(n.host), []).append(n.key)
    per_host = {
        host: sum(len(payloads[k]) for k in keys)
        + sum(shared.blobs[d].nbytes for d in {d for k in keys for d in shared.buffers[k]})
        for host, keys in keys_of.items()
    }
    host, most = max(per_host.items(), key=lambda kv: kv[1], default=("", 0))
    if most >= _HEAVY_TOTAL or any(n >= _HEAVY_NODE for n, _ in heavy):
        notes.append(
            f"warning: the nodes' arguments take {most / 2**20:.0f} MiB on host {host} ({listed}), "
            f"shipped at every launch. {advice}"
        )
    return notes


def pickle_with_nodes(obj: object, nodes: Mapping[str, Node]) -> bytes:
    """Cloudpickle ``obj`` (a whole program, say) with the user's modules of ``nodes``' code by value.

    For a machine that may not see the launcher's files (a batch job's first node).
    """
    with _by_value(nodes, True):
        return dumps(obj)


@contextlib.contextmanager
def _by_value(nodes: Mapping[str, Node], on: bool) -> Iterator[frozenset[str]]:
    """While pickling: the user's modules of ``nodes``' code go by value (``on``); yields their names."""
    mods = _local_modules(list(nodes.values())) if on else []
    for mod in mods:
        cloudpickle.register_pickle_by_value(mod)
    try:
        yield frozenset(mod.__name__ for mod in mods)
    finally:
        for mod in mods:
            cloudpickle.unregister_pickle_by_value(mod)


def _local_modules(nodes: list[Node]) -> list[ModuleType]:
    """Modules of the nodes' code that only this machine can import (not installed, not tlaunch)."""
    mods: list[ModuleType] = []
    for node in nodes:
        for inner in [node, *getattr(node, "nodes", [])]:
            mod = user_module(getattr(inner, "function", None))  # PyNode and its subclasses
            if mod is not None and mod not in mods:
                mods.append(mod)
    return mods


def user_module(obj: object) -> ModuleType | None:
    """The module of ``obj``'s code if only this machine can import it (the user's own file), else None.

    Installed packages, tlaunch, builtins and ``__main__`` (which cloudpickle
    always pickles by value) give None.
    """
    mod = sys.modules.get(getattr(obj, "__module__", "") or "")
    path = getattr(mod, "__file__", None) or ""
    if mod is None or mod.__name__ in ("__main__", "builtins") or mod.__name__.startswith("tlaunch"):
        return None
    if "site-packages" in path or "dist-packages" in path or path.startswith(sys.base_prefix):
        return None
    return mod


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
