"""Memory that received messages land in, made so that filling it costs least.

Measured on this project's 2-core test machine (a VM, where each page fault is
dear), receiving 256 MiB:

* a ``bytearray`` is zero-filled page fault by page fault: 0.10 s before the
  data's own copy (0.03 s); an anonymous mapping with its pages populated in
  one call takes 0.06 s;
* a large ``bytes`` argument would be copied out of the receive buffer into
  the ``bytes`` object handed to the program (0.12 s more per hop); instead it
  is received straight into that object, created uninitialised exactly as
  CPython's own readers (``os.read``, ``socket.recv``) create theirs, and
  written only before anything else can see it.

What these need of ctypes (libc's ``mmap``/``munmap``/``madvise``, CPython's
``PyBytes_FromStringAndSize``) is loaded at the first large message
(:func:`native`), not with every process: ctypes is ~1.5 ms of a node's start.
"""

from __future__ import annotations

import contextlib
import mmap
import sys
from typing import Any, NamedTuple

__all__ = ["MAPPED", "Native", "fresh_bytes", "native", "populate_ahead", "receive_buffer", "writable"]

# Buffers from this size up are mapped memory whose pages are populated a step
# at a time, just ahead of the data (memory is committed as data arrives, never
# for a size a peer merely claims); below it, malloc mostly hands back memory
# already faulted in by an earlier message.
MAPPED = 4 << 20
STEP = 16 << 20

_MADV_POPULATE_WRITE = 23  # Linux >= 5.14; older kernels answer EINVAL and pages fault in as usual
_PAGE = mmap.PAGESIZE
_BYTES_DATA = bytes.__basicsize__ - 1  # offset of a bytes object's data (CPython)


class Native(NamedTuple):
    """The native calls (ctypes functions); None where there are none (not CPython)."""

    new_bytes: Any
    """``PyBytes_FromStringAndSize``: an uninitialised ``bytes`` (with a NULL source)."""
    madvise: Any
    mmap: Any
    munmap: Any


_native: Native | None = None


def native() -> Native:
    """The native calls, loaded (with ctypes) at the first use."""
    global _native
    if _native is not None:
        return _native
    import ctypes

    calls = dict.fromkeys(Native._fields)
    if sys.implementation.name == "cpython":
        new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
        new_bytes.restype = ctypes.py_object
        new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
        calls["new_bytes"] = new_bytes
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            calls["madvise"], calls["mmap"], calls["munmap"] = libc.madvise, libc.mmap, libc.munmap
            libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            libc.madvise.restype = ctypes.c_int
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = (
                ctypes.c_void_p,
                ctypes.c_size_t,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_long,
            )
            libc.munmap.restype = ctypes.c_int
            libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    _native = Native(**calls)
    return _native


def receive_buffer(n: int) -> bytearray | mmap.mmap:
    """A writable buffer of ``n`` bytes that the receiver will own (large ones: not committed yet)."""
    if n < MAPPED:
        return bytearray(n)
    return mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def fresh_bytes(n: int) -> bytes | bytearray | mmap.mmap:
    """An uninitialised ``bytes`` of ``n`` bytes to receive into.

    Where that cannot be made (not CPython), a buffer from :func:`receive_buffer`.
    """
    new_bytes = native().new_bytes
    if new_bytes is None:
        return receive_buffer(n)
    fresh: bytes = new_bytes(None, n)
    return fresh


def populate_ahead(view: memoryview, at: int, n: int) -> int:
    """Populate the pages of ``view[at:]`` up to a step ahead; returns where that step ends.

    Receiving into populated pages costs a copy; into unpopulated ones, a fault
    per page as well (dear on a VM). Small buffers are left alone.
    """
    end = min(n, at + STEP)
    madvise = native().madvise if n >= MAPPED else None
    if madvise is None:
        return n
    import ctypes  # loaded by native()

    start = ctypes.addressof(ctypes.c_char.from_buffer(view)) + at
    first, last = -(-start // _PAGE) * _PAGE, (start + (end - at)) // _PAGE * _PAGE
    if last > first:
        madvise(first, last - first, _MADV_POPULATE_WRITE)
    return end


def writable(fresh: bytes | bytearray | mmap.mmap) -> memoryview:
    """A writable view of a buffer from :func:`fresh_bytes` or :func:`receive_buffer`.

    For a ``bytes`` object, which nothing else has seen yet, a view of its data.
    """
    if type(fresh) is not bytes:
        return memoryview(fresh)
    import ctypes  # loaded by native(): fresh_bytes made a bytes

    return memoryview((ctypes.c_char * len(fresh)).from_address(id(fresh) + _BYTES_DATA)).cast("B")
