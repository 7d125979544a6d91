"""Post-mortems in a node's ranks that tlaunch does not start itself (torch's elastic agent's,
DeepSpeed's, a ``basic --command`` trainer's): Python runs this at start-up as ``sitecustomize``.

:func:`tlaunch.runtime.debugger.share` puts this folder first on the ``PYTHONPATH`` of a
node's children under ``TLAUNCH_DEBUG=post-mortem``. In a rank (a process with ``RANK``
in its environment: not the launchers between the node and its ranks, which raise when a
rank failed) it makes an uncaught exception hold the process at its frames for ``tlaunch
debug`` (:func:`tlaunch.runtime.debugger.post_mortem`), after its traceback is printed and
before the process exits. ``breakpoint()`` needs nothing here: the ranks inherit the
node's ``PYTHONBREAKPOINT``. The user's script is not changed; a ``sitecustomize`` of the
interpreter's own (which this one shadows) is run after it.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType


def _install() -> None:
    if os.environ.get("TLAUNCH_DEBUG") != "post-mortem" or "RANK" not in os.environ:
        return
    if not os.environ.get("TLAUNCH_DEBUG_TICKET"):
        return
    previous = sys.excepthook

    def hold(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        previous(kind, exc, tb)  # the traceback first, as the process would print it
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return
        sys.stderr.flush()
        from tlaunch.runtime import debugger

        debugger.post_mortem(exc)

    sys.excepthook = hold


def _chain() -> None:
    """Run the ``sitecustomize`` this one shadows, if the interpreter has one."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = list(sys.path)
    me = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in path if os.path.abspath(p or os.curdir) != here]
    try:
        import sitecustomize  # type: ignore[import-not-found]  # noqa: F401  (the next one on the path, if any)
    except ImportError:
        pass
    finally:
        sys.path[:] = path
        if me is not None:
            sys.modules["sitecustomize"] = me


_install()
_chain()
