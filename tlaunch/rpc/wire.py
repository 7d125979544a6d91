"""Message payloads: pickle protocol 5 with out-of-band buffers.

Large contiguous buffers (numpy arrays, bytes-likes) leave the pickle as
separate buffers, so they reach the socket without being copied into it.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import cloudpickle

__all__ = ["ERROR", "REPLY", "REQUEST", "Buffer", "dumps", "loads"]

Buffer = bytes | bytearray | memoryview

REQUEST = 1
REPLY = 2
ERROR = 3

INBAND_LIMIT = 64 << 10  # buffers smaller than this stay inside the pickle


def dumps(obj: Any) -> list[Buffer]:
    """Serialize ``obj`` into a pickle and its out-of-band buffers.

    Plain pickle first (fast, C); cloudpickle for what it cannot do (lambdas,
    closures, classes defined in ``__main__``).
    """
    buffers: list[Buffer] = []

    def keep(pb: pickle.PickleBuffer) -> bool:
        raw = pb.raw()
        if raw.nbytes < INBAND_LIMIT:
            return True
        buffers.append(raw)
        return False

    try:
        main = pickle.dumps(obj, protocol=5, buffer_callback=keep)
    except (pickle.PicklingError, AttributeError, TypeError):
        buffers.clear()
        main = cloudpickle.dumps(obj, protocol=5, buffer_callback=keep)
    return [main, *buffers]


def loads(buffers: Sequence[memoryview]) -> Any:
    """Inverse of :func:`dumps`."""
    return pickle.loads(buffers[0], buffers=buffers[1:])
