"""Launchpad's ``launchpad`` package, served by tlaunch (see :mod:`tlaunch.compat`).

Its top level is Launchpad's (``lp.Program``, ``lp.launch``...: the objects of
:mod:`tlaunch.lp_ssh`, tlaunch's additions included); its submodules carry
Launchpad's deeper paths (``launchpad.launch.worker_manager``...). All of them
are imported here, so that aliasing ``launchpad`` aliases every one at once.
"""

import importlib
from typing import Any

from tlaunch.lp_ssh import *  # noqa: F403
from tlaunch.lp_ssh import __all__ as _lp_all

SUBMODULES = (
    "address",
    "context",
    "flags",
    "program",
    "launch",
    "launch.launch",
    "launch.local_multi_processing",
    "launch.local_multi_processing.launch",
    "launch.local_multi_threading",
    "launch.local_multi_threading.launch",
    "launch.serialization",
    "launch.test_multi_processing",
    "launch.test_multi_processing.launch",
    "launch.test_multi_threading",
    "launch.test_multi_threading.address_builder",
    "launch.test_multi_threading.launch",
    "launch.worker_manager",
    "nodes",
    "nodes.base",
    "nodes.courier",
    "nodes.courier.courier_utils",
    "nodes.courier.node",
    "nodes.multi_processing_colocation",
    "nodes.multi_processing_colocation.node",
    "nodes.multi_threading_colocation",
    "nodes.multi_threading_colocation.node",
    "nodes.python",
    "nodes.python.local_multi_processing",
    "nodes.python.node",
    "program_stopper",
    "program_stopper.program_stopper",
    "stop_program",
    "stop_program.stop",
)
for _name in SUBMODULES:
    importlib.import_module(f"{__name__}.{_name}")

# Importing the submodules bound ``context``, ``flags`` (Launchpad's modules: keep
# them) and ``launch`` (the package: the function takes its name back, as in Launchpad).
from tlaunch.lp_ssh import launch  # noqa: E402, F401

__all__ = list(_lp_all)

_UNSUPPORTED = {
    "ReverbNode": "Reverb nodes are not supported; run the Reverb server in a PyNode or CourierNode",
    "DockerConfig": "Docker launches (local_docker) are not supported",
}


def __getattr__(name: str) -> Any:
    if name in _UNSUPPORTED:
        raise AttributeError(f"launchpad.{name}: {_UNSUPPORTED[name]} by tlaunch (docs/launchpad.md)")
    raise AttributeError(f"module 'launchpad' (tlaunch.compat) has no attribute {name!r}")
