"""The launch types, by Launchpad's names (pure; every layer may use them)."""

from __future__ import annotations

import enum

__all__ = ["LaunchType", "is_local_launch", "is_local_launch_or_test"]


class LaunchType(str, enum.Enum):
    """How a program is started (Launchpad's names, and ``ssh``, ``slurm``, ``k8s``).

    ``LOCAL_DOCKER`` and ``VERTEX_AI`` are Launchpad's too, so that programs
    that name them still import; ``launch()`` refuses them.
    """

    LOCAL_MULTI_PROCESSING = "local_mp"
    LOCAL_MULTI_THREADING = "local_mt"
    TEST_MULTI_PROCESSING = "test_mp"
    TEST_MULTI_THREADING = "test_mt"
    SSH = "ssh"
    SLURM = "slurm"
    KUBERNETES = "k8s"
    LOCAL_DOCKER = "local_docker"
    VERTEX_AI = "vertex_ai"


_LOCAL = ("local_mp", "local_mt")
_TEST = ("test_mp", "test_mt")


def _value(launch_type: LaunchType | str) -> str:
    return str(getattr(launch_type, "value", launch_type))


def is_local_launch(launch_type: LaunchType | str) -> bool:
    """Whether ``launch_type`` runs the program on this machine, outside a test (Launchpad's name)."""
    return _value(launch_type) in _LOCAL


def is_local_launch_or_test(launch_type: LaunchType | str) -> bool:
    """Whether ``launch_type`` runs the program on this machine, in a test or not (Launchpad's name)."""
    return _value(launch_type) in (*_LOCAL, *_TEST)
