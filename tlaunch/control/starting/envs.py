"""A submitted job's runtime environments, built by its launcher before the run starts.

:func:`tlaunch.control.submit` with a :class:`~tlaunch.runtime.pyenv.RuntimeEnv`
(a package with a ``requirements.txt``) returns as soon as the job's
launcher (:mod:`tlaunch.control.starting.jobmain`) has recorded the run as
*preparing*: the run is ``PENDING`` while each host's environment is built
(:mod:`tlaunch.runtime.pyenv`: once per package and host, under a lock), its
build's output is the log ``runtime-env`` (``runtime-env-<host>`` for SSH
hosts), and a failed build ends the run ``FAILED`` with pip's output as its
root cause. Where each host's environment lives:

- this machine: ``<TLAUNCH_HOME>/envs/``; the launcher builds it itself and
  then runs on in it (it replaces itself with the environment's
  interpreter), so the run's processes are the environment's. A job of a
  server under ``--unix-users`` asks the server's sealed store instead
  (:mod:`.sealedenv`): built as the user, then root's, read-only to every job;
- SSH hosts: ``~/.tlaunch/envs/`` on each; the launcher asks each host over
  SSH, ships the package there only if its environment is not built yet,
  and gives the SSH backend each host's interpreter (its ``python`` option);
- SLURM: the batch script's first step (``srun``, one task per node) builds
  it under the submitting home's ``envs/`` (the cluster's shared filesystem),
  and the job runs with its interpreter (:func:`batch_steps`);
- Kubernetes: each pod builds it before its command, from the package and
  ``pyenv.py`` shipped in the job's run Secret (:func:`pod_package`,
  :mod:`tlaunch.k8s.package`), on the job's ``/TData`` volume when it has one.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import re
import sys
import uuid
from collections.abc import Sequence

from tlaunch.control.starting.sealedenv import prepare_sealed, sealer
from tlaunch.errors import CommandError, LaunchError, SSHError, TLaunchError
from tlaunch.procs import pid_space, process_start
from tlaunch.runtime.envkey import REQUIREMENTS_FILE
from tlaunch.runtime.pyenv import NOT_BUILT, EnvBuildError, RuntimeEnv, ensure, hold
from tlaunch.runtime.records import (
    PREPARING_LOG,
    RunRecord,
    mark_ended,
    private_dirs,
    read_record,
    runs_dir,
    write_private,
    write_record,
)

__all__ = [
    "POD_PACKAGE_LIMIT",
    "REMOTE_ROOT",
    "announce",
    "batch_steps",
    "describe",
    "envs_root",
    "pod_package",
    "prepare_hosts",
    "prepare_here",
    "record_failure",
    "write_requirements",
]

POD_PACKAGE_LIMIT = 700 << 10
"""The largest package a job's run Secret carries, packed (a Secret holds 1 MiB, base64-encoded)."""
REMOTE_ROOT = ".tlaunch/envs"
"""Where SSH hosts keep their environments, relative to the login's home."""
ENV_LOG = PREPARING_LOG


def envs_root(home: str | None = None) -> str:
    """This machine's environments: ``<home>/envs`` (``home``: ``$TLAUNCH_HOME``, else ``~/.tlaunch``)."""
    return os.path.join(os.path.dirname(runs_dir(home)), "envs")


def announce(run_id: str, program: str, hosts: Sequence[str], ssh_config: str | None, doing: str) -> str:
    """Record run ``run_id`` as being prepared by this process (``PENDING``, ``doing`` as its reason).

    Returns:
        The run's directory.
    """
    run_dir = os.path.join(runs_dir(), run_id)
    private_dirs(os.path.join(run_dir, "logs"), top=os.path.dirname(runs_dir()))
    local = all(h in ("localhost", "127.0.0.1") for h in hosts)
    record = RunRecord(
        run_id,
        program,
        "local_mp" if local else "ssh",
        coordinator="",
        launcher_pid=os.getpid(),
        launcher_start=process_start(os.getpid()),
        launcher_pid_space=pid_space(),
        hosts=list(hosts),
        ssh_config=None if local else ssh_config,
        log_dir=os.path.join(run_dir, "logs"),
        preparing=doing,
    )
    write_record(run_dir, record)
    return run_dir


def record_failure(run_id: str, failure: dict[str, object] | None, reason: str, kind: str = "failed") -> None:
    """End the record of run ``run_id`` if it is still being prepared (or is gone): it never started."""
    run_dir = os.path.join(runs_dir(), run_id)
    try:
        record = read_record(run_dir)
    except (OSError, ValueError):  # the failed launch removed its folder
        private_dirs(os.path.join(run_dir, "logs"), top=os.path.dirname(runs_dir()))
        record = RunRecord(
            run_id,
            run_id,
            "local_mp",
            "",
            os.getpid(),
            launcher_start=process_start(os.getpid()),
            launcher_pid_space=pid_space(),
        )
        record.preparing = reason
    if not record.preparing or record.ended:
        return  # it started: its own record says how it ended
    mark_ended(run_dir, record, {"failure": failure, "stop_reason": reason, "stop_kind": kind})


def _log(run_dir: str, host: str | None) -> str:
    return os.path.join(run_dir, "logs", f"{ENV_LOG}{'-' + host if host else ''}.log")


def prepare_here(env: RuntimeEnv, run_dir: str, home: str | None = None) -> str:
    """Build (or find) ``env``'s environment on this machine; its interpreter.

    Raises:
        EnvBuildError: pip failed (its output is in the error).
    """
    with open(_log(run_dir, None), "a", encoding="utf-8") as log:
        os.chmod(log.name, 0o600)
        log.write(f"tlaunch: runtime environment of {env.key[:12]} ({describe(env)}) on this machine\n")
        log.flush()
        store = sealer()  # a job server's sealed store (--unix-users), else this account's own envs
        try:
            built = prepare_sealed(store, env, out=log) if store else ensure(envs_root(home), env, out=log)
        except EnvBuildError as exc:
            exc.host = "localhost"  # as this machine's nodes name it
            raise
        log.write(f"tlaunch: {'built' if built.built else 'using'} the runtime environment {built.path}\n")
    hold(os.path.dirname(built.path), env.key)  # in use while this launcher (and what it execs) runs
    return built.python


def prepare_hosts(
    env: RuntimeEnv, hosts: Sequence[str], ssh_config: str | None, run_dir: str
) -> dict[str, str]:
    """Build (or find) ``env``'s environment on every SSH host at once; each host's interpreter.

    The package is packed once and shipped only to hosts that do not have the
    environment yet; the host's Python is the launcher's path (as SSH launches assume).

    Raises:
        EnvBuildError: a host's build failed (pip's output, the host named), or a host
            cannot be reached or cannot run ``tlaunch.runtime.pyenv``.
    """
    from tlaunch.ssh import connect_all, pmap

    unique = list(dict.fromkeys(hosts))
    try:
        conns = connect_all(unique, ssh_config=ssh_config)
    except TLaunchError as exc:
        raise EnvBuildError(f"cannot reach the job's hosts to build its runtime environment: {exc}") from None
    packed: list[bytes] = []
    python = sys.executable
    module = [python, "-m", "tlaunch.runtime.pyenv"]

    def one(host: str) -> str:
        conn = conns[host]
        found = conn.run([*module, "find", REMOTE_ROOT, env.key], check=False)
        if found.exit_status == 0:
            _append(
                run_dir, host, f"tlaunch: using the runtime environment {found.stdout.strip()} on {host}\n"
            )
            return found.stdout.strip()
        if found.exit_status != NOT_BUILT:
            said = (found.stdout + found.stderr).strip()[-500:]
            raise EnvBuildError(
                f"{python} cannot run tlaunch.runtime.pyenv on {host} (exit {found.exit_status})",
                said,
                host=host,
            )
        if not packed:
            packed.append(_archive(env.folder, 1 << 30, _requirement_files(env)))
        archive = f"{REMOTE_ROOT}/.package-{uuid.uuid4().hex[:12]}.tgz"
        conn.run(["mkdir", "-p", "-m", "700", REMOTE_ROOT])
        conn.write_file(archive, packed[0], mode=0o600)
        done = conn.run(
            [*module, "ensure", REMOTE_ROOT, env.key, "--archive", archive, "--requirements", _shipped(env)],
            check=False,
            pty=True,
        )
        output = done.stdout.replace("\r\n", "\n")
        lines = output.strip().splitlines()
        _append(run_dir, host, "".join(f"{line}\n" for line in lines if not line.startswith('{"python"')))
        if done.exit_status != 0:
            tail = "\n".join(lines[-60:])
            raise EnvBuildError(
                f"pip install {describe(env)} failed on {host} (exit {done.exit_status})",
                tail,
                done.exit_status,
                host,
            )
        result = json.loads(next(line for line in reversed(lines) if line.startswith('{"python"')))
        _append(run_dir, host, f"tlaunch: built the runtime environment {result['path']} on {host}\n")
        return str(result["python"])

    try:
        results = pmap(one, unique, conns)
    finally:
        for conn in conns.values():
            conn.close()
    for host, result in results.items():
        if isinstance(result, KeyboardInterrupt | SystemExit):
            raise result
        if isinstance(result, EnvBuildError):
            raise result
        if isinstance(result, CommandError | SSHError):
            raise EnvBuildError(f"preparing the runtime environment failed: {result}", host=host) from None
        if isinstance(result, BaseException):
            raise result
    return {h: str(r) for h, r in results.items()}


def _archive(folder: str, limit: int, extra: dict[str, bytes] | None = None) -> bytes:
    """``folder`` as a .tar.gz, its ignore files honoured (as a working dir is shipped), with ``extra``
    files (name: bytes) beside its own.

    Raises:
        LaunchError: it holds more than ``limit`` bytes to ship.
    """
    from tlaunch.ssh.sync import TAR_END, pack_dir, tar_file

    more = b"".join(tar_file(name, data) for name, data in (extra or {}).items())
    return gzip.compress(pack_dir(folder, limit).members + more + TAR_END, compresslevel=6)


def describe(env: RuntimeEnv) -> str:
    """What ``env`` installs, in words: ``-r requirements.txt``, or its lines (the first few)."""
    if not env.pip:
        return f"-r {env.requirements}"
    shown = " ".join(env.pip[:3])
    return shown + (f" and {len(env.pip) - 3} more" if len(env.pip) > 3 else "")


def _requirement_files(env: RuntimeEnv) -> dict[str, bytes]:
    """The file a job's own requirement lines travel in (beside its package), if it has them."""
    return {REQUIREMENTS_FILE: _requirements_text(env)} if env.pip else {}


def _shipped(env: RuntimeEnv) -> str:
    """The requirements file of ``env`` in its package as shipped (:func:`_requirement_files`)."""
    return REQUIREMENTS_FILE if env.pip else env.requirements


def _requirements_text(env: RuntimeEnv) -> bytes:
    """The requirements as one file at the package's top: the job's lines, or a line naming the
    package's own file (whose ``-r`` lines stay relative to it)."""
    lines = env.pip or (f"-r {env.requirements}",)
    return "".join(f"{line}\n" for line in lines).encode()


def write_requirements(env: RuntimeEnv | None, run_dir: str) -> None:
    """Write a job's own requirement lines where its batch script's build reads them (:func:`batch_steps`)."""
    if env is not None and env.pip:
        write_private(os.path.join(run_dir, REQUIREMENTS_FILE), _requirements_text(env))


def _append(run_dir: str, host: str, text: str) -> None:
    with contextlib.suppress(OSError), open(_log(run_dir, host), "a", encoding="utf-8") as log:
        os.chmod(log.name, 0o600)
        log.write(text)


def batch_steps(
    env: RuntimeEnv, home: str | None, run_dir: str, argv: list[str]
) -> tuple[list[list[str]], list[str]]:
    """A SLURM batch job's steps that build ``env`` on every node, and ``argv`` run in it.

    Returns:
        The steps (``srun``, one task per node: each builds, or waits for the build of
        another under the lock, on the shared filesystem) and the command to run
        instead of ``argv`` (``argv[0]`` must be this interpreter; it becomes the environment's).
    """
    root = envs_root(home)
    pyenv = [sys.executable, "-m", "tlaunch.runtime.pyenv"]
    report = os.path.join(run_dir, "result.json")
    requirements = os.path.join(run_dir, REQUIREMENTS_FILE) if env.pip else env.requirements
    build = ["srun", "--ntasks-per-node=1", *pyenv, "ensure", root, env.key, env.folder, "--report", report,
             "--requirements", requirements]  # fmt: skip
    return [build], [*pyenv, "exec", root, env.key, "--", *argv[1:]]


def pod_package(folder: str, env: RuntimeEnv | None) -> tuple[dict[str, bytes], dict[str, object]]:
    """The run Secret's files of a Kubernetes job whose package is ``folder``, and the LPJob's ``package``.

    Raises:
        LaunchError: the package is too large for a Secret (the message says what to do).
    """
    from tlaunch.k8s.package import PACKAGE_FILE, PYENV_FILE
    from tlaunch.runtime import pyenv

    packed = _archive(folder, 256 << 20, {REQUIREMENTS_FILE: _requirements_text(env)} if env else None)
    if len(packed) > POD_PACKAGE_LIMIT:
        raise LaunchError(
            f"the package {folder} is {len(packed) >> 10} KiB packed; a Kubernetes job carries at most "
            f"{POD_PACKAGE_LIMIT >> 10} KiB in its Secret: keep data and checkpoints out of it (in the "
            "image, or the job's /TData volume)"
        )
    with open(pyenv.__file__, "rb") as f:
        source = f.read()
    key = env.key if env is not None else hashlib.sha256(packed).hexdigest()
    if not re.fullmatch(r"[0-9a-f]{64}", key):
        key = hashlib.sha256(key.encode()).hexdigest()
    return {PACKAGE_FILE: packed, PYENV_FILE: source}, {"sha256": key, "requirements": env is not None}
