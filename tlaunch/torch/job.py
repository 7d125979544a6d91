"""A torch job as a program: a collector on the head host and one agent node per host.

Every mode (function launch, torchrun, deepspeed, basic) is this program with
its own agent function, launched with :func:`tlaunch.launch` on whatever
backend the hosts call for (this machine: ``local_mp``; other hosts: ``ssh``).
No backend knows about torch. The launcher long-polls the collector for the
job's outcome, watches the run for agents that die, and tears everything down
before it returns or raises.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tlaunch.errors import RPCError
from tlaunch.launcher import launch
from tlaunch.nodes.courier import CourierNode
from tlaunch.nodes.python import PyNode
from tlaunch.options import LaunchOptions
from tlaunch.program import Program
from tlaunch.run import Run
from tlaunch.runtime.states import TERMINAL_STATES
from tlaunch.torch.collector import Collector
from tlaunch.torch.errors import AgentFailedError, failure_report
from tlaunch.torch.logs import JobLogs
from tlaunch.torch.outcomes import JobOutcome
from tlaunch.torch.placement import HostOptions, Placement

__all__ = ["Job", "PendingSink", "start_job"]

T = TypeVar("T")
_AGENT = "agent"
_LOST_AFTER = 30.0  # seconds the run gets to notice a lost head host (its heartbeat timeout is 10 s)


@dataclass
class Job:
    """A started torch job: its run, the launcher's client of its collector, its logs."""

    run: Run
    collector: Any
    logs: JobLogs
    hosts: list[str]

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.run.run_id

    def agents_ended(self) -> dict[int, dict[str, Any]]:
        """The agents whose node has ended (done, failed or stopped), by index, with their records."""
        out = {}
        for key, rec in self.run.status().items():
            label, _, idx = key.rpartition("/")
            if label == _AGENT and rec.get("state") in TERMINAL_STATES:
                out[int(idx)] = rec
        return out

    def outcome(self, tolerate_lost: bool = False) -> JobOutcome:
        """Wait for the job's outcome (see :meth:`Collector.wait`).

        Args:
            tolerate_lost: an agent that ends without reporting (its host lost)
                is noted (the outcome's ``lost``), not an error: elastic jobs.

        Raises:
            AgentFailedError: an agent died (its host lost, its process killed)
                before it reported (unless tolerated), or the run stopped.
        """
        while True:
            ended = self.agents_ended() if tolerate_lost else {}
            res: JobOutcome | None
            try:
                res = self.collector.wait(0.5, sorted(ended))
            except (RPCError, OSError, EOFError) as exc:  # the collector's host is lost, or the run stopped
                deadline = time.monotonic() + _LOST_AFTER
                while not self.run.done and time.monotonic() < deadline:
                    time.sleep(0.2)
                if not self.run.done:
                    raise AgentFailedError(
                        self.hosts[0], f"the job's collector on {self.hosts[0]!r} cannot be reached: {exc}"
                    ) from exc
                res = None
                cause: BaseException | None = exc
            else:
                cause = None
            if res is not None:
                lost = {i: self.hosts[i] for i in sorted(ended) if i not in res.outcomes}
                return dataclasses.replace(res, lost=lost)
            if self.run.done or (not tolerate_lost and self._agent_failed()):
                raise self._agent_error() from cause

    def _agent_failed(self) -> bool:
        return any(rec.get("state") == "failed" for rec in self.agents_ended().values())

    def _agent_error(self) -> AgentFailedError:
        failure = self.run.failure()
        if failure is None:
            return AgentFailedError(self.hosts[0], f"the job's run stopped ({self.run_id}) before it ended")
        label, _, idx = failure.node.rpartition("/")
        host = self.hosts[int(idx)] if label == _AGENT else failure.host
        return AgentFailedError(host, str(failure))

    def close(
        self,
        *,
        kind: str = "requested",
        reason: str = "Run.stop() was called",
        failure: dict[str, Any] | None = None,
    ) -> None:
        """Stop the run and wait until nothing of it is left; close the logs (``kind``, ``failure``:
        see ``Run.stop``)."""
        try:
            self.run.stop(reason=reason, kind=kind, failure=failure)
        finally:
            self.logs.close()

    def end_with(self, result: Callable[[JobOutcome], T], *, tolerate_lost: bool = False) -> T:
        """Wait for the job's outcome (:meth:`outcome`), then ``result(outcome)`` (the job's result), the
        run closed as it says: completed when it returns, failed (the error's first line as the
        reason) when it raises, so that the run's record (``tlaunch ps``, the job server) ends
        SUCCEEDED or FAILED, not STOPPED. No outcome (an agent lost, Ctrl-C): the run is stopped."""
        try:
            outcome = self.outcome(tolerate_lost)
        except BaseException:
            self.close()
            raise
        try:
            value = result(outcome)
        except Exception as exc:
            said = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            # The root cause (a rank) goes in the run's end record with the end itself: a reader
            # (the job server) never sees the run FAILED without it.
            self.close(kind="failed", reason=said, failure=failure_report(exc))
            raise
        except BaseException:
            self.close()
            raise
        self.close(kind="completed", reason="the job ended: every rank finished")
        return value


def start_job(
    name: str,
    hosts: list[str],
    agent: Callable[..., Any],
    agent_args: Callable[[int], tuple[Any, ...]],
    *,
    log_dir: str,
    echo_ranks: Sequence[int] | None,
    rank_of: Callable[[str, int], int | None],
    handlers: Sequence[Any] = (),
    agent_restarts: int = 0,
    tolerate_lost: bool = False,
    host_options: HostOptions | None = None,
    env: Mapping[str, str] | None = None,
    run_id: str | None = None,
    debug: str | None = None,
) -> Job:
    """Launch the job's program (collector + an agent per host) and return it running.

    Args:
        name: the program's name.
        hosts: the job's hosts; the first is the head (collector, master address).
        agent: the agent function, called as ``agent(collector, index, *agent_args(index))``.
        agent_args: the rest of each agent's arguments.
        log_dir, echo_ranks, rank_of, handlers: see :class:`JobLogs`.
        agent_restarts: how often tlaunch restarts a host's agent that dies
            (elastic jobs: a restarted agent joins at the next rendezvous).
        tolerate_lost: an agent that fails does not stop the others (elastic jobs).
        host_options: how the hosts are reached (:class:`HostOptions`).
        env: the environment of every agent (and so of every worker).
        run_id: the run's id (default: made from ``name``).
        debug: ``"post-mortem"``: a rank that raises waits at its exception for ``tlaunch debug``
            (see :class:`~tlaunch.options.LaunchOptions`; default: ``$TLAUNCH_DEBUG``).

    Raises:
        LaunchError: bad options, or a launch that could not start (nothing is left running).
    """
    options = host_options or HostOptions()
    where = options.placement(hosts)
    placed = options.placed(hosts)
    sink = PendingSink()
    common = LaunchOptions(
        stop_grace=3.0,
        env=dict(env or {}),
        max_restarts={_AGENT: agent_restarts} if agent_restarts else 0,
        on_failure="continue" if tolerate_lost else "stop",
        output=sink,
        debug=debug,
    )
    program = Program(name)
    collector_node: CourierNode[Any, Any] = CourierNode(Collector, len(hosts))
    if where is not Placement.LOCAL:
        collector_node.to_host(hosts[0])
    collector = program.add_node(collector_node, label="collector")
    with program.group(_AGENT):
        for i, host in enumerate(hosts):
            node = PyNode(agent, collector, i, *agent_args(i))
            if where is not Placement.LOCAL:
                node.to_host(host)
            program.add_node(node)
    prefix_hosts = {f"{_AGENT}/{i}": h for i, h in enumerate(hosts)}

    def host_of(prefix: str) -> str | None:
        return prefix_hosts.get(prefix.rsplit(" ", 1)[-1])

    terminal = "ssh_tmux_session" if where is Placement.SSH else None
    run = launch(program, placed.launch_type, terminal=terminal, wait=False, options=common,
                 backend_options=placed.backend_options, run_id=run_id)  # fmt: skip
    try:
        logs = JobLogs(log_dir, run.run_id, host_of, rank_of, echo_ranks, handlers=list(handlers))
        sink.attach(logs)
        client = collector.dereference()
    except BaseException:
        run.stop()
        raise
    return Job(run, client, logs, hosts)


class PendingSink:
    """Keeps the lines that arrive before the job's logs exist (they need the run id), then forwards."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[tuple[str, str]] = []
        self._logs: JobLogs | None = None

    def attach(self, logs: JobLogs) -> None:
        """Hand the lines kept so far to ``logs``, and every later line."""
        with self._lock:
            self._logs = logs
            pending, self._pending = self._pending, []
            for prefix, text in pending:
                logs.line(prefix, text)

    def line(self, prefix: str, text: str) -> None:
        """Forward one line of output (the :class:`~tlaunch.backends.base.OutputSink` protocol)."""
        logs = self._logs
        if logs is None:
            with self._lock:
                if self._logs is None:
                    self._pending.append((prefix, text))
                    return
                logs = self._logs
        logs.line(prefix, text)
