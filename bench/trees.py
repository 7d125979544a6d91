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

__all__ = ["check_seen", "interpreter"]


def interpreter() -> dict[str, Any]:
    """The interpreter the test hosts run (this one), and whether an editable install of tlaunch
    loads its import finder in it at every start (``pip install -e``: ~10 ms of CPU each, ~13 ms
    of a supervisor's start, which no ``pip install .`` pays). Says so on stderr: measure from
    a venv made as the README says (``pip install -r requirements.txt && pip install .``)."""
    editable = any(name.startswith("__editable__") and "tlaunch" in name for name in sys.modules)
    if editable:
        print(
            f"note: {sys.executable} has an editable install of tlaunch, whose finder every "
            "interpreter the test hosts start loads (~10 ms of CPU each): figures from a venv "
            "installed with `pip install .` are what users get",
            file=sys.stderr,
        )
    return {"python": sys.executable, "editable_install": editable}


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
