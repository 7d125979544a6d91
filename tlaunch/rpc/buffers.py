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
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import sys

__all__ = ["MAPPED", "fresh_bytes", "populate_ahead", "receive_buffer", "writable"]

# Buffers from this size up are mapped memory whose pages are populated a step
# at a time, just ahead of the data (memory is committed as data arrives, never
# for a size a peer merely claims); below it, malloc mostly hands back memory
# already faulted in by an earlier message.
MAPPED = 4 << 20
STEP = 16 << 20

_MADV_POPULATE_WRITE = 23  # Linux >= 5.14; older kernels answer EINVAL and pages fault in as usual
_PAGE = mmap.PAGESIZE
_BYTES_DATA = bytes.__basicsize__ - 1  # offset of a bytes object's data (CPython)

_new_bytes = None
_madvise = None
if sys.implementation.name == "cpython":
    _new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
    _new_bytes.restype = ctypes.py_object
    _new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
    with contextlib.suppress(OSError, AttributeError):
        _madvise = ctypes.CDLL(None, use_errno=True).madvise
        _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        _madvise.restype = ctypes.c_int


def receive_buffer(n: int) -> bytearray | mmap.mmap:
    """A writable buffer of ``n`` bytes that the receiver will own (large ones: not committed yet)."""
    if n < MAPPED:
        return bytearray(n)
    return mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def fresh_bytes(n: int) -> bytes | bytearray | mmap.mmap:
    """An uninitialised ``bytes`` of ``n`` bytes to receive into.

    Where that cannot be made (not CPython), a buffer from :func:`receive_buffer`.
    """
    if _new_bytes is None:
        return receive_buffer(n)
    fresh: bytes = _new_bytes(None, n)
    return fresh


def populate_ahead(view: memoryview, at: int, n: int) -> int:
    """Populate the pages of ``view[at:]`` up to a step ahead; returns where that step ends.

    Receiving into populated pages costs a copy; into unpopulated ones, a fault
    per page as well (dear on a VM). Small buffers are left alone.
    """
    end = min(n, at + STEP)
    if n < MAPPED or _madvise is None:
        return n
    start = ctypes.addressof(ctypes.c_char.from_buffer(view)) + at
    first, last = -(-start // _PAGE) * _PAGE, (start + (end - at)) // _PAGE * _PAGE
    if last > first:
        _madvise(first, last - first, _MADV_POPULATE_WRITE)
    return end


def writable(fresh: bytes | bytearray | mmap.mmap) -> memoryview:
    """A writable view of a buffer from :func:`fresh_bytes` or :func:`receive_buffer`.

    For a ``bytes`` object, which nothing else has seen yet, a view of its data.
    """
    if type(fresh) is not bytes:
        return memoryview(fresh)
    return memoryview((ctypes.c_char * len(fresh)).from_address(id(fresh) + _BYTES_DATA)).cast("B")
