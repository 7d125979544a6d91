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
import traceback
from collections.abc import Sequence
from typing import Any

__all__ = [
    "CHANNEL_READY",
    "CHANNEL_REPLIES",
    "CHANNEL_REQUESTS",
    "ERROR",
    "HELLO",
    "REPLY",
    "REQUEST",
    "Buffer",
    "dumps",
    "error_payload",
    "first_bytes_buffer",
    "loads",
]

Buffer = bytes | bytearray | memoryview

REQUEST = 1
REPLY = 2
ERROR = 3
# A channel for futures is two connections, each used in one direction only
# (OpenSSL forbids reading and writing one connection from two threads at once):
CHANNEL_REPLIES = 4  # first message of the replies side: the channel's token
CHANNEL_READY = 5  # the server's answer on the replies side: the token is registered
CHANNEL_REQUESTS = 6  # first message of the requests side: the same token
HELLO = 7  # first message of a client, answered in kind: each side's shared-memory key

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


_cloud: type[pickle.Pickler] | None = None


def _cloud_pickler() -> type[pickle.Pickler]:
    """tlaunch's cloudpickle pickler with large ``bytes`` out of band; imported at its first use
    (a process whose messages plain pickle can carry, a supervisor or the head, never loads it)."""
    global _cloud
    if _cloud is None:
        from tlaunch.pickling import Pickler

        class _Cloud(_BigBytesOutOfBand, Pickler):
            pass

        _cloud = _Cloud
    return _cloud


def _dump(cls: type[pickle.Pickler], obj: Any) -> list[Buffer]:
    oob: list[Buffer] = []

    def keep(pb: pickle.PickleBuffer) -> bool:
        raw = pb.raw()
        if raw.nbytes < INBAND_LIMIT:
            return True
        oob.append(raw)
        return False

    out = io.BytesIO()
    pickler: Any = cls(out, protocol=5, buffer_callback=keep)  # a _BigBytesOutOfBand
    pickler.big = []
    pickler.dump(obj)
    return [out.getvalue(), _COUNT.pack(len(oob)), *oob, *pickler.big]


_SCALARS = frozenset({type(None), bool, int, float, str, complex})
_CONTAINERS = frozenset({tuple, list, dict})
_NO_OOB = _COUNT.pack(0)


def _small(obj: Any, budget: int = 64) -> int:
    """What is left of ``budget`` after looking at ``obj``; < 0 if it may hold large buffers.

    Small messages (a method name and a few scalars, a ``None`` reply) are the
    common case: they skip the out-of-band machinery. Scalars and empty
    containers inside a container are looked at in place (a call costs more).
    """
    t = type(obj)
    if t in _SCALARS:
        return budget - 1
    if t is bytes:
        return budget - 1 if len(obj) < INBAND_LIMIT else -1
    if t is tuple or t is list:
        items = obj
    elif t is dict:
        items = [*obj.keys(), *obj.values()]
    else:
        return -1
    budget -= 1 + len(items)
    if budget < 0:
        return -1
    for item in items:
        kind = type(item)
        if kind in _SCALARS or (kind in _CONTAINERS and not item):
            continue
        budget = _small(item, budget + 1)
        if budget < 0:
            return -1
    return budget


def dumps(obj: Any) -> list[Buffer]:
    """Serialize ``obj`` into a pickle and its out-of-band buffers.

    Plain pickle first (fast, C); cloudpickle for what it cannot do (lambdas,
    closures, classes defined in ``__main__``).
    """
    if _small(obj) >= 0:
        return [pickle.dumps(obj, protocol=5), _NO_OOB]
    try:
        return _dump(_Plain, obj)
    except (pickle.PicklingError, AttributeError, TypeError):
        return _dump(_cloud_pickler(), obj)


def first_bytes_buffer(counts: memoryview) -> int:
    """The index of the first large ``bytes`` buffer of a message, from its counts buffer."""
    if counts.nbytes != _COUNT.size:
        return 1 << 62  # not a message of :func:`dumps`: no bytes buffers
    n_oob: int = _COUNT.unpack(counts)[0]
    return 2 + n_oob


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: memoryview, buffers: Sequence[memoryview], big: Sequence[memoryview]) -> None:
        super().__init__(io.BytesIO(data), buffers=buffers)
        self._big = big

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, int) or not 0 <= pid < len(self._big):
            raise pickle.UnpicklingError(f"bad buffer reference {pid!r}")
        view = self._big[pid]
        if type(view.obj) is bytes and view.nbytes == len(view.obj):
            return view.obj  # received straight into a bytes object: no copy
        return bytes(view)


def loads(buffers: Sequence[memoryview]) -> Any:
    """Inverse of :func:`dumps`."""
    if len(buffers) == 2 and buffers[1] == _NO_OOB:  # the common small message
        return pickle.loads(buffers[0])
    if len(buffers) < 2:
        raise pickle.UnpicklingError("a message needs a pickle and its buffer counts")
    (n_oob,) = _COUNT.unpack(buffers[1])
    oob, big = buffers[2 : 2 + n_oob], buffers[2 + n_oob :]
    if not big:
        return pickle.loads(buffers[0], buffers=oob)
    return _Unpickler(buffers[0], oob, big).load()


def error_payload(exc: BaseException) -> tuple[str, str, str]:
    """(type name, message, formatted traceback) of ``exc``, for an ``ERROR`` reply."""
    t = type(exc)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    return name, str(exc), "".join(traceback.format_exception(t, exc, exc.__traceback__))
