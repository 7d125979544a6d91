"""The environment of a torch job's workers: what is copied from the launcher, what a file adds.

Variables of the launcher whose names match one of ``default_env_vars`` or
``extra_env_vars`` (``fnmatch`` patterns) are copied to every agent and
worker; ``env`` values are added; an ``env_file`` is sourced by each host's
agent (bash, ``set -a``), so it may hold any shell logic. Values travel in the
run's 0600 node files, never on a command line.

Variables the scheduler sets per host are never copied: a launcher's
``CUDA_VISIBLE_DEVICES`` would overwrite what SLURM gave each node.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
from collections.abc import Iterable, Mapping

from tlaunch.errors import LaunchError

__all__ = ["DEFAULT_ENV_VARS", "NEVER_COPIED", "copied_env", "source_env_file"]

DEFAULT_ENV_VARS: tuple[str, ...] = (
    "PATH",
    "LD_LIBRARY_PATH",
    "LIBRARY_PATH",
    "PYTHON*",
    "CUDA*",
    "NCCL*",
    "TORCH*",
    "PYTORCH*",
    "GLOO*",
    "OMP_NUM_THREADS",
    "HF_*",
    "WANDB_*",
)
"""Copied by default (``fnmatch`` patterns of variable names)."""

NEVER_COPIED: tuple[str, ...] = (
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "SLURM_*",
    "TORCHELASTIC_*",
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PYTHONSTARTUP",
)
"""Set per host or per worker: copying the launcher's would be wrong."""


def copied_env(
    patterns: Iterable[str],
    env: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The launcher's variables matching ``patterns`` (minus :data:`NEVER_COPIED`), then ``env``.

    Raises:
        LaunchError: a pattern that is not a string (a common slip: one string instead of a list).
    """
    if isinstance(patterns, str):
        raise LaunchError(f"env var patterns must be a list, e.g. ['WANDB_*'], not the string {patterns!r}")
    pats = list(patterns)
    bad = [p for p in pats if not isinstance(p, str) or not p]
    if bad:
        raise LaunchError(f"env var patterns {bad!r} are not fnmatch patterns like 'NCCL_*'")
    source = os.environ if environ is None else environ
    out = {
        k: v
        for k, v in source.items()
        if any(fnmatch.fnmatchcase(k, p) for p in pats)
        and not any(fnmatch.fnmatchcase(k, n) for n in NEVER_COPIED)
    }
    out.update(env or {})
    return out


def source_env_file(path: str) -> dict[str, str]:
    """The variables that sourcing ``path`` with bash sets or changes (run on the worker's host).

    Raises:
        LaunchError: the file is missing there, or sourcing it fails.
    """
    if not os.path.isfile(path):
        raise LaunchError(f"env_file {path!r} does not exist on this host; give a path present on every host")
    script = 'set -a; . "$1" >/dev/null || exit 97; env -0'
    before = dict(os.environ)
    done = subprocess.run(["bash", "-c", script, "bash", path], capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        raise LaunchError(
            f"sourcing env_file {path!r} failed (exit {done.returncode}): "
            f"{done.stderr.decode(errors='replace').strip()[-500:]}"
        )
    after: dict[str, str] = {}
    for item in done.stdout.split(b"\0"):
        if b"=" in item:
            k, _, v = item.decode(errors="replace").partition("=")
            after[k] = v
    return {k: v for k, v in after.items() if before.get(k) != v and k not in ("_", "SHLVL", "PWD")}
