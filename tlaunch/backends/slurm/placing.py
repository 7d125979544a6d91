"""Where a SLURM launch puts each node.

Placement: a node whose ``to_host()`` names a node of the allocation runs
there; any other named host is an error that lists the allocation; nodes
with no host are spread over the allocation in order.
"""

from __future__ import annotations

from tlaunch.errors import LaunchError
from tlaunch.plan import LaunchPlan

__all__ = ["place"]


def place(plan: LaunchPlan, nodes: list[str]) -> dict[str, str]:
    """Which allocated node runs each node of ``plan`` (see the module docstring for the rule).

    Raises:
        LaunchError: a node names a host outside the allocation.
    """
    placed: dict[str, str] = {}
    free = 0
    for spec in plan.nodes:
        if spec.host is None:
            placed[spec.key] = nodes[free % len(nodes)]
            free += 1
        elif spec.host.host in nodes:
            placed[spec.key] = spec.host.host
        else:
            raise LaunchError(
                f"node {spec.key!r} is placed on {str(spec.host)!r}, which is not a node of this SLURM "
                f"allocation ({', '.join(nodes)}); use one of them in .to_host(), or drop .to_host() to "
                "spread the nodes over the allocation"
            )
    return placed
