"""torchrun mode: torch's own elastic agent on every host, started and ended from one command.

::

    tlaunch torchrun --hosts h1,h2,h3 --nnodes 2:3 --nproc-per-node 2 --max-restarts 3 train.py --lr 0.1

Each host's agent node runs torch's elastic agent (``torch.distributed.run``,
through :mod:`tlaunch.torch.elastic`) with a c10d
rendezvous hosted by the head host's torch agent (``is_host`` set explicitly,
its port free there, every agent's ``--local-addr`` the address the other
hosts reach it at), so fault tolerance and elasticity are torch's own. tlaunch
adds: one command for every host, each rank's lines as ``[host rank]`` and in
``<log dir>/<run id>/<host>[<local_rank>].log``, the failing rank's own
traceback without ``@record`` (every rank starts through
:mod:`tlaunch.torch.record`), and teardown of every host when the job ends,
fails or is interrupted.

Restart budget: as in torch, ``max_restarts`` is each host agent's own budget.
A worker failure anywhere, or a host joining or leaving, restarts the workers
of every host and counts one restart on each; a host whose agent has used its
budget fails the job.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tlaunch.backends.slurm.options import SlurmOptions
from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.context import NodeContext
from tlaunch.errors import LaunchError
from tlaunch.torch.agent import free_port
from tlaunch.torch.env import DEFAULT_ENV_VARS, copied_env
from tlaunch.torch.errors import JobFailedError
from tlaunch.torch.hostjob import launcher_agent, rank_entry
from tlaunch.torch.job import start_job
from tlaunch.torch.logs import default_log_dir
from tlaunch.torch.outcomes import UNREADABLE_REPORT, JobOutcome, RankError
from tlaunch.torch.placement import HostOptions, Placement, resolve_hostnames

__all__ = ["JobResult", "TorchrunSpec", "parse_nnodes", "torchrun", "torchrun_agent"]

_PREFIX = "[w${local_rank}|${rank}] "


@dataclass(frozen=True)
class TorchrunSpec:
    """What each host's torchrun agent gets."""

    hosts: list[str]
    nnodes: str
    nproc_per_node: str
    max_restarts: int
    command: list[str]
    """The script and its arguments (or ``-m module ...``)."""
    timeout: float = 600.0
    rdzv_port: int | None = None
    last_call_timeout: float = 3.0
    monitor_interval: float = 0.5
    torchrun_args: list[str] = field(default_factory=list)
    env_file: str | None = None


@dataclass
class JobResult:
    """How a torchrun, deepspeed or basic job ended (successfully).

    Attributes:
        run_id: the run's id.
        log_dir: the folder of its logs.
        exit_codes: each host's exit code (hosts lost on the way are absent).
        lost_hosts: hosts whose agent ended without reporting (elastic jobs go on without them).
    """

    run_id: str
    log_dir: str
    exit_codes: dict[str, int]
    lost_hosts: list[str]


def parse_nnodes(nnodes: str | int | None, n_hosts: int) -> tuple[int, int]:
    """``nnodes`` (``N`` or ``MIN:MAX``; None: every host) as (min, max), checked against the hosts.

    Raises:
        LaunchError: not a number or range, min > max, or a range the hosts cannot meet.
    """
    if nnodes is None:
        return n_hosts, n_hosts
    text = str(nnodes)
    lo, _, hi = text.partition(":")
    try:
        low, high = int(lo), int(hi or lo)
    except ValueError:
        raise LaunchError(f"nnodes={nnodes!r} is not N or MIN:MAX (e.g. '2' or '2:4')") from None
    if low < 1 or high < low:
        raise LaunchError(f"nnodes={nnodes!r}: need 1 <= MIN <= MAX")
    if low > n_hosts:
        raise LaunchError(f"nnodes={nnodes!r} needs at least {low} hosts, but {n_hosts} were given")
    if high < n_hosts:
        raise LaunchError(
            f"nnodes={nnodes!r} allows at most {high} nodes, but {n_hosts} hosts were given; "
            f"give at most {high} hosts or raise MAX"
        )
    return low, high


def torchrun_agent(collector: Any, index: int, spec: TorchrunSpec) -> None:
    """Run torch's elastic agent on host ``index`` (the body of its agent node)."""

    def elastic(ctx: NodeContext, env: dict[str, str], work: str) -> list[str]:
        if index == 0:
            collector.publish("endpoint", f"{ctx.address}:{spec.rdzv_port or free_port()}")
        endpoint = collector.lookup("endpoint", spec.timeout)
        # torch shares the rendezvous store with the workers across restarts, without a
        # prefix per attempt: restarted ranks read the last attempt's addresses and fail
        # to connect. A store of their own per attempt (hosted by rank 0) has no stale keys.
        env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = _PREFIX
        conf = f"is_host={'1' if index == 0 else '0'},last_call_timeout={spec.last_call_timeout:g},"
        conf += f"join_timeout={spec.timeout:g}"
        return [
            sys.executable,
            "-m",
            "tlaunch.torch.elastic",  # torch.distributed.run, and a report of a rank that just exits
            f"--nnodes={spec.nnodes}",
            f"--nproc-per-node={spec.nproc_per_node}",
            f"--max-restarts={spec.max_restarts}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={ctx.run_id}",
            f"--rdzv-conf={conf}",
            f"--local-addr={ctx.address}",
            f"--monitor-interval={spec.monitor_interval:g}",
            f"--log-dir={os.path.join(work, 'logs')}",
            "--tee=3",
            *spec.torchrun_args,
            "-m",
            *rank_entry(ctx.run_id, spec.command),
        ]

    launcher_agent(collector, index, "torchrun", spec.hosts, spec.env_file, elastic)


def torchrun(
    command: Sequence[str],
    hostnames: Sequence[str] | str = "auto",
    nnodes: str | int | None = None,
    nproc_per_node: int | str = 1,
    max_restarts: int = 0,
    *,
    ssh_config_file: str | None = None,
    working_dir: str | Literal[False] | None = None,
    default_env_vars: Sequence[str] = DEFAULT_ENV_VARS,
    extra_env_vars: Sequence[str] = (),
    env: dict[str, str] | None = None,
    env_file: str | None = None,
    log_dir: str | None = None,
    echo_ranks: Sequence[int] | None = (0,),
    host_restarts: int = 0,
    rdzv_port: int | None = None,
    last_call_timeout: float = 3.0,
    timeout: float = 600.0,
    torchrun_args: Sequence[str] = (),
    ssh: SSHOptions | None = None,
    slurm: SlurmOptions | None = None,
    run_id: str | None = None,
    debug: str | None = None,
) -> JobResult:
    """Run ``command`` (a script and its arguments, or ``["-m", module, ...]``) with torchrun on every host.

    Args:
        command: what each rank runs.
        hostnames: the hosts (see :func:`tlaunch.torch.launch`); the first hosts the rendezvous.
        nnodes: ``N`` or ``MIN:MAX`` (elastic); default: every host.
        nproc_per_node: workers per host (an int, or torchrun's ``gpu``, ``cpu``, ``auto``).
        max_restarts: torch's restart budget, per host (see the module docstring).
        ssh_config_file, working_dir: as for SSH launches; remote hosts get the
            script's folder as the working dir unless one is given (``False``:
            a shared filesystem, nothing shipped, the script's path on every host).
        default_env_vars, extra_env_vars, env, env_file: the workers' environment
            (see :mod:`tlaunch.torch.env`).
        log_dir, echo_ranks: see :func:`tlaunch.torch.launch`.
        host_restarts: how often tlaunch restarts a host's torch agent that died;
            a restarted agent joins the job at its next rendezvous.
        rdzv_port: the rendezvous port on the head host (default: one free there).
        last_call_timeout: seconds a rendezvous waits for more nodes once it has ``MIN``.
        timeout: seconds to wait for the rendezvous to complete.
        torchrun_args: more arguments for ``torch.distributed.run``.
        ssh: options of SSH hosts (``python``, ``setup``, ``accept_unknown_hosts``...).
        slurm: options of the allocation's steps, when the hosts are its nodes.
        run_id: the run's id (default: made from the job's name); a job's launcher that
            recorded the run before it started (building its runtime environment) gives its.
        debug: ``"post-mortem"``: a rank that raises waits at its frames for ``tlaunch debug``
            before the job ends (default: ``$TLAUNCH_DEBUG``; ``breakpoint()`` needs none).

    Returns:
        A :class:`JobResult`.

    Raises:
        JobFailedError: the job failed; names the failing rank and host, with its traceback.
        AgentFailedError: the head host was lost (the rendezvous lives there).
        LaunchError: bad arguments, before anything starts.
    """
    cmd = list(command)
    if not cmd:
        raise LaunchError("torchrun needs a script to run, e.g. ['train.py', '--lr', '0.1']")
    hosts = resolve_hostnames(hostnames)
    low, high = parse_nnodes(nnodes, len(hosts))
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise LaunchError(f"max_restarts={max_restarts!r} must be an int >= 0")
    if not (isinstance(nproc_per_node, int) and nproc_per_node > 0) and nproc_per_node not in (
        "gpu",
        "cpu",
        "auto",
    ):
        raise LaunchError(f"nproc_per_node={nproc_per_node!r} must be an int >= 1, 'gpu', 'cpu' or 'auto'")
    env_vars = copied_env([*default_env_vars, *extra_env_vars], env)
    cmd, options = place_script(cmd, hosts, HostOptions.given(ssh, slurm, ssh_config_file, working_dir))
    spec = TorchrunSpec(
        hosts,
        f"{low}:{high}" if low != high else str(low),
        str(nproc_per_node),
        max_restarts,
        cmd,
        timeout=timeout,
        rdzv_port=rdzv_port,
        last_call_timeout=last_call_timeout,
        torchrun_args=list(torchrun_args),
        env_file=env_file,
    )
    elastic = low < high or host_restarts > 0  # an agent that ends without reporting: a host lost
    job = start_job(
        job_name("torchrun", cmd),
        hosts,
        torchrun_agent,
        lambda i: (spec,),
        log_dir=log_dir or default_log_dir(),
        echo_ranks=echo_ranks,
        rank_of=lambda host, lr: None,
        agent_restarts=host_restarts,
        tolerate_lost=elastic,
        host_options=options,
        env=env_vars,
        run_id=run_id,
        debug=debug,
    )
    return job.end_with(
        lambda o: finish(o, hosts, job.run_id, job.logs.dir, "torchrun"), tolerate_lost=elastic
    )


def job_name(mode: str, cmd: Sequence[str]) -> str:
    """``torchrun-train.py``: the mode and the script (or module) a job runs."""
    return f"{mode}-{os.path.basename(cmd[1] if cmd[0] == '-m' else cmd[0])}"


def place_script(cmd: list[str], hosts: list[str], options: HostOptions) -> tuple[list[str], HostOptions]:
    """The command as the hosts run it, and the options that get its script there.

    SSH hosts get the script's folder as working dir (unless one is given) and
    its basename; the nodes of a SLURM allocation share the launcher's
    filesystem: they get the script's path. So do SSH hosts on a shared
    filesystem (``working_dir=False``: nothing is shipped; every host must see
    the script, which preflight checks).
    """
    if options.shares_filesystem:
        if cmd[0] == "-m" or not os.path.isfile(cmd[0]):
            return cmd, options
        placed = [os.path.abspath(cmd[0]), *cmd[1:]]
        return placed, options.with_shared_path(placed[0])
    if options.ssh is not None and options.ssh.working_dir is not None:
        return cmd, options
    where = options.placement(hosts)
    if where is Placement.LOCAL or cmd[0] == "-m" or not os.path.isfile(cmd[0]):
        return cmd, options
    if where is Placement.ALLOCATION:
        return [os.path.abspath(cmd[0]), *cmd[1:]], options
    folder = os.path.dirname(os.path.abspath(cmd[0]))
    return [os.path.basename(cmd[0]), *cmd[1:]], options.with_working_dir(folder)


def finish(outcome: JobOutcome, hosts: list[str], run_id: str, log_dir: str, what: str) -> JobResult:
    """The :class:`JobResult` of a job's outcome, or the root cause's :class:`JobFailedError`.

    The root cause is the job's first error: torch restarts every rank after a
    failure, and later attempts often fail because of it (or out of step); the
    last attempt's first error is named too when it differs. A rank that
    exited without a traceback to show (``os._exit``, a signal, ``sys.exit``)
    comes with the last lines of its output.

    Raises:
        JobFailedError: the job failed.
    """
    lost = sorted(outcome.lost.values())
    if lost:
        sys.stderr.write(f"tlaunch.torch: {what} went on without hosts {lost} (lost during the job)\n")
    codes = outcome.exit_codes(hosts)
    failure = outcome.failure
    if failure is None and codes and all(c == 0 for c in codes.values()):
        return JobResult(run_id, log_dir, codes, lost)
    errors = sorted(with_exits(outcome.errors), key=lambda e: e.time)
    if errors:
        root = errors[0]  # later attempts often fail because of it (peers gone, restarts out of step)
        last = max(e.restart for e in errors)
        reason = _said(root)
        if last:
            final = next(e for e in errors if e.restart == last)
            reason += f" ({what} gave up after {last} restarts"
            if (final.type, final.message, final.exit_code) != (root.type, root.message, root.exit_code):
                reason += f"; the last attempt ended with {_said(final, short=True)} on rank {final.rank}"
            reason += ")"
        unread = [e for e in errors if e.type == UNREADABLE_REPORT and e is not root]
        if unread:  # named, whatever the root cause: something wrote where ranks report
            reason += f"; {_said(unread[0])}"
        code = root.exit_code if root.exit_code is not None else failure.exit_code if failure else None
        shown = root.traceback if root.raised and not (root.output and root.type == "SystemExit") else ""
        error = JobFailedError(root.host or hosts[0], root.rank, code, shown or None, reason, root.output)
    elif failure is not None:
        code = failure.exit_code
        error = JobFailedError(
            failure.host, None, code, None, f"{what} exited with code {code}; see {log_dir}"
        )
    else:
        error = JobFailedError(hosts[0], None, None, None, f"no host finished the {what} job; see {log_dir}")
    sys.stderr.write(f"tlaunch.torch: {what} failed: {error}\n")
    raise error


def with_exits(errors: Sequence[RankError]) -> list[RankError]:
    """The ranks' errors, each exit report (:mod:`tlaunch.torch.elastic`) of a rank that also reported
    raising (``SystemExit``) folded into that report as its output, the others kept as they are."""
    exits = {(e.host, e.rank, e.restart): e for e in errors if not e.raised}
    out = []
    for error in errors:
        gone = exits.pop((error.host, error.rank, error.restart), None) if error.raised else None
        out.append(
            error
            if gone is None
            else dataclasses.replace(error, exit_code=gone.exit_code, output=gone.output)
        )
    return [e for e in out if e.raised or (e.host, e.rank, e.restart) in exits]


def _said(error: RankError, short: bool = False) -> str:
    """What ``error`` was, in words: ``ValueError: bad``, or how its rank exited."""
    if error.raised:
        return error.type if short else f"{error.type}: {error.message}"
    code = error.exit_code
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}" if short else f"exited with code {code} without raising"
