"""Large buffers between processes of one host, as sealed memory files.

When both ends of a connection see the same ``/dev/shm`` as the same user
(same kernel boot, same tmpfs, same uid: :func:`host_key`, compared when the
connection opens), the connection gets a Unix socket beside its TLS one, and a
large out-of-band buffer does not cross TLS and the loopback:

* the sender writes it into fresh memory files (``memfd_create``, never in
  any directory) and *seals* them: no write, no shrinking, no growing, by
  anyone, from then on (``F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW``), and
  passes the descriptors over the Unix socket (``SCM_RIGHTS``,
  :mod:`tlaunch.rpc.fdpass`); the message on TLS carries only the buffer's
  size and its number of files, flagged. A large buffer is cut into one
  piece per core (up to :data:`MAX_PIECES`), each a file of its own written
  by a thread of its own: a file's pages are allocated under its inode's lock,
  so one file fills at one core's pace (~2.5 GiB/s here), two files at twice
  that;
* the receiver checks that the descriptors are regular files carrying those
  seals, whose sizes add up to the announced size (every piece but the last a
  whole number of pages), and maps them privately, side by side in one range:
  its arrays are its own and writable (copy on write), and neither the sender
  nor anyone else can change the pages under them or shrink a file (no
  ``SIGBUS``); nothing is copied on the way in;
* a received buffer sent on whole and unchanged (an echo, a relay) goes on as
  the same sealed file, without a copy (:func:`seal`).

Nothing is left behind: a file has no name, and the kernel frees it with its
last descriptor or mapping (a large buffer's mapping is unmapped by a thread of
its own: freeing 256 MiB of pages takes ~30 ms, which a reply should not wait
for); descriptors in flight when a connection closes go
with the socket. Only the Unix socket's rendezvous has a name, for the moment
between the greeting and the peer's connect: ``/dev/shm/tlaunch-<pid>-<128
random bits>``, mode 0600, removed once accepted (:func:`sweep` removes those
of a server that died in that moment: :mod:`tlaunch.rpc.fdpass`'s).

Measured on the 2-core test VM, a 256 MiB numpy round trip between two
processes: ~590 MiB/s over TLS, ~1.1 GiB/s through 0600 files copied on
arrival, ~2.1 GiB/s through files mapped unsealed (which a sender could change
or shrink under the receiver), and this way: see ``docs/benchmarks.md``.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import socket
import stat
import threading
import weakref

from tlaunch.rpc.buffers import native, populate_ahead
from tlaunch.rpc.fdpass import DIR, NAME, sweep

__all__ = ["DIR", "MIN_SIZE", "NAME", "close_files", "host_key", "read_into", "seal", "sweep", "take"]

MIN_SIZE = 512 << 10  # buffers from this size up travel as sealed memory files
PIECE = 8 << 20  # a buffer is cut into pieces (files) of at least this size, one per core
MAX_PIECES = 4  # files per buffer written at most (the receiver takes up to 128)
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW if hasattr(fcntl, "F_SEAL_WRITE") else 0

_key: bytes | None = None
_key_known = False

# Received files kept for passing on, by the address of their mapping: (descriptors, size).
_KEEP = 64
_kept: dict[int, tuple[tuple[int, ...], int]] = {}
_kept_lock = threading.Lock()
_pagemap_fd: int | None = None
# The top byte of a /proc/self/pagemap entry (bits 56-63) of a page not written in a
# private file mapping: not present and not swapped (bit 63 and 62 clear), or present
# and the file's own page (bits 63 and 61). Bits 56-58 (exclusive, uffd-wp, guard) vary.
_FILE_OR_ABSENT = bytes(b for b in range(256) if not b & 0x40 and (not b & 0x80 or b & 0x20))

_MAP_FIXED = 0x10  # Linux (mman-common.h); not in the mmap module


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
        # As it is, not hashed: it goes only to the run's own processes, over TLS, and hashlib's
        # import (~1.5 ms) would delay a node's first answer to a caller's greeting.
        _key = b"%s %d %d %d" % (boot, st.st_dev, st.st_ino, os.getuid())
    _key_known = True
    return _key


# -- buffers --------------------------------------------------------------------------


def seal(view: memoryview) -> list[int] | None:
    """Sealed memory files holding ``view``'s bytes, in order; their descriptors, or None
    (send it inline).

    ``view`` may be a buffer received as sealed files and left unchanged (a
    relay, an echo): its files go on as they are, without a copy (:func:`_forward`).
    """
    fds = _forward(view)
    if fds is not None:
        return fds
    pieces = _pieces(view.nbytes)
    fds = []
    try:
        for _ in pieces:
            fds.append(os.memfd_create("tlaunch", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING))
    except OSError:
        close_files(fds)
        return None
    failed: list[OSError] = []

    def fill(fd: int, at: int, size: int) -> None:
        try:
            part, done = view[at : at + size], 0
            while done < size:
                done += os.pwrite(fd, part[done:], done)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS | fcntl.F_SEAL_SEAL)
        except OSError as exc:  # out of memory: the caller sends the buffer inline
            failed.append(exc)

    helpers = []
    for fd, (at, size) in list(zip(fds, pieces, strict=True))[1:]:
        helper = threading.Thread(target=fill, args=(fd, at, size), name="tlaunch-seal", daemon=True)
        try:
            helper.start()
        except RuntimeError:  # no thread to be had (interpreter shutdown, limits): fill it here
            fill(fd, at, size)
            continue
        helpers.append(helper)
    try:
        fill(fds[0], *pieces[0])
        for helper in helpers:
            helper.join()
    except BaseException:  # an interrupt: the helpers finish with the files before they are closed
        for helper in helpers:
            helper.join()
        close_files(fds)
        raise
    if failed:
        close_files(fds)
        return None
    return fds


def _pieces(n: int) -> list[tuple[int, int]]:
    """(offset, size) of the files ``n`` bytes are written into: one per usable core, at most
    :data:`MAX_PIECES`, each at least :data:`PIECE` bytes; every one but the last whole pages."""
    k = min(MAX_PIECES, n // PIECE, _cores())
    if k <= 1:
        return [(0, n)]
    step = -(-n // k // mmap.PAGESIZE) * mmap.PAGESIZE
    return [(at, min(step, n - at)) for at in range(0, n, step)]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def close_files(fds: list[int] | tuple[int, ...]) -> None:
    """Close the descriptors ``fds`` (those already closed too)."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _check(fds: list[int], n: int) -> list[int]:
    """Refuse anything but regular files that nobody can change, whose sizes add up to ``n``
    (each but the last a whole number of pages); their sizes."""
    sizes = []
    for fd in fds:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("a shared buffer is not a regular file")
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError as exc:
            raise ValueError("a shared buffer is not a sealed memory file") from exc
        if seals & _SEALS != _SEALS:
            raise ValueError("a shared buffer is not sealed against writing and resizing")
        sizes.append(st.st_size)
    if not fds or sum(sizes) != n or any(s <= 0 or s % mmap.PAGESIZE for s in sizes[:-1]):
        raise ValueError(f"a shared buffer's files are not the {n} bytes announced")
    return sizes


def take(fds: list[int], n: int) -> memoryview:
    """The sealed files ``fds`` (``n`` bytes in all), mapped privately side by side (the
    caller's to change).

    ``fds`` are closed, or kept while the mapping lives for :func:`seal` to pass on
    (at most :data:`_KEEP` buffers' at a time). The mapping itself holds no descriptor
    (``mmap.mmap`` keeps a copy of its file's: a program keeping a thousand
    received arrays would run out of them); it is unmapped once nothing uses it.

    Raises:
        ValueError: they are not sealed memory files of ``n`` bytes in all.
        OSError: they cannot be mapped.
    """
    try:
        sizes = _check(fds, n)
        view, kept = _map_private(fds, sizes, n)
    except BaseException:
        close_files(fds)
        raise
    if not kept:
        close_files(fds)
    return view


def _map_private(fds: list[int], sizes: list[int], n: int) -> tuple[memoryview, bool]:
    """A private mapping of the files ``fds`` side by side, and whether they were kept for forwarding."""
    calls = native()
    if calls.mmap is None:  # not CPython: a mapping that keeps a descriptor, or a copy
        if len(fds) > 1:
            copy = bytearray(n)
            _read(fds, sizes, memoryview(copy))
            return memoryview(copy), False
        return memoryview(
            mmap.mmap(fds[0], n, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        ), False
    import ctypes  # loaded by native()

    _mmap, _munmap = calls.mmap, calls.munmap
    rw = mmap.PROT_READ | mmap.PROT_WRITE
    if len(fds) == 1:
        addr = _mmap(None, n, rw, mmap.MAP_PRIVATE, fds[0], 0)
    else:  # a range of its own (PROT_NONE), then each file in its place in it
        addr = _mmap(None, n, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:  # MAP_FAILED
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    if len(fds) > 1:
        at = 0
        for fd, size in zip(fds, sizes, strict=True):
            if _mmap(addr + at, size, rw, mmap.MAP_PRIVATE | _MAP_FIXED, fd, 0) != addr + at:
                err = ctypes.get_errno()
                _munmap(addr, n)
                raise OSError(err, os.strerror(err))
            at += size
    memory = (ctypes.c_char * n).from_address(addr)
    kept = _pagemap() is not None
    if kept:
        with _kept_lock:
            _kept[addr] = (tuple(fds), n)
            if len(_kept) > _KEEP:  # the oldest can no longer be passed on: it will be copied
                close_files(_kept.pop(next(iter(_kept)))[0])
    weakref.finalize(memory, _unmap, addr, n)  # when the last view of it is gone
    return memoryview(memory).cast("B"), kept


def _unmap(addr: int, n: int) -> None:
    """Unmap a received buffer and close its kept files; a large one's in a thread of its own
    (its pages, the files' last users, are freed then: ~30 ms per 256 MiB)."""
    with _kept_lock:
        entry = _kept.pop(addr, None)
    fds = entry[0] if entry is not None else ()
    if n >= PIECE:
        with contextlib.suppress(RuntimeError):  # no thread to be had: here, then
            threading.Thread(target=_release, args=(fds, addr, n), name="tlaunch-unmap", daemon=True).start()
            return
    _release(fds, addr, n)


def _release(fds: tuple[int, ...], addr: int, n: int) -> None:
    native().munmap(addr, n)
    close_files(fds)


def _forward(view: memoryview) -> list[int] | None:
    """New descriptors of the sealed files ``view`` was received as, if it is all of them
    and no page of it was written since; else None.

    A private mapping's page that was written is the process's own (anonymous);
    one that was not is still the file's, or not there: ``/proc/self/pagemap``
    tells them apart.
    """
    if not _kept or view.readonly or not view.c_contiguous:
        return None
    import ctypes  # loaded by native(): something was kept

    addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
    with _kept_lock:
        entry = _kept.get(addr)
        if entry is None or entry[1] != view.nbytes or not _unchanged(addr, view.nbytes):
            return None
        return [os.dup(fd) for fd in entry[0]]  # under the lock: the kept ones cannot be closed meanwhile


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
    global _pagemap_fd
    if _pagemap_fd is None:
        try:
            _pagemap_fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            _pagemap_fd = -1
    return None if _pagemap_fd < 0 else _pagemap_fd


def _after_fork_in_child() -> None:
    """Let go of the parent's kept files and pagemap in a forked child, at once: while each
    number is still the child's copy. A child that closes what it inherited and opens its
    own (a forked node) could have those numbers closed under it later, or passed on as a
    buffer's files. Its buffers received before the fork are copied when passed on."""
    global _kept_lock, _pagemap_fd
    _kept_lock = threading.Lock()  # a thread of the parent may have held it: none runs here
    for fds, _ in _kept.values():
        close_files(fds)
    _kept.clear()
    if _pagemap_fd is not None and _pagemap_fd >= 0:
        close_files([_pagemap_fd])
    _pagemap_fd = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def read_into(fds: list[int], target: memoryview) -> None:
    """Copy the sealed files ``fds`` into ``target`` (a fresh ``bytes``, say); closes ``fds``.

    Raises:
        ValueError: they are not sealed memory files of ``target``'s size in all.
        OSError: they cannot be read.
    """
    try:
        _read(fds, _check(fds, target.nbytes), target)
    finally:
        close_files(fds)


def _read(fds: list[int], sizes: list[int], target: memoryview) -> None:
    n, at = target.nbytes, 0
    for fd, size in zip(fds, sizes, strict=True):
        done = 0
        while done < size:
            end = min(populate_ahead(target, at + done, n), at + size)
            got = os.preadv(fd, [target[at + done : end]], done)
            if not got:
                raise ValueError("a shared buffer ended early")
            done += got
        at += size
