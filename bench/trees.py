"""Another tree of tlaunch beside this checkout, seen by the test hosts (for ``--baseline``).

The test hosts have their own ``/tmp`` (and SLURM's test nodes too): a tree there,
put on their ``PYTHONPATH``, is not found, and they import this checkout's tlaunch
instead, so that an A/B of a change on the hosts' side (the supervisor, the head,
the nodes) measures the launcher's side alone. Benchmarks pass the tree to the
hosts' ``also_expose`` and check with :func:`check_seen`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["check_seen"]


def check_seen(hosts: Any, tree: str, host: str = "th1") -> None:
    """Exit unless ``host`` of the SSH test hosts ``hosts`` imports tlaunch from ``tree`` when
    ``tree`` is on its ``PYTHONPATH``."""
    from tlaunch.ssh import connect_all

    conn = connect_all([host], ssh_config=hosts.ssh_config)[host]
    try:
        code = "import os, tlaunch; print(os.path.dirname(os.path.dirname(tlaunch.__file__)))"
        said = conn.run(["env", f"PYTHONPATH={tree}", sys.executable, "-c", code]).stdout.strip()
    finally:
        conn.close()
    if os.path.realpath(said) != os.path.realpath(tree):
        raise SystemExit(
            f"the test hosts import tlaunch from {said}, not from {tree}: "
            "put the tree where they see it (e.g. under /var/tmp)"
        )
