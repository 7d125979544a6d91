"""Large buffers between processes of one host, as sealed memory files.

When both ends of a connection see the same ``/dev/shm`` as the same user
(same kernel boot, same tmpfs, same uid: :func:`host_key`, compared when the
connection opens), the connection gets a Unix socket beside its TLS one, and a
large out-of-band buffer does not cross TLS and the loopback:

* the sender writes it into a fresh memory file (``memfd_create``, never in
  any directory) and *seals* it: no write, no shrinking, no growing, by
  anyone, from then on (``F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW``), and
  passes the descriptor over the Unix socket (``SCM_RIGHTS``,
  :mod:`tlaunch.rpc.fdpass`); the message on TLS carries only the buffer's
  size, flagged;
* the receiver checks that the descriptor is a regular file of exactly the
  announced size carrying those seals, and maps it privately: its arrays are
  its own and writable (copy on write), and neither the sender nor anyone else
  can change the pages under them or shrink the file (no ``SIGBUS``); nothing
  is copied on the way in;
* a received buffer sent on whole and unchanged (an echo, a relay) goes on as
  the same sealed file, without a copy (:func:`seal`).

Nothing is left behind: a file has no name, and the kernel frees it with its
last descriptor or mapping; descriptors in flight when a connection closes go
with the socket. Only the Unix socket's rendezvous has a name, for the moment
between the greeting and the peer's connect: ``/dev/shm/tlaunch-<pid>-<128
random bits>``, mode 0600, removed once accepted (:func:`sweep` removes those
of a server that died in that moment).

Measured on the 2-core test VM, a 256 MiB numpy round trip between two
processes: ~590 MiB/s over TLS, ~1.1 GiB/s through 0600 files copied on
arrival, ~2.1 GiB/s through files mapped unsealed (which a sender could change
or shrink under the receiver), and this way: see ``docs/benchmarks.md``.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import mmap
import os
import re
import socket
import stat
import sys
import threading
import time
import weakref

from tlaunch.procs import pid_exists
from tlaunch.rpc.buffers import populate_ahead

__all__ = ["DIR", "MIN_SIZE", "NAME", "host_key", "read_into", "seal", "sweep", "take"]

MIN_SIZE = 512 << 10  # buffers from this size up travel as sealed memory files
DIR = "/dev/shm"
NAME = re.compile(rb"tlaunch-(\d+)-[0-9a-f]{32}")  # a rendezvous of tlaunch.rpc.fdpass
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW if hasattr(fcntl, "F_SEAL_WRITE") else 0

_key: bytes | None = None
_key_known = False

# Received files kept for passing on, by the address of their mapping: (descriptor, size).
_KEEP = 64
_kept: dict[int, tuple[int, int]] = {}
_kept_lock = threading.Lock()
_pagemap_fd: int | None = None
_pagemap_pid = 0
# The top byte of a /proc/self/pagemap entry (bits 56-63) of a page not written in a
# private file mapping: not present and not swapped (bit 63 and 62 clear), or present
# and the file's own page (bits 63 and 61). Bits 56-58 (exclusive, uffd-wp, guard) vary.
_FILE_OR_ABSENT = bytes(b for b in range(256) if not b & 0x40 and (not b & 0x80 or b & 0x20))

_mmap = _munmap = None
_MAP_FAILED = ctypes.c_void_p(-1).value
if sys.implementation.name == "cpython":
    with contextlib.suppress(OSError, AttributeError):
        _libc = ctypes.CDLL(None, use_errno=True)
        _mmap, _munmap = _libc.mmap, _libc.munmap
        _mmap.restype = ctypes.c_void_p
        _mmap.argtypes = (
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        )
        _munmap.restype = ctypes.c_int
        _munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)


def host_key() -> bytes | None:
    """What two processes must share to exchange buffers here; None where they cannot."""
    global _key, _key_known
    if _key_known:
        return _key
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read().strip()
        st = os.stat(DIR)
        usable = (
            stat.S_ISDIR(st.st_mode)
            and os.access(DIR, os.W_OK | os.X_OK)
            and hasattr(os, "memfd_create")
            and _SEALS != 0
            and hasattr(socket, "SCM_RIGHTS")
        )
    except OSError:
        usable = False
    if usable:
        _key = hashlib.sha256(b"%s %d %d %d" % (boot, st.st_dev, st.st_ino, os.getuid())).digest()
    _key_known = True
    return _key


# -- buffers --------------------------------------------------------------------------


def seal(view: memoryview) -> int | None:
    """A sealed memory file holding ``view``'s bytes; its descriptor, or None (send it inline).

    ``view`` may be a buffer received as a sealed file and left unchanged (a
    relay, an echo): its file goes on as it is, without a copy (:func:`_forward`).
    """
    fd = _forward(view)
    if fd is not None:
        return fd
    try:
        fd = os.memfd_create("tlaunch", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError:
        return None
    try:
        done, n = 0, view.nbytes
        while done < n:
            done += os.pwrite(fd, view[done:], done)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS | fcntl.F_SEAL_SEAL)
    except OSError:  # out of memory: the caller sends the buffer inline
        os.close(fd)
        return None
    return fd


def _check(fd: int, n: int) -> None:
    """Refuse anything but a regular file of exactly ``n`` bytes that nobody can change."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != n:
        raise ValueError(f"a shared buffer is not the {n} bytes announced")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as exc:
        raise ValueError("a shared buffer is not a sealed memory file") from exc
    if seals & _SEALS != _SEALS:
        raise ValueError("a shared buffer is not sealed against writing and resizing")


def take(fd: int, n: int) -> memoryview:
    """The sealed file ``fd`` of ``n`` bytes, mapped privately (the caller's to change).

    ``fd`` is closed, or kept while the mapping lives for :func:`seal` to pass on
    (at most :data:`_KEEP` at a time). The mapping itself holds no descriptor
    (``mmap.mmap`` keeps a copy of its file's: a program keeping a thousand
    received arrays would run out of them); it is unmapped once nothing uses it.

    Raises:
        ValueError: it is not a sealed memory file of ``n`` bytes.
        OSError: it cannot be mapped.
    """
    try:
        _check(fd, n)
        view, kept = _map_private(fd, n)
    except BaseException:
        os.close(fd)
        raise
    if not kept:
        os.close(fd)
    return view


def _map_private(fd: int, n: int) -> tuple[memoryview, bool]:
    """A private mapping of ``fd``, and whether ``fd`` was kept for forwarding."""
    if _mmap is None or _munmap is None:  # not CPython: a mapping that keeps a descriptor
        return memoryview(
            mmap.mmap(fd, n, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        ), False
    addr = _mmap(None, n, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    memory = (ctypes.c_char * n).from_address(addr)
    kept = _pagemap() is not None
    if kept:
        with _kept_lock:
            _kept[addr] = (fd, n)
            if len(_kept) > _KEEP:  # the oldest can no longer be passed on: it will be copied
                os.close(_kept.pop(next(iter(_kept)))[0])
    weakref.finalize(memory, _unmap, addr, n)  # when the last view of it is gone
    return memoryview(memory).cast("B"), kept


def _unmap(addr: int, n: int) -> None:
    assert _munmap is not None
    with _kept_lock:
        entry = _kept.pop(addr, None)
        if entry is not None:
            os.close(entry[0])
    _munmap(addr, n)


def _forward(view: memoryview) -> int | None:
    """A new descriptor of the sealed file ``view`` was received as, if it is all of that
    file and no page of it was written since; else None.

    A private mapping's page that was written is the process's own (anonymous);
    one that was not is still the file's, or not there: ``/proc/self/pagemap``
    tells them apart.
    """
    if not _kept or view.readonly or not view.c_contiguous:
        return None
    addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
    with _kept_lock:
        entry = _kept.get(addr)
        if entry is None or entry[1] != view.nbytes or not _unchanged(addr, view.nbytes):
            return None
        return os.dup(entry[0])  # under the lock: the kept descriptor cannot be closed meanwhile


def _unchanged(addr: int, n: int) -> bool:
    """Whether no page of the private file mapping at ``addr`` (``n`` bytes) was written."""
    pagemap = _pagemap()
    if pagemap is None:
        return False
    first, last = addr // mmap.PAGESIZE, (addr + n - 1) // mmap.PAGESIZE
    try:
        entries = os.pread(pagemap, 8 * (last - first + 1), 8 * first)
    except OSError:
        return False
    return not entries[7::8].translate(None, _FILE_OR_ABSENT)  # the top byte of each entry


def _pagemap() -> int | None:
    """This process's ``/proc/self/pagemap`` (opened anew in a forked child); None if unreadable."""
    global _pagemap_fd, _pagemap_pid
    if _pagemap_pid != os.getpid():
        if _pagemap_fd is not None and _pagemap_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(_pagemap_fd)  # the parent's, inherited across a fork
        try:
            _pagemap_fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            _pagemap_fd = -1
        _pagemap_pid = os.getpid()
    return None if _pagemap_fd is None or _pagemap_fd < 0 else _pagemap_fd


def read_into(fd: int, target: memoryview) -> None:
    """Copy the sealed file ``fd`` into ``target`` (a fresh ``bytes``, say); closes ``fd``.

    Raises:
        ValueError: it is not a sealed memory file of ``target``'s size.
        OSError: it cannot be read.
    """
    n = target.nbytes
    try:
        _check(fd, n)
        done = 0
        while done < n:
            end = populate_ahead(target, done, n)
            got = os.preadv(fd, [target[done:end]], done)
            if not got:
                raise ValueError("a shared buffer ended early")
            done += got
    finally:
        os.close(fd)


def sweep(min_age: float = 60.0) -> int:
    """Remove this user's rendezvous names (:mod:`tlaunch.rpc.fdpass`) whose server died; how many."""
    removed = 0
    try:
        entries = list(os.scandir(DIR))
    except OSError:
        return 0
    now = time.time()
    for entry in entries:
        m = NAME.fullmatch(entry.name.encode())
        if not m:
            continue
        with contextlib.suppress(OSError):
            st = entry.stat(follow_symlinks=False)
            if st.st_uid != os.getuid() or now - st.st_mtime < min_age or pid_exists(int(m.group(1))):
                continue
            os.unlink(entry.path)
            removed += 1
    return removed
