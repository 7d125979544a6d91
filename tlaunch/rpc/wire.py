"""Message payloads: pickle protocol 5 with out-of-band buffers.

Large contiguous buffers leave the pickle as separate buffers, so they reach
the socket without being copied into it: numpy arrays and bytearrays through
protocol 5's ``buffer_callback``, and large ``bytes`` (which protocol 5 would
copy into the stream) through ``persistent_id``. A message is
``[pickle, counts, *out_of_band, *persistent]``.
"""

from __future__ import annotations

import io
import pickle
import struct
from collections.abc import Sequence
from typing import Any

import cloudpickle

__all__ = ["ERROR", "REPLY", "REQUEST", "Buffer", "dumps", "loads"]

Buffer = bytes | bytearray | memoryview

REQUEST = 1
REPLY = 2
ERROR = 3

INBAND_LIMIT = 64 << 10  # buffers smaller than this stay inside the pickle
_COUNT = struct.Struct("!I")


class _BigBytesOutOfBand:
    """Large ``bytes`` go into ``big`` and the pickle keeps only their index."""

    big: list[Buffer]

    def persistent_id(self, obj: object) -> Any:
        if type(obj) is bytes and len(obj) >= INBAND_LIMIT:
            self.big.append(obj)
            return len(self.big) - 1
        return None


class _Plain(_BigBytesOutOfBand, pickle.Pickler):
    pass


class _Cloud(_BigBytesOutOfBand, cloudpickle.Pickler):  # type: ignore[misc]
    pass


def _dump(cls: type[_Plain] | type[_Cloud], obj: Any) -> list[Buffer]:
    oob: list[Buffer] = []

    def keep(pb: pickle.PickleBuffer) -> bool:
        raw = pb.raw()
        if raw.nbytes < INBAND_LIMIT:
            return True
        oob.append(raw)
        return False

    out = io.BytesIO()
    pickler = cls(out, protocol=5, buffer_callback=keep)
    pickler.big = []
    pickler.dump(obj)
    return [out.getvalue(), _COUNT.pack(len(oob)), *oob, *pickler.big]


def dumps(obj: Any) -> list[Buffer]:
    """Serialize ``obj`` into a pickle and its out-of-band buffers.

    Plain pickle first (fast, C); cloudpickle for what it cannot do (lambdas,
    closures, classes defined in ``__main__``).
    """
    try:
        return _dump(_Plain, obj)
    except (pickle.PicklingError, AttributeError, TypeError):
        return _dump(_Cloud, obj)


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: memoryview, buffers: Sequence[memoryview], big: Sequence[memoryview]) -> None:
        super().__init__(io.BytesIO(data), buffers=buffers)
        self._big = big

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, int) or not 0 <= pid < len(self._big):
            raise pickle.UnpicklingError(f"bad buffer reference {pid!r}")
        return bytes(self._big[pid])


def loads(buffers: Sequence[memoryview]) -> Any:
    """Inverse of :func:`dumps`."""
    if len(buffers) < 2:
        raise pickle.UnpicklingError("a message needs a pickle and its buffer counts")
    (n_oob,) = _COUNT.unpack(buffers[1])
    oob, big = buffers[2 : 2 + n_oob], buffers[2 + n_oob :]
    if not big:
        return pickle.loads(buffers[0], buffers=oob)
    return _Unpickler(buffers[0], oob, big).load()
