"""Backends by launch type, and what it takes to write one.

Each built-in backend is imported when first used (SSH needs paramiko, the
others never load it). A backend written elsewhere implements
:class:`Backend` (``docs/backends.md`` walks through it) and is registered with
:func:`register_backend`, or passed to :func:`tlaunch.launch` directly as
``launch_type=MyBackend``.
"""

from __future__ import annotations

import importlib
from typing import cast

from tlaunch.backends.base import (
    Backend,
    BackendOptions,
    BackendType,
    CoordinatorLink,
    NoOptions,
    OutputSink,
    Placement,
    Progress,
    RunSettings,
    RunSpec,
)
from tlaunch.runtime.in_process import InProcessCoordinator, execute_node
from tlaunch.runtime.restarts import RestartPolicy, supervise

__all__ = [
    "Backend",
    "BackendOptions",
    "BackendType",
    "CoordinatorLink",
    "InProcessCoordinator",
    "NoOptions",
    "OutputSink",
    "Placement",
    "Progress",
    "RestartPolicy",
    "RunSettings",
    "RunSpec",
    "backend_names",
    "execute_node",
    "get_backend",
    "register_backend",
    "supervise",
]

_BUILTIN = {
    "local_mp": "tlaunch.backends.local:LocalProcessBackend",
    "local_mt": "tlaunch.backends.threads:ThreadBackend",
    "test_mp": "tlaunch.backends.local:LocalProcessBackend",
    "test_mt": "tlaunch.backends.threads:ThreadBackend",
    "ssh": "tlaunch.backends.ssh:SSHBackend",
    "slurm": "tlaunch.backends.slurm:SlurmBackend",
}
_registered: dict[str, BackendType] = {}


def register_backend(backend: BackendType, name: str | None = None) -> None:
    """Make ``backend`` available as ``launch_type=name`` (default: its ``name``)."""
    _registered[name or backend.name] = backend


def backend_names() -> list[str]:
    """Every launch type a backend is known for."""
    return list(dict.fromkeys([*_BUILTIN, *_registered]))


def get_backend(name: str) -> BackendType:
    """The backend of launch type ``name``.

    Raises:
        KeyError: no backend has that name.
    """
    if name in _registered:
        return _registered[name]
    module, _, attr = _BUILTIN[name].partition(":")
    return cast(BackendType, getattr(importlib.import_module(module), attr))
