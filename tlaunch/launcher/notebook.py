"""A run launched from a Jupyter cell: its nodes' pdb sessions in that cell.

When the launcher waits for its run in a Jupyter kernel whose frontend answers
:func:`input` (a notebook in Jupyter, JupyterLab, VS Code), a node that pauses
(``breakpoint()``, a post-mortem) is attached from the cell itself, with the run's
key, as ``tlaunch debug`` would: its pdb writes in the cell's output, and each of its
prompts is the frontend's input box (:mod:`tlaunch.runtime.debugger.terminal`). ``c``
or ``q`` (or interrupting the kernel) lets the node go on and the cell waits on;
several paused nodes are attached in turn. A frontend that takes no input
(``nbclient``, ``jupyter nbconvert --execute``) gets the line that names the command
to run elsewhere (``tlaunch debug RUN NODE``), as a terminal's launcher prints it.
"""

from __future__ import annotations

import contextlib
import ssl
import sys

from tlaunch.rpc.security import RunKeys
from tlaunch.run import Run
from tlaunch.runtime.debugger import channel, terminal

__all__ = ["can_ask", "wait_attaching"]

POLL = 0.25
"""Seconds between two looks for a paused node while the cell waits."""


def can_ask() -> bool:
    """Whether this process is a Jupyter kernel whose frontend answers :func:`input` now."""
    if "ipykernel" not in sys.modules or "IPython" not in sys.modules:
        return False
    shell = sys.modules["IPython"].get_ipython()
    kernel = getattr(shell, "kernel", None)
    return bool(getattr(kernel, "_allow_stdin", False))  # set per cell from its execute request


def wait_attaching(run: Run, keys: RunKeys) -> None:
    """:meth:`Run.wait`, attaching this cell to each node of the run that pauses meanwhile.

    Raises:
        RunFailedError: as :meth:`Run.wait`.
    """
    seen: set[tuple[str, float]] = set()
    while not run.wait(timeout=POLL):
        if run.detached:
            return
        for node in run.snapshot().nodes:
            pause = node.paused
            if pause is None or pause.attached or (node.key, pause.since) in seen:
                continue
            seen.add((node.key, pause.since))
            _attach(node.key, pause.address, keys)


def _attach(key: str, address: str, keys: RunKeys) -> None:
    """One pdb session with node ``key``, in this cell; it may have gone on meanwhile."""
    try:
        sock = channel.connect(address, keys)
    except (OSError, ssl.SSLError) as exc:
        print(f"tlaunch: could not attach to {key} from this cell ({exc})", flush=True)
        return
    with contextlib.closing(sock):
        print(f"tlaunch: this cell is the pdb of {key} (c or q: it goes on)", flush=True)
        terminal.relay(sock)
