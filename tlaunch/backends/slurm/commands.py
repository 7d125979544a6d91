"""SLURM's own commands, as the backend uses them: ``scontrol``, ``sinfo``, ``squeue``, ``scancel``.

Every query goes through the real client tools (they read ``SLURM_CONF`` and
talk to the controller); a failure is a :class:`~tlaunch.errors.LaunchError`
that names the command and what SLURM said.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, overload

from tlaunch.errors import LaunchError
from tlaunch.nodelist import expand_nodelist

__all__ = [
    "JobState",
    "Partition",
    "TERMINAL",
    "ask_job_and_nodes",
    "hostnames",
    "job_and_nodes",
    "job_state",
    "missing_tools",
    "node_info",
    "node_infos",
    "partitions",
    "run_slurm",
    "scontrol_show",
]

_FIELD = re.compile(r"(?:^|\s)([A-Za-z][\w:/.]*)=(.*?)(?=\s[A-Za-z][\w:/.]*=|$)")

TERMINAL = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
    }
)
"""Job states after which a job never runs again."""


def missing_tools(tools: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """The SLURM commands of ``tools`` that are not on PATH."""
    path = (env or os.environ).get("PATH")
    return [t for t in tools if shutil.which(t, path=path) is None]


@overload
def run_slurm(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    stdin: str | None = None,
    check: Literal[True] = True,
) -> str: ...


@overload
def run_slurm(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    stdin: str | None = None,
    *,
    check: Literal[False],
) -> subprocess.CompletedProcess[str]: ...


def run_slurm(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    stdin: str | None = None,
    check: bool = True,
) -> str | subprocess.CompletedProcess[str]:
    """Run a SLURM client command (``stdin``: its input); its stdout, or with ``check=False``
    the whole answer, whatever its exit code.

    Raises:
        LaunchError: the command is missing, timed out, or (``check``) failed, with SLURM's message.
    """
    try:
        out = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            env=None if env is None else dict(env),
            timeout=timeout,
            check=False,
            input=stdin,
        )
    except FileNotFoundError:
        raise _not_on_path(argv) from None
    except subprocess.TimeoutExpired:
        raise _no_answer(argv, timeout) from None
    if not check:
        return out
    if out.returncode != 0:
        said = (out.stderr or out.stdout).strip() or f"exit code {out.returncode}"
        raise LaunchError(f"`{' '.join(argv)}` failed: {said}")
    return out.stdout


def _not_on_path(argv: Sequence[str]) -> LaunchError:
    return LaunchError(
        f"{argv[0]} is not on PATH: the SLURM backend needs SLURM's client commands "
        "(on Debian: apt-get install slurm-client); run where `srun --version` works"
    )


def _no_answer(argv: Sequence[str], timeout: float) -> LaunchError:
    return LaunchError(f"`{' '.join(argv)}` did not answer within {timeout:.0f} s (is slurmctld up?)")


def scontrol_show(
    kind: str, name: str | None = None, env: Mapping[str, str] | None = None
) -> list[dict[str, str]]:
    """``scontrol show -o KIND [NAME]``, each record as a dict of its ``Key=Value`` fields."""
    out = run_slurm(["scontrol", "show", "-o", kind, *([name] if name else [])], env)
    return [dict(_FIELD.findall(line)) for line in out.splitlines() if "=" in line]


def hostnames(nodelist: str, env: Mapping[str, str] | None = None) -> list[str]:
    """The node names of a SLURM node list (``th[1-3,5]``), expanded as ``scontrol show hostnames`` does.

    Expanded here (:func:`~tlaunch.nodelist.expand_nodelist`, which the SLURM
    tests hold to ``scontrol``'s answer for every form): a launch in an
    allocation must not wait for a client command to read its own node list.

    Raises:
        LaunchError: SLURM cannot parse it (the message shows the forms it takes).
    """
    del env  # kept for the callers that pass SLURM's environment: nothing is asked of SLURM
    try:
        names = expand_nodelist(nodelist)
    except LaunchError as exc:
        raise LaunchError(
            f"node list {nodelist!r} is not one SLURM can read ({exc}); write names and ranges as "
            "SLURM does: 'n1,n2', 'n[1-3,5]', 'gpu[01-02],cpu7'"
        ) from None
    if not names:
        raise LaunchError(f"node list {nodelist!r} names no node; write e.g. 'n[1-3]'")
    return names


def node_info(name: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``scontrol show node NAME`` (``NodeAddr``, ``State``, ``Reason``...)."""
    records = scontrol_show("node", name, env)
    if not records:
        raise LaunchError(f"SLURM knows no node {name!r}")
    return records[0]


def node_infos(names: Sequence[str], env: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """``scontrol show node`` of every node of ``names`` in one call, by ``NodeName``.

    Raises:
        LaunchError: SLURM failed, or knows some node of ``names`` not (named).
    """
    records = scontrol_show("node", ",".join(names), env) if names else []
    found = {rec.get("NodeName", ""): rec for rec in records}
    unknown = [n for n in names if n not in found]
    if unknown:
        raise LaunchError(f"SLURM knows no node {', '.join(map(repr, unknown))}")
    return found


@dataclass(frozen=True)
class Partition:
    """A partition, as ``scontrol show partition`` tells it."""

    name: str
    nodes: tuple[str, ...]
    state: str
    default: bool
    max_nodes: int | None


def partitions(env: Mapping[str, str] | None = None) -> dict[str, Partition]:
    """Every partition, by name."""
    out: dict[str, Partition] = {}
    for rec in scontrol_show("partition", None, env):
        nodelist = rec.get("Nodes", "")
        nodes = tuple(hostnames(nodelist, env)) if nodelist and nodelist != "(null)" else ()
        max_nodes = rec.get("MaxNodes", "UNLIMITED")
        out[rec["PartitionName"]] = Partition(
            rec["PartitionName"],
            nodes,
            rec.get("State", "UP"),
            rec.get("Default") == "YES",
            int(max_nodes) if max_nodes.isdigit() else None,
        )
    return out


@dataclass(frozen=True)
class JobState:
    """Where a SLURM job is.

    Attributes:
        job_id: the job's id.
        state: ``PENDING``, ``RUNNING``, ``COMPLETED``, ``FAILED``, ``CANCELLED``,
            ``TIMEOUT``, ``NODE_FAIL``... (``UNKNOWN`` once the controller forgot it).
        exit_code: the batch script's exit code (``ExitCode=1:0``), when ended.
        signal: the signal that ended it (``ExitCode=0:15``: 15), when one did.
        reason: SLURM's reason (why it is pending, or ``None``).
        nodes: the nodes it runs or ran on.
        name: its ``--job-name``.
        submitted: SLURM's ``SubmitTime`` (``2026-11-24T10:02:03``).
    """

    job_id: str
    state: str
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    nodes: str | None = None
    name: str | None = None
    submitted: str | None = None

    @property
    def ended(self) -> bool:
        """Whether the job has ended for good."""
        return self.state in TERMINAL


_FORGOTTEN = "the controller no longer knows the job (MinJobAge)"


def job_state(job_id: str, env: Mapping[str, str] | None = None) -> JobState:
    """The state of job ``job_id`` (``scontrol show job``; ``UNKNOWN`` when the controller forgot it)."""
    try:
        records = scontrol_show("job", job_id, env)
    except LaunchError as exc:
        if "Invalid job id" in str(exc):
            return JobState(job_id, "UNKNOWN", reason=_FORGOTTEN)
        raise
    return _job_state_of(job_id, records[0] if records else None)


def job_and_nodes(
    job_id: str, names: Sequence[str], env: Mapping[str, str] | None = None
) -> tuple[JobState, dict[str, dict[str, str]]]:
    """:func:`job_state` and :func:`node_infos` asked of one ``scontrol`` (its commands on stdin).

    One process takes ~3 ms of CPU here where two take ~8: a launch asks while its
    steps start, on the same cores.

    Raises:
        LaunchError: SLURM failed, or knows some node of ``names`` not (named).
    """
    return ask_job_and_nodes(job_id, names, env)()


def ask_job_and_nodes(
    job_id: str, names: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 30.0
) -> Callable[[], tuple[JobState, dict[str, dict[str, str]]]]:
    """:func:`job_and_nodes`, its ``scontrol`` started now; the returned function waits for the
    answer (no thread waits meanwhile).

    Raises:
        LaunchError: (either) ``scontrol`` is missing; (the function) as :func:`job_and_nodes`.
    """
    argv = ["scontrol", "--oneliner"]
    said_in, to_it = os.pipe()  # the questions wait in the pipe: a few bytes, never blocking
    try:
        with open(to_it, "wb") as questions:
            questions.write(f"show job {job_id}\nshow node {','.join(names)}\n".encode())
        proc = subprocess.Popen(
            argv,
            stdin=said_in,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=None if env is None else dict(env),
        )
    except FileNotFoundError:
        raise _not_on_path(argv) from None
    finally:
        os.close(said_in)

    def answer() -> tuple[JobState, dict[str, dict[str, str]]]:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise _no_answer(argv, timeout) from None
        return _job_and_nodes_in(job_id, names, subprocess.CompletedProcess(argv, proc.returncode, out, err))

    return answer


def _job_and_nodes_in(
    job_id: str, names: Sequence[str], said: subprocess.CompletedProcess[str]
) -> tuple[JobState, dict[str, dict[str, str]]]:
    records = [dict(_FIELD.findall(line)) for line in said.stdout.splitlines() if line.startswith(_RECORDS)]
    jobs = [r for r in records if "JobId" in r]
    if jobs:
        state = _job_state_of(job_id, jobs[0])
    elif "Invalid job id" in said.stderr:
        state = JobState(job_id, "UNKNOWN", reason=_FORGOTTEN)
    else:
        why = said.stderr.strip() or f"exit code {said.returncode}"
        raise LaunchError(f"`scontrol show job {job_id}` failed: {why}")
    found = {r.get("NodeName", ""): r for r in records if "NodeName" in r}
    unknown = [n for n in names if n not in found]
    if unknown:
        raise LaunchError(f"SLURM knows no node {', '.join(map(repr, unknown))}: {said.stderr.strip()}")
    return state, found


_RECORDS = ("JobId=", "NodeName=")  # how a job's and a node's one-line records begin (not the prompts)


def _job_state_of(job_id: str, rec: Mapping[str, str] | None) -> JobState:
    """A job's state from its ``scontrol show job`` record (None: none came)."""
    if rec is None:
        return JobState(job_id, "UNKNOWN")
    code, _, sig = rec.get("ExitCode", "").partition(":")
    state = rec.get("JobState", "UNKNOWN").split()[0]
    reason = rec.get("Reason")
    return JobState(
        job_id,
        state,
        int(code) if code.isdigit() else None,
        int(sig) if sig.isdigit() and sig != "0" else None,
        None if reason in (None, "None", "(null)") else reason,
        rec.get("NodeList") if rec.get("NodeList") not in (None, "(null)") else None,
        rec.get("JobName"),
        rec.get("SubmitTime"),
    )
