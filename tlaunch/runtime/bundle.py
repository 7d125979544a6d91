"""The bundle: what a node process needs to run its node (config, keys, coordinator, the node).

Each node is cloudpickled on its own (functions and classes of ``__main__`` go by
value), so a process unpickles only its node, and a node that cannot be pickled
is named before anything starts. absl's global ``FLAGS`` goes by reference (a
node process holds the launcher's values, see :mod:`tlaunch.flags`), and an
``lru_cache`` of a function that goes by value is rebuilt around it, empty. A
bundle holds the run's keys: it reaches its node process on stdin, from the
node's supervisor, never through a file.
"""

from __future__ import annotations

import functools
import io
import pickle
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import cloudpickle

from tlaunch.errors import PicklingError
from tlaunch.nodes.base import Node
from tlaunch.pickling import Pickler, dumps
from tlaunch.runtime.node_runtime import RuntimeConfig

__all__ = ["Bundle", "pickle_node", "pickle_nodes", "pickle_with_nodes", "read_bundle_bytes"]


@dataclass(frozen=True)
class Bundle:
    """A run's config, its coordinator's address and its pickled nodes."""

    config: RuntimeConfig
    coordinator_address: str
    nodes: dict[str, bytes]


def _global_flags() -> Any:
    """absl's ``FLAGS`` of the unpickling process."""
    from absl import flags

    return flags.FLAGS


def _lru_cache(function: Any, parameters: dict[str, Any]) -> Any:
    return functools.lru_cache(**parameters)(function)


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

    def __init__(self, file: io.BytesIO, by_value: frozenset[str]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._by_value = by_value
        absl_flags = sys.modules.get("absl.flags")
        self._flags = getattr(absl_flags, "FLAGS", None)

    def reducer_override(self, obj: Any) -> Any:
        if obj is self._flags and obj is not None:
            return _global_flags, ()
        if isinstance(obj, functools._lru_cache_wrapper) and not _importable(obj, self._by_value):
            return _lru_cache, (obj.__wrapped__, obj.cache_parameters())
        return super().reducer_override(obj)


def pickle_node(node: Node, by_value: frozenset[str] = frozenset()) -> bytes:
    """Cloudpickle ``node`` (``by_value``: names of modules registered to go by value).

    Raises:
        PicklingError: naming the node and, where it can be found, the attribute
            that failed.
    """
    try:
        buffer = io.BytesIO()
        _NodePickler(buffer, by_value).dump(node)
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
    mods = _local_modules(list(nodes.values())) if by_value else []
    for mod in mods:
        cloudpickle.register_pickle_by_value(mod)
    try:
        names = frozenset(mod.__name__ for mod in mods)
        return {key: pickle_node(node, names) for key, node in nodes.items()}
    finally:
        for mod in mods:
            cloudpickle.unregister_pickle_by_value(mod)


def pickle_with_nodes(obj: object, nodes: Mapping[str, Node]) -> bytes:
    """Cloudpickle ``obj`` (a whole program, say) with the user's modules of ``nodes``' code by value.

    For a machine that may not see the launcher's files (a batch job's first node).
    """
    mods = _local_modules(list(nodes.values()))
    for mod in mods:
        cloudpickle.register_pickle_by_value(mod)
    try:
        return dumps(obj)
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


def read_bundle_bytes(data: bytes, where: str = "stdin") -> Bundle:
    """A bundle from its pickled bytes."""
    bundle = pickle.loads(data)
    if not isinstance(bundle, Bundle):
        raise TypeError(f"{where} holds no tlaunch bundle")
    return bundle
