"""The processes of a run (supervisors, heads, nodes) and what they share.

An interpreter started as one of them (``python -m`` one of :data:`ENTRIES`) loads ~100
modules before it does anything, and Python's cyclic garbage collector would run dozens of
times meanwhile over objects that live as long as the process (modules, classes,
functions): ~10 % of a supervisor's or a head's start, ~5 ms of CPU here, paid once a node
on its host. It is off while they load (from this package's import on, which comes first)
and :func:`settle` then freezes what was loaded (``gc.freeze``: never scanned again, and a
node forked afterwards writes to none of those pages) and turns it back on, before any of a
node's own code runs. What the imports left as garbage (~150 objects) stays.
"""

import gc
import itertools
import sys

__all__ = ["ENTRIES", "settle"]

ENTRIES = ("tlaunch.runtime.supervisor", "tlaunch.runtime.head", "tlaunch.runtime.node_main")
"""The modules run as ``python -m MODULE`` that start without collections."""

_argv = getattr(sys, "orig_argv", ())
_loading = any(a == "-m" and b in ENTRIES for a, b in itertools.pairwise(_argv))
if _loading:
    gc.disable()


def settle() -> None:
    """End the start without collections (see the module docstring); nothing if it was not one."""
    global _loading
    if _loading:
        _loading = False
        gc.freeze()
        gc.enable()
