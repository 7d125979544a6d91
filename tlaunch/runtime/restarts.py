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
    output: Callable[[], str] | None = None,
    signalled: Callable[[], bool] | None = None,
) -> int:
    """Run ``run_once(attempt)`` until the node succeeds, the run stops, or restarts run out.

    ``run_once`` starts the node (attempt 0, 1, ...) and returns its exit code
    once it has ended. Every end is reported to ``coordinator``
    (``node_restarting`` or ``node_finished``); ``note`` gets a line for the
    node's log at each restart; ``output`` gives the last lines the node's
    process wrote, which a failure report carries (a command's ``ValueError:
    ...``, where no traceback of its own was noted).

    A node that exits non-zero by itself while the run stops (not killed by a
    signal: ``signalled`` says whether its watcher sent one) failed: it is
    reported so, not as stopped with the run (it raised; the run's first
    failure stays the root cause).

    Returns:
        0 if the node ended well or with the run, 1 if it failed for good.
    """
    attempt = 0
    while True:
        code = run_once(attempt)
        if stopping.is_set():
            if _failed_by_itself(code) and not (signalled is not None and signalled()):
                _report(coordinator, key, False, code, exit_reason(code), output)
                return 1
            _report(coordinator, key, True, code, "stopped with the run")
            return 0
        if code == 0:
            _report(coordinator, key, True, 0, None)
            return 0
        if attempt >= policy.max_restarts:
            left = f" after {attempt} restarts" if attempt else ""
            _report(coordinator, key, False, code, exit_reason(code) + left, output)
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


_STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGKILL})


def _failed_by_itself(code: int) -> bool:
    """Whether exit code ``code`` is a failure of the process's own (not a signal, nor a shell's ``128 + N``
    for the signals a stop sends)."""
    return code > 0 and (code <= 128 or code - 128 not in _STOP_SIGNALS)


def _report(
    coordinator: Any,
    key: str,
    ok: bool,
    code: int,
    reason: str | None,
    output: Callable[[], str] | None = None,
) -> None:
    tail = (output() or None) if output is not None and not ok else None
    try:
        coordinator.node_finished(key, ok, None, code, reason, tail)
    except RPCError as exc:
        log.error("could not report the end of %s: %s", key, exc)
