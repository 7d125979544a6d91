"""The restart policy of a node, and the loop every backend runs it with.

The launcher resolves ``max_restarts`` and ``restart_backoff`` into one
:class:`RestartPolicy` per node; whatever watches a node's process (a
supervisor process on an SSH host, a thread of the local backend, the thread
that runs a node under ``local_mt``) runs :func:`supervise`, so a node restarts
the same way everywhere and the coordinator hears the same reports.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from tlaunch.errors import RPCError

__all__ = ["RestartPolicy", "exit_reason", "supervise"]

log = logging.getLogger(__name__)


class RestartPolicy(NamedTuple):
    """How often a failing node is started again, and how long to wait first.

    Attributes:
        max_restarts: restarts after the first start (0: a failure is final).
        backoff: seconds before the first restart; doubles for each next one.
    """

    max_restarts: int = 0
    backoff: float = 1.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before restart number ``attempt`` (1, 2, ...)."""
        return float(self.backoff * 2 ** (attempt - 1))


def exit_reason(code: int) -> str:
    """``exited with code 3`` or ``was killed by SIGKILL``."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def supervise(
    key: str,
    policy: RestartPolicy,
    run_once: Callable[[int], int],
    stopping: threading.Event,
    coordinator: Any,
    note: Callable[[str], None] | None = None,
) -> int:
    """Run ``run_once(attempt)`` until the node succeeds, the run stops, or restarts run out.

    ``run_once`` starts the node (attempt 0, 1, ...) and returns its exit code
    once it has ended. Every end is reported to ``coordinator``
    (``node_restarting`` or ``node_finished``); ``note`` gets a line for the
    node's log at each restart.

    Returns:
        0 if the node ended well or with the run, 1 if it failed for good.
    """
    attempt = 0
    while True:
        code = run_once(attempt)
        if stopping.is_set():
            _report(coordinator, key, True, code, "stopped with the run")
            return 0
        if code == 0:
            _report(coordinator, key, True, 0, None)
            return 0
        if attempt >= policy.max_restarts:
            left = f" after {attempt} restarts" if attempt else ""
            _report(coordinator, key, False, code, exit_reason(code) + left)
            return 1
        attempt += 1
        reason = exit_reason(code)
        if note is not None:
            note(f"tlaunch: {key} {reason}; restart {attempt}/{policy.max_restarts}")
        with contextlib.suppress(RPCError):
            coordinator.node_restarting(key, code, reason)
        if stopping.wait(policy.delay(attempt)):
            _report(coordinator, key, True, code, "stopped with the run")
            return 0


def _report(coordinator: Any, key: str, ok: bool, code: int, reason: str | None) -> None:
    try:
        coordinator.node_finished(key, ok, None, code, reason)
    except RPCError as exc:
        log.error("could not report the end of %s: %s", key, exc)
