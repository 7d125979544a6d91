"""A job's package in its pods: unpacked from its run Secret, its runtime environment built first (pure).

An LPJob with ``package`` (and ``runFiles``) gets, in its run Secret
(``/etc/tlaunch-run``), ``package.tgz`` (the job's folder: its scripts and the
files its ``requirements.txt`` names) and ``pyenv.py`` (the source of
:mod:`tlaunch.runtime.pyenv`, which runs without tlaunch in the image). Each
pod's command then starts with a few lines of POSIX shell, before the launch
method's own command:

1. the package is unpacked into a fresh folder, which becomes the working
   directory (the trainer's ``train.py`` is there);
2. with ``package.requirements``, its runtime environment is built (or found)
   by ``pyenv.py ensure``, the init step: on the job's volume
   (``/TData/envs``) when it has one, so that its pods, and later jobs of the
   same package, build it once (under a lock on that volume); else in the
   pod's own ``$TMPDIR``. Its interpreter comes first on ``PATH`` and its
   site-packages on ``PYTHONPATH`` (so ``torchrun``'s workers see it too);
3. ``exec`` the command.

A job whose image already holds what it needs (``base_image``) simply ships
no ``requirements.txt``.
"""

from __future__ import annotations

import shlex
from typing import Any

from tlaunch.runtime.envkey import REQUIREMENTS_FILE

__all__ = ["PACKAGE_FILE", "PYENV_FILE", "with_package"]

PACKAGE_FILE = "package.tgz"
"""The package's archive in the run Secret."""
PYENV_FILE = "pyenv.py"
"""The source of :mod:`tlaunch.runtime.pyenv` in the run Secret."""
_RUN = '"${TLAUNCH_MOUNT_ROOT:-}/etc/tlaunch-run"'  # the stand-in kubelet mounts under a root of its own


def _prelude(spec: dict[str, Any]) -> str:
    package = spec["package"]
    lines = [
        "set -e",
        f"R={_RUN}",
        'W="$(mktemp -d "${TMPDIR:-/tmp}/tlaunch-package.XXXXXX")"',
        f'tar -xzf "$R/{PACKAGE_FILE}" -C "$W"',
        'cd "$W"',
    ]
    if package.get("requirements"):
        on_volume = '"${TLAUNCH_MOUNT_ROOT:-}/TData/envs"'  # the job's volume: built once for its pods
        root = on_volume if spec.get("tdataClaim") else '"${TMPDIR:-/tmp}/tlaunch-envs"'
        key = shlex.quote(str(package["sha256"]))
        # The requirements travel as one file at the package's top (a job's own lines, or a line
        # naming the package's file); a package made before that has only its requirements.txt.
        lines.append(f'Q={REQUIREMENTS_FILE}; [ -f "$W/$Q" ] || Q=requirements.txt')
        lines.append(
            f'eval "$(python "$R/{PYENV_FILE}" ensure {root} {key} "$W" --requirements "$Q" --shell)"'
        )
    return "; ".join(lines) + '; exec "$@"'


def with_package(spec: dict[str, Any], command: list[str]) -> list[str]:
    """``command`` (a pod's) run after the job's package is unpacked and its environment built.

    Unchanged when the LPJob ships no package.
    """
    if not spec.get("package") or not spec.get("runFiles"):
        return command
    return ["sh", "-c", _prelude(spec), "sh", *command]
