"""A trainer's ``python`` is the interpreter tlaunch runs it with, on every host.

A ``command`` job running ``python train.py`` (or a basic trainer's script
that starts ``python`` itself) should get the interpreter its trainer runs
with on that host, as torchrun's workers do (``sys.executable``): the job's
runtime environment, the ``python=`` of its SSH hosts, the launcher's own on
this machine and in a SLURM allocation. A host's ``PATH`` often has no
``python`` at all (Debian's has ``python3`` only: ``No such file or
directory: 'python'``), or another one. :func:`python_first` puts it first
on ``PATH``:

* when ``python`` on ``PATH`` already is this interpreter, nothing changes;
* a virtualenv's (a runtime environment's, the launcher's venv): its ``bin``
  folder comes first, so its other tools (``pip``, its scripts) come too;
* else a folder of two small scripts, ``python`` and ``python3``, that
  ``exec`` this interpreter (a link would not do: a venv's interpreter found
  through a link elsewhere loses its venv), made private and removed after.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator, MutableMapping

__all__ = ["python_first"]

_NAMES = ("python", "python3")


def _is_this(path: str | None) -> bool:
    """Whether ``path`` runs this interpreter, in this environment."""
    if path is None:
        return False
    try:
        same = os.path.samefile(path, sys.executable)
    except OSError:
        return False
    return same and os.path.dirname(os.path.abspath(path)) == os.path.dirname(os.path.abspath(sys.executable))


@contextlib.contextmanager
def python_first(environ: MutableMapping[str, str] | None = None) -> Iterator[str]:
    """Within it, ``python`` (and ``python3``) on ``environ``'s ``PATH`` (default ``os.environ``) is
    this interpreter; yields that ``PATH`` (see the module docstring)."""
    env = os.environ if environ is None else environ
    path = env.get("PATH", os.defpath)
    if _is_this(shutil.which("python", path=path)):
        yield path
        return
    here = os.path.dirname(os.path.abspath(sys.executable))
    folder = None
    if sys.prefix != sys.base_prefix and _is_this(os.path.join(here, "python")):
        first = here  # a virtualenv's bin: its python and its tools
    else:
        first = folder = tempfile.mkdtemp(prefix="tlaunch-python-")  # 0700
        for name in _NAMES:
            script = os.path.join(folder, name)
            with open(script, "w", encoding="utf-8") as f:
                f.write(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
            os.chmod(script, 0o700)
    env["PATH"] = os.pathsep.join([first, path])
    try:
        yield env["PATH"]
    finally:
        env["PATH"] = path
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
