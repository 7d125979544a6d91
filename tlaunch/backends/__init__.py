"""Backends by launch type, and what it takes to write one.

Each built-in backend is imported when first used (SSH needs paramiko, the
others never load it). A backend written elsewhere implements
:class:`Backend` (``docs/backends.md`` walks through it) and is registered with
:func:`register_backend`, or passed to :func:`tlaunch.launch` directly as
``launch_type=MyBackend``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

from tlaunch.allocation import slurm_allocation
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
from tlaunch.backends.traits import BackendTraits
from tlaunch.runtime.in_process import InProcessCoordinator, execute_node
from tlaunch.runtime.restarts import RestartPolicy, supervise

if TYPE_CHECKING:
    from tlaunch.plan import LaunchPlan

__all__ = [
    "Backend",
    "BackendOptions",
    "BackendTraits",
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
    "check_backend_type",
    "claiming_backend",
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
    "k8s": "tlaunch.backends.k8s:K8sBackend",
    "kubernetes": "tlaunch.backends.k8s:K8sBackend",
}
_registered: dict[str, BackendType] = {}
_DECLARED = (
    *("name", "terminals", "placement", "can_detach", "Options"),
    *("can_submit", "shares_values", "claims", "submit", "attach"),
)


def register_backend(backend: BackendType, name: str | None = None) -> None:
    """Make ``backend`` available as ``launch_type=name`` (default: its ``name``).

    Raises:
        TypeError: ``backend`` lacks part of :class:`BackendType` (subclass
            :class:`BackendTraits` for the defaults of the optional capabilities).
    """
    check_backend_type(backend)
    _registered[name or backend.name] = backend


def check_backend_type(backend: object) -> BackendType:
    """``backend`` itself, once it has every member of :class:`BackendType`.

    Raises:
        TypeError: it lacks some, named in the message.
    """
    missing = [attr for attr in _DECLARED if not hasattr(backend, attr)]
    if missing:
        raise TypeError(
            f"backend {backend!r} lacks {missing} of tlaunch.backends.BackendType; subclass "
            "tlaunch.backends.BackendTraits for the defaults of claims, submit, attach and "
            "can_submit (docs/backends.md)"
        )
    return cast(BackendType, backend)


def claiming_backend(plan: LaunchPlan) -> BackendType | None:
    """The backend whose environment this launch runs in, if one claims it (a SLURM allocation).

    Asked only when a launch names no launch type. Built-in backends are asked
    only when their environment is there at all, so that nothing is imported
    for an ordinary launch; registered ones are always asked.
    """
    candidates = list(_registered.values())
    if slurm_allocation() is not None:
        candidates.append(get_backend("slurm"))
    return next((kind for kind in candidates if kind.claims(plan)), None)


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
