"""An agent that runs a per-host launcher (torch's elastic agent, DeepSpeed's ``launch``) and reports it.

The launcher process runs in its own process group; its output goes straight
to the agent node's output (its ranks' lines already carry their marks, or
are the host's). Every rank starts through :mod:`tlaunch.torch.record`, whose
error reports are sent to the job's collector as they appear, so the
launcher can name the root cause even when the failing host is not the one
that gives up. A host whose launcher exits non-zero has failed the job; a
stop of the program ends the launcher (SIGTERM: it ends its ranks), then
kills whatever is left of its group.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tlaunch import context
from tlaunch.context import NodeContext
from tlaunch.torch.agent import socket_env
from tlaunch.torch.child_procs import Child, kill_all
from tlaunch.torch.collector import tell
from tlaunch.torch.env import source_env_file
from tlaunch.torch.outcomes import HostOutcome, RankError, WorkerFailure

__all__ = ["Reports", "launcher_agent", "launcher_env", "rank_entry", "run_host_launcher"]


class Reports:
    """The error reports ranks write (:mod:`tlaunch.torch.record`), each sent to the collector once."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._sent: set[str] = set()

    def push(self, collector: Any, index: int) -> None:
        """Send the reports not sent yet, as :class:`RankError` (one that says so when malformed).

        Ranks write each report aside and rename it into place, so a report
        found here is whole: one that cannot be read is sent as unreadable.
        """
        for path in sorted(glob.glob(os.path.join(self.folder, "*.json"))):
            if path in self._sent:
                continue
            self._sent.add(path)
            try:
                with open(path, encoding="utf-8") as f:
                    report: object = json.load(f)
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:
                report = f"<{type(exc).__name__}: {exc}>"
            collector.error(index, RankError.from_report(report, time.time(), os.path.basename(path)))


def launcher_agent(
    collector: Any,
    index: int,
    mode: str,
    hosts: Sequence[str],
    env_file: str | None,
    launcher: Callable[[NodeContext, dict[str, str], str], list[str]],
) -> None:
    """The body of a per-host launcher's agent node on host ``index`` (the torchrun and deepspeed modes').

    In a work folder of its own (``tlaunch-<mode>-<run id>-...``, removed when it
    ends): the launcher's environment (:func:`launcher_env`), its argv from
    ``launcher(ctx, env, work)`` (which meets the other hosts' agents through
    ``collector`` and may add to ``env``), run until it exits or the program
    stops (:func:`run_host_launcher`).
    """
    ctx = context.get_context()
    stop = context.stop_event()
    work = tempfile.mkdtemp(prefix=f"tlaunch-{mode}-{ctx.run_id}-")
    try:
        env = launcher_env(env_file, ctx.address, work, hosts[index])
        argv = launcher(ctx, env, work)
        run_host_launcher(collector, index, hosts[index], argv, env, work, stop)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def rank_entry(run_id: str, command: Sequence[str]) -> list[str]:
    """The module and arguments a per-host launcher starts each rank with: :mod:`tlaunch.torch.record`
    (which reports the rank's exception) running ``command``, with the run id on its command line
    (tlaunch's leftover checks find the rank by it)."""
    return ["tlaunch.torch.record", run_id, *command]


def launcher_env(env_file: str | None, address: str, work: str, host: str) -> dict[str, str]:
    """The environment of a host's launcher (torch's agent, DeepSpeed's per-node launcher).

    This process's, the job's ``env_file`` sourced on the host, the socket
    interface of ``address``, unbuffered output, and where ranks leave their
    reports (``work/reports``).
    """
    env = dict(os.environ)
    if env_file:
        env.update(source_env_file(env_file))
    env.update(socket_env(address, env))
    env.update(PYTHONUNBUFFERED="1", TLAUNCH_TORCH_REPORTS=os.path.join(work, "reports"), TLAUNCH_HOST=host)
    return env


def run_host_launcher(
    collector: Any,
    index: int,
    host: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    work: str,
    stop: threading.Event,
    grace: float = 2.0,
) -> None:
    """Run ``argv`` (a per-host launcher) until it exits or the program stops; report how it ended.

    ``env`` must point ``TLAUNCH_TORCH_REPORTS`` at ``<work>/reports``.
    """
    child = Child(argv, env, "agent", relay=False, death_signal=signal.SIGTERM)
    try:
        reports = Reports(os.path.join(work, "reports"))
        while (code := child.poll()) is None and not stop.is_set():
            reports.push(collector, index)
            time.sleep(0.05)
        if code is None:  # the program stops: the launcher ends its ranks on SIGTERM
            child.signal(signal.SIGTERM)
            with contextlib.suppress(Exception):
                child.proc.wait(grace)
            return
        reports.push(collector, index)
        if code == 0:
            tell(functools.partial(collector.finished, index, HostOutcome(exit_code=0)), stop)
        else:  # the host's launcher gave up (restarts used up, a rank failed): the job has failed
            tell(functools.partial(collector.failed, index, [WorkerFailure(host, time.time(), code)]), stop)
        stop.wait()
    finally:
        kill_all([child], grace=0.5)
