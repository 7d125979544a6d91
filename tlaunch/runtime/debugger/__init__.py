"""A debugger for any node of a run: ``breakpoint()`` and post-mortems, attached with ``tlaunch debug``.

In a node (a process or a thread of a run, on any backend), ``breakpoint()`` (the
node's ``sys.breakpointhook``, unless ``PYTHONBREAKPOINT`` says otherwise) or
:func:`set_trace` pauses it::

    node ──breakpoint()──▶ listens (TLS, the run's key) ──▶ coordinator: paused(key, Pause)
      │                      prints "waiting for a debugger: tlaunch debug RUN KEY (...)"
      ▼
    tlaunch debug RUN KEY ──▶ reads the pause from the run's state, connects with the
                              run's key ──▶ pdb over the connection (:mod:`.remote`)
      c / q / lost ──▶ coordinator: resumed(key); the node goes on

The pause is part of the node's record (``tlaunch ps``, ``control``, the dashboard
show ``paused at train.py:42``). A pause waits until a debugger comes, the run stops,
or ``timeout`` passes (``TLAUNCH_DEBUG_TIMEOUT`` seconds; a post-mortem waits
:data:`POST_MORTEM_WAIT` s by default, a breakpoint as long as the run goes on).
Outside any node (the launcher, a plain script) they are plain ``pdb``. A node's
threads pause one at a time (a second waits for the first's session to end).

A node process's children (a torch job's workers, any ``subprocess`` running
Python) pause too, under the node's name: :func:`share` gives them the node's
``PYTHONBREAKPOINT`` and a ticket (the run's settings and key, the coordinator's
address) in a memory file of the node (``/proc/PID/fd/N``: never on a disk,
readable by the node's own user only, gone with the node). They pause one at a
time (a lock on the ticket), each pause naming its rank. Under ``TLAUNCH_DEBUG=post-mortem``
their ranks that raise are held at their frames too: a ``sitecustomize`` of
tlaunch's (``site/``) on their ``PYTHONPATH`` hooks their uncaught exceptions, so
ranks that torch's elastic agent, DeepSpeed or a command starts need no change.
"""

from __future__ import annotations

import os
import sys
import threading
from types import FrameType
from typing import Any

__all__ = [
    "ANNOUNCEMENT",
    "BREAKPOINT",
    "DEBUG_MODES",
    "HOOK",
    "POST_MORTEM",
    "POST_MORTEM_WAIT",
    "SERVER_JOB",
    "TICKET",
    "breakpointhook",
    "install",
    "post_mortem",
    "set_trace",
    "share",
    "worth_a_post_mortem",
]

BREAKPOINT, POST_MORTEM = "breakpoint", "post-mortem"
DEBUG_MODES = (POST_MORTEM,)
"""What ``launch(..., debug=)``, ``--debug`` and ``TLAUNCH_DEBUG`` accept."""
POST_MORTEM_WAIT = 300.0
"""Seconds a node that raised waits for a debugger (post-mortem) unless told otherwise."""
HOOK = "tlaunch.runtime.debugger.breakpointhook"
"""``PYTHONBREAKPOINT`` that makes ``breakpoint()`` pause a node's process this way."""
SERVER_JOB = "TLAUNCH_SERVER_JOB"
"""Set to the job's name in every process of a job a job server started (``tlaunch.jobs.IN_JOB``)."""
ANNOUNCEMENT = "waiting for a debugger: "
"""How the line a paused node prints begins (``waiting for a debugger: tlaunch debug RUN NODE (...)``)."""
TICKET = "TLAUNCH_DEBUG_TICKET"
"""Where a node's child processes find the node's ticket (:func:`share`)."""


def set_trace(frame: FrameType | None = None) -> None:
    """Pause the calling node here until a debugger attaches (``tlaunch debug RUN NODE``).

    Outside any node, :func:`pdb.set_trace` (the terminal's own pdb).
    """
    from tlaunch.runtime.debugger import session

    session.set_trace(frame or sys._getframe(1))


def breakpointhook(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook`` of a node: :func:`set_trace` at the caller of ``breakpoint()``;
    outside any node (a launcher's thread), Python's own hook."""
    from tlaunch.runtime.debugger import session

    if not session.in_node() and not os.environ.get(TICKET):
        sys.__breakpointhook__(*args, **kwargs)
        return
    session.set_trace(sys._getframe(1))


def post_mortem(exc: BaseException) -> str:
    """Hold the calling node at ``exc`` (which it raised) until a debugger has seen it, the
    run stops, or the post-mortem wait ends; returns what came of it (for the failure report)."""
    from tlaunch.runtime.debugger import session

    return session.post_mortem(exc)


def worth_a_post_mortem(exc: BaseException, stopping: threading.Event) -> bool:
    """Whether a node that raised ``exc`` is held for a post-mortem: not for an exit
    (``SystemExit``), a Ctrl-C, or an error of the run's own stop."""
    return not isinstance(exc, (SystemExit, KeyboardInterrupt)) and not stopping.is_set()


def install() -> None:
    """Make ``breakpoint()`` pause this node process (a node thread's: see :func:`breakpointhook`),
    unless ``PYTHONBREAKPOINT`` names another hook (or is ``0``: off)."""
    if os.environ.get("PYTHONBREAKPOINT", HOOK) == HOOK:
        sys.breakpointhook = breakpointhook


def share(config: Any, coordinator: str, key: str) -> None:
    """Let this node process's children pause under its name ``key`` (see the module docstring):
    ``config`` (its :class:`~tlaunch.runtime.node_runtime.RuntimeConfig`) and the coordinator's
    address go into a memory file named in their environment. Nothing where the user's
    ``PYTHONBREAKPOINT`` names another hook, or where there are no memory files."""
    if os.environ.get("PYTHONBREAKPOINT", HOOK) != HOOK or not hasattr(os, "memfd_create"):
        return
    import pickle

    fd = os.memfd_create("tlaunch-debug-ticket", os.MFD_CLOEXEC)
    view = memoryview(pickle.dumps((config, coordinator, key), protocol=pickle.HIGHEST_PROTOCOL))
    while view:
        view = view[os.write(fd, view) :]
    os.environ[TICKET] = f"/proc/{os.getpid()}/fd/{fd}"
    os.environ["PYTHONBREAKPOINT"] = HOOK
    if os.environ.get("TLAUNCH_DEBUG") == POST_MORTEM:  # its ranks' exceptions hold them (site/)
        site = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)
