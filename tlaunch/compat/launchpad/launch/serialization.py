"""``launchpad.launch.serialization``: the pickling check of thread launches."""

from __future__ import annotations

import copyreg
import functools
from collections.abc import Callable, Sequence
from typing import Any

from tlaunch.launchpad_args import check_nodes_serializable
from tlaunch.nodes.base import Node

__all__ = ["check_nodes_are_serializable", "enable_lru_cache_pickling_once"]


def check_nodes_are_serializable(label: str, nodes: Sequence[Node]) -> None:
    """Raise a ``RuntimeError`` (a tlaunch ``PicklingError``) if a node of ``label`` does not pickle."""
    check_nodes_serializable(label, nodes)


def _lru_cache(function: Callable[..., Any], parameters: dict[str, Any]) -> Any:
    return functools.lru_cache(**parameters)(function)


def _reduce_lru_cache(cached: Any) -> tuple[Any, ...]:
    return _lru_cache, (cached.__wrapped__, cached.cache_parameters())


@functools.cache
def enable_lru_cache_pickling_once() -> None:
    """Make every ``functools.lru_cache`` pickle as its function, rebuilt empty, in this process.

    Launchpad's switch: it changes how all pickling in the process treats
    cached functions. tlaunch's own node pickling needs no switch: it rebuilds the
    caches of functions that go by value, and leaves importable ones by reference.
    """
    copyreg.pickle(functools._lru_cache_wrapper, _reduce_lru_cache)
