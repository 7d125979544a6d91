"""A job placed by the job server's pool: each host's GPUs and CPUs, applied to the nodes there.

The server gives a job one variable, the same for every trainer,
:data:`SLOTS` (``TLAUNCH_POOL_SLOTS``): JSON, host -> that host's slot::

    {"gpu1": {"gpus": "GPU-5f3c...,GPU-9a1b...", "cpus": "0-7"}, "gpu2": {...}}

A node's supervisor reads its own host's (:func:`slot_of`, by the host name its
backend placed it on) before it starts the node: ``CUDA_VISIBLE_DEVICES``
(UUIDs, or indices for GPUs declared by hand) with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
(indices as ``nvidia-smi`` numbers them), and its CPU set (the supervisor's own
affinity, which the node and everything it starts inherit; also in
``TLAUNCH_POOL_CPUS``). A host without a slot is left alone. Every method runs
its trainers under a supervisor, so this is the one place a placement is applied.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SLOTS", "slot_of"]

SLOTS = "TLAUNCH_POOL_SLOTS"
"""The variable that carries a pool job's slots (see the module docstring)."""


def slot_of(env: Mapping[str, str], host: str) -> tuple[dict[str, str], set[int] | None]:
    """The variables a node on ``host`` gets from the slots in ``env``, and its CPU set (None: any).

    Raises:
        ValueError: the slots are not the server's JSON (the message says what is wrong).
    """
    text = env.get(SLOTS)
    if not text:
        return {}, None
    import json  # here: a supervisor of a job no pool placed never imports it (~1 ms of every start)

    try:
        slots = json.loads(text)
        slot = slots.get(host) if isinstance(slots, dict) else None
    except ValueError:
        raise ValueError(f"${SLOTS} is not JSON: {text[:200]!r}") from None
    if not isinstance(slot, dict):
        return {}, None
    out: dict[str, str] = {}
    cpus: set[int] | None = None
    if "gpus" in slot:
        out["CUDA_VISIBLE_DEVICES"] = str(slot["gpus"])
        out["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if slot.get("cpus"):
        out["TLAUNCH_POOL_CPUS"] = str(slot["cpus"])
        cpus = set()
        for part in str(slot["cpus"]).split(","):
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    return out, cpus
