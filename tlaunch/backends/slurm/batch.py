"""Submitting a program as a SLURM batch job (``launch(..., launch_type="slurm", submit=True)``).

The batch script is written to the run's directory (``job.sbatch``, kept with
the run) and read by a person as easily as by ``sbatch``: the ``#SBATCH``
lines of the resources asked for, then one command that runs the program with
``launch_type="slurm"`` inside the allocation: ``python -m ENTRY RUN_DIR``,
the launcher's batch entry, which the launcher names (``tlaunch.launcher``).
The program travels inside the script, cloudpickled and base64-encoded after
the command (the user's own modules by value), so the first node needs no file
of the submitting machine; the run's keys are made inside the job.

SLURM writes the job's output (every node's lines, with their ``[label/i]``
prefix, and the failure report) to ``slurm-<job id>.out`` in the run's
directory, and the job writes ``result.json`` there as it ends: the submitting
machine reads both when that directory is on a filesystem the nodes share, as
home directories on clusters are (else set ``TLAUNCH_HOME`` to a shared
folder). :class:`~tlaunch.backends.slurm.job.SlurmJob` is the handle: id, state, wait, logs, stop.
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import time
from collections.abc import Mapping, Sequence

from tlaunch.backends.slurm.commands import (
    hostnames,
    job_state,
    missing_tools,
    partitions,
    run_slurm,
)
from tlaunch.backends.slurm.job import SlurmJob
from tlaunch.backends.slurm.options import SlurmOptions, job_name_of
from tlaunch.errors import LaunchError
from tlaunch.runtime.records import RunRecord, write_private, write_record

__all__ = ["batch_script", "check_resources", "command_script", "submit"]

_END = "TLAUNCH_PROGRAM_END"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _sbatch_lines(opts: SlurmOptions, program_name: str, output: str) -> list[str]:
    """The ``#SBATCH`` lines of ``opts``, checked here whatever path built them (dry runs too).

    Raises:
        LaunchError: an option that is not a valid SLURM value, or would not stay on its line.
    """
    opts.check()
    pairs: list[tuple[str, object]] = [
        ("job-name", opts.job_name or job_name_of(program_name)),
        ("nodes", opts.nodes or 1),
        ("ntasks-per-node", opts.ntasks_per_node),
        ("cpus-per-task", opts.cpus_per_task),
        ("mem", opts.mem),
        ("gpus-per-node", opts.gpus_per_node),
        ("partition", opts.partition),
        ("account", opts.account),
        ("qos", opts.qos),
        ("time", opts.time),
        ("nodelist", opts.nodelist),
        ("output", output),
    ]
    lines = [f"#SBATCH --{name}={value}" for name, value in pairs if value is not None]
    lines += [f"#SBATCH {arg}" for arg in opts.sbatch_args]
    return lines


def batch_script(
    opts: SlurmOptions, program_name: str, run_id: str, run_dir: str, payload: bytes, entry: str
) -> str:
    """The batch script that runs the pickled program ``payload`` inside its allocation with ``entry``."""
    output = os.path.join(run_dir, "slurm-%j.out")
    encoded = base64.encodebytes(payload).decode()
    return "\n".join(
        [
            "#!/bin/bash",
            f"# tlaunch run {run_id}: program {program_name!r}, "
            f"submitted {time.strftime('%Y-%m-%d %H:%M:%S')}",
            *_sbatch_lines(opts, program_name, output),
            "#",
            "# The program runs with launch_type='slurm': each node is a step (srun) of this job.",
            "# It is cloudpickled below the command; the run's keys are made inside the job.",
            f"exec {shlex.quote(opts.interpreter)} -m {shlex.quote(entry)} {shlex.quote(run_dir)} <<'{_END}'",
            encoded.rstrip("\n"),
            _END,
            "",
        ]
    )


def command_script(
    opts: SlurmOptions,
    name: str,
    run_id: str,
    run_dir: str,
    argv: list[str],
    env: Mapping[str, str] | None = None,
    steps: Sequence[Sequence[str]] = (),
) -> str:
    """A batch script that runs ``argv`` (a ``tlaunch`` command) in its allocation.

    ``env`` is exported by the script (mode 0600), never put on a command line:
    the job's steps inherit it (``sbatch``'s ``--export=ALL``). ``steps`` run
    first, in order (a runtime environment's build); the job ends with the
    exit code of the first that fails.

    Raises:
        LaunchError: a bad option (see :func:`_sbatch_lines`) or environment variable name.
    """
    output = os.path.join(run_dir, "slurm-%j.out")
    bad = [key for key in (env or {}) if not _ENV_NAME.match(key)]
    if bad:
        raise LaunchError(f"environment variable names {bad} are not valid; use letters, digits and _")
    exports = [f"export {key}={shlex.quote(value)}" for key, value in sorted((env or {}).items())]
    return "\n".join(
        [
            "#!/bin/bash",
            f"# tlaunch run {run_id}: job {name!r}, submitted {time.strftime('%Y-%m-%d %H:%M:%S')}",
            *_sbatch_lines(opts, name, output),
            "#",
            "# The command runs inside the allocation: its nodes are the job's hosts (srun steps).",
            f"export TLAUNCH_HOME={shlex.quote(os.path.join(run_dir, 'batch'))}",
            *exports,
            *(f"{shlex.join(step)} || exit $?" for step in steps),
            f"exec {shlex.join(argv)}",
            "",
        ]
    )


def check_resources(opts: SlurmOptions, env: Mapping[str, str] | None = None) -> None:
    """Refuse, before anything is submitted, what SLURM would refuse or never run.

    Raises:
        LaunchError: SLURM's commands are missing, the partition does not exist or is
            down, it has fewer nodes than asked, or the node list is unreadable or
            names nodes outside the partition.
    """
    missing = missing_tools(("sbatch", "scontrol", "squeue", "scancel"), env)
    if missing:
        raise LaunchError(
            f"submit=True needs SLURM's commands, and {', '.join(missing)} is not on PATH; "
            "submit from a machine of the cluster with slurm-client installed (a login node)"
        )
    parts = partitions(env)
    if opts.partition is not None:
        if opts.partition not in parts:
            raise LaunchError(
                f"partition={opts.partition!r} does not exist on this cluster; its partitions are "
                f"{sorted(parts)} (sinfo lists them)"
            )
        part = parts[opts.partition]
    else:
        defaults = [p for p in parts.values() if p.default]
        if not defaults:
            raise LaunchError(
                f"this cluster has no default partition: pass partition= (one of {sorted(parts)})"
            )
        part = defaults[0]
    if part.state != "UP":
        raise LaunchError(f"partition {part.name!r} is {part.state}; pick another of {sorted(parts)}")
    wanted = opts.nodes or 1
    most = min(len(part.nodes), part.max_nodes or len(part.nodes))
    if wanted > most:
        raise LaunchError(
            f"nodes={wanted} is more than partition {part.name!r} can give ({most} nodes: "
            f"{', '.join(part.nodes)}); ask for at most {most}, or another partition"
        )
    if opts.nodelist is not None:
        named = hostnames(opts.nodelist, env)
        outside = [n for n in named if n not in part.nodes]
        if outside:
            raise LaunchError(
                f"nodelist={opts.nodelist!r} names {outside}, which are not nodes of partition "
                f"{part.name!r} ({', '.join(part.nodes)})"
            )
        if len(named) > wanted:
            raise LaunchError(
                f"nodelist={opts.nodelist!r} names {len(named)} nodes but nodes={wanted}; make them agree"
            )


def submit(
    opts: SlurmOptions,
    program_name: str,
    run_id: str,
    run_dir: str,
    payload: bytes | None,
    env: Mapping[str, str] | None = None,
    command: list[str] | None = None,
    command_env: Mapping[str, str] | None = None,
    command_steps: Sequence[Sequence[str]] = (),
    entry: str | None = None,
) -> SlurmJob:
    """Check the resources, write the batch script into ``run_dir``, ``sbatch`` it; the job's handle.

    The script runs the pickled program ``payload`` with ``python -m ENTRY`` (``entry``), or
    ``command`` when given (with ``command_env`` exported by the script, after ``command_steps``).
    ``env`` is the environment of SLURM's commands here.

    Raises:
        LaunchError: a resource SLURM cannot give, or ``sbatch`` refused the job
            (nothing was submitted).
    """
    check_resources(opts, env)
    script = os.path.join(run_dir, "job.sbatch")
    if command is not None:
        text = command_script(opts, program_name, run_id, run_dir, command, command_env, command_steps)
    else:
        assert payload is not None and entry is not None
        text = batch_script(opts, program_name, run_id, run_dir, payload, entry)
    write_private(script, text.encode())
    out = run_slurm(["sbatch", "--parsable", script], env, timeout=60)
    job_id = out.strip().split(";")[0]
    if not job_id.isdigit():
        raise LaunchError(f"sbatch answered {out.strip()!r}, not a job id")
    # SLURM reuses job ids: the name and submit time tell this job from a later one of the same id.
    name = opts.job_name or job_name_of(program_name)
    submitted = job_state(job_id, env).submitted
    refs = {"job_name": name, **({"submitted": submitted} if submitted else {})}
    record = RunRecord(
        run_id,
        program_name,
        "slurm",
        coordinator="",
        launcher_pid=None,
        hosts=[],
        log_dir=run_dir,
        detached=True,
        slurm_job=job_id,
        refs=refs,
    )
    write_record(run_dir, record)
    return SlurmJob(job_id, run_id, run_dir, env, name, submitted)
