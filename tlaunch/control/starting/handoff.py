"""Submitting a job as another local account: a small process of that account submits it.

A job server running as root (``--unix-users``) starts each user's job as that
user's own account; :func:`submit_as` starts ``python -m
tlaunch.control.starting.handoff`` dropped to the account
(:meth:`tlaunch.accounts.Account.drop`) and gives it the job on its stdin (never on
a command line). That process, the account's from its first instruction,
does what :func:`~.submission.submit` does, in the account's own
``TLAUNCH_HOME``::

    server (root)                                  handoff (the user's account)
    ─────────────────────────────────────────     ─────────────────────────────────────────
    the package's copy, made in a folder that      its run's folder made, the copy moved in
    only root can enter, then given to the user    submit(job, target): on this machine the job's
    submit_as(account, job, target, ...) ───────▶  launcher (its child: the same account), on
                                                   SSH hosts with the account's ~/.ssh, on SLURM
    its run id ◀──────────────────────────────────  its own sbatch; prints the run id, exits

So every file of the run is made by the account itself, in folders of its own:
root never writes where a user could have put a link.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from tlaunch.accounts import Account
from tlaunch.control.runs import find_run, runs_dir
from tlaunch.control.starting.submission import submit
from tlaunch.control.starting.targets import Hosts, Slurm
from tlaunch.errors import LaunchError, TLaunchError
from tlaunch.jobs import JobSpec
from tlaunch.runtime.pyenv import RuntimeEnv
from tlaunch.runtime.records import private_dirs

__all__ = ["PACKAGE_DIR", "adopt_as", "main", "submit_as"]

PACKAGE_DIR = "package"
"""The job's copy of its package, in its run's folder (its working directory on this machine)."""


def submit_as(
    account: Account,
    job: JobSpec,
    target: Hosts | Slurm,
    *,
    home: str,
    environ: Mapping[str, str],
    run_id: str,
    package: str | None = None,
    started_in: str | None = None,
    timeout: float = 120.0,
) -> str:
    """Submit ``job`` on ``target`` as ``account``, in its ``TLAUNCH_HOME`` ``home``; the run's id.

    Args:
        environ: the environment of the account's process (and so of the job's launcher).
        run_id: the run's id.
        package: a folder the account owns: the job's copy of its package, moved into
            the run's folder as ``package`` (where ``target`` says the job's files are).
        started_in: the folder of the job's ``./tlaunch-models`` (:func:`~.submission.submit`'s).

    Raises:
        LaunchError: the job could not start (the account's process says why).
    """
    request = {"job": json.loads(job.to_json()), "target": _target_dict(target), "home": home,
               "environ": dict(environ), "run_id": run_id, "package": package,
               "started_in": started_in}  # fmt: skip
    try:
        done = subprocess.run(
            [sys.executable, "-m", __spec__.name if __spec__ else __name__],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            env=dict(environ),
            cwd=home,
            timeout=timeout,
            check=False,
            **account.drop(),
        )
    except subprocess.TimeoutExpired:
        raise LaunchError(f"the job did not start as {account.name!r} within {timeout:.0f} s") from None
    except OSError as exc:
        raise LaunchError(f"cannot start a process as {account.name!r}: {exc}") from None
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError):
        said = (done.stdout + done.stderr).strip()[-2000:]
        raise LaunchError(f"submitting as {account.name!r} failed (exit {done.returncode}): {said}") from None
    if "error" in answer:
        raise LaunchError(str(answer["error"]))
    return str(answer["run_id"])


def _target_dict(target: Hosts | Slurm) -> dict[str, Any]:
    if not isinstance(target, Hosts | Slurm):
        raise LaunchError(f"a job can be handed to another account on hosts or SLURM, not {target!r}")
    return {"kind": "hosts" if isinstance(target, Hosts) else "slurm", **asdict(target)}


def _target_of(data: dict[str, Any]) -> Hosts | Slurm:
    kind = data.pop("kind")
    env = data.pop("runtime_env")
    runtime_env = RuntimeEnv(**env) if env else None
    if kind == "hosts":
        return Hosts(tuple(data.pop("hosts")), runtime_env=runtime_env, **data)
    return Slurm(sbatch_args=tuple(data.pop("sbatch_args")), runtime_env=runtime_env, **data)


def _submit_request() -> int:
    """Read the request on stdin, submit it; print ``{"run_id": ...}`` (or ``{"error": ...}``)."""
    request = json.loads(sys.stdin.read())
    try:
        home, run_id = request["home"], request["run_id"]
        run_dir = os.path.join(runs_dir(home), run_id)
        private_dirs(run_dir, top=home)
        if request.get("package"):
            os.rename(request["package"], os.path.join(run_dir, PACKAGE_DIR))
        handle = submit(
            JobSpec.from_json(json.dumps(request["job"])),
            _target_of(request["target"]),
            home=home,
            environ=request["environ"],
            run_id=run_id,
            started_in=request.get("started_in"),
        )
    except (TLaunchError, OSError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps({"run_id": handle.run_id}))
    return 0


def _logs(home: str, run_id: str, node: str, follow: str) -> int:
    """Print the run's log lines, a JSON object a line, as they come (``{"missing": ...}``: no such node)."""
    try:
        for line in find_run(run_id, home).logs(node or None, follow=follow == "follow"):
            print(json.dumps({"node": line.node, "text": line.text, "host": line.host, "where": line.where}),
                  flush=True)  # fmt: skip
    except KeyError as exc:
        print(json.dumps({"missing": str(exc.args[0])}), flush=True)
        return 1
    except TLaunchError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return 1
    return 0


def _adopt(source: str, home: str, run_id: str) -> int:
    """Move the run folder ``source`` (made elsewhere, given to this account) into ``home``'s run store."""
    try:
        private_dirs(runs_dir(home), top=home)
        os.rename(source, os.path.join(runs_dir(home), run_id))
    except OSError as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps({"run_id": run_id}))
    return 0


def adopt_as(account: Account, source: str, *, home: str, run_id: str, environ: Mapping[str, str]) -> None:
    """Move the run folder ``source`` (the account's, in a folder it may enter) into the run store of
    ``home`` as ``account``: a run recorded by root (a Kubernetes job, created as the user) becomes the
    user's.

    Raises:
        LaunchError: the account's process could not move it.
    """
    done = subprocess.run(
        [sys.executable, "-m", __spec__.name if __spec__ else __name__, "adopt", source, home, run_id],
        capture_output=True,
        text=True,
        env=dict(environ),
        cwd=home,
        timeout=60,
        check=False,
        **account.drop(),
    )
    if f'"run_id": "{run_id}"' not in done.stdout:
        said = (done.stdout + done.stderr).strip()[-1000:]
        raise LaunchError(f"giving run {run_id} to {account.name!r} failed: {said}")


def _stop(home: str, run_id: str) -> int:
    try:
        find_run(run_id, home).stop()
    except TLaunchError as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps({"stopped": run_id}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``handoff`` (a submit request on stdin), ``handoff logs HOME RUN NODE follow|once``, or
    ``handoff stop HOME RUN``: what a server as root does as another account."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        return _submit_request()
    if args[0] == "logs" and len(args) == 5:
        return _logs(*args[1:])
    if args[0] == "stop" and len(args) == 3:
        return _stop(*args[1:])
    if args[0] == "adopt" and len(args) == 4:
        return _adopt(*args[1:])
    usage = "[logs HOME RUN NODE follow|once | stop HOME RUN | adopt SOURCE HOME RUN]"
    print(f"usage: python -m tlaunch.control.starting.handoff {usage}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
