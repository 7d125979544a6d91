"""A node's first process forked from its supervisor, which has imported what the node needs.

A node's interpreter started with ``python -m tlaunch.runtime.node_main``
spends ~0.1 s of CPU starting and importing tlaunch before it reads its
bundle; its supervisor has done that work already. While the supervisor is
still single-threaded it can fork the node instead: the child becomes what
the exec'd interpreter would have been (a process group of its own, the
bundle on stdin, stdout and stderr into one pipe, the node's environment and
``sys.path``, the same ``argv``) and runs :func:`tlaunch.runtime.node_main.main`.

It is only done where the result is the same as an exec: on Linux, with one
thread, with ``os.pidfd_open`` (to wait with a timeout from any thread), and
when the node's environment changes nothing that only an interpreter's or the
C library's start reads (``PYTHON*`` but ``PYTHONPATH``/``PYTHONUNBUFFERED``,
``LD_*``, ``MALLOC_*``, ``GLIBC_TUNABLES``, the locale); anything else, and
every restart, execs. ``TLAUNCH_FORK_NODES=0`` in the node's or the
supervisor's environment turns it off.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import IO, NoReturn

from tlaunch.rpc.readiness import wait_readable

__all__ = ["ForkedNode", "can_fork", "fork_node"]

SWITCH = "TLAUNCH_FORK_NODES"
_AT_START = ("LD_", "MALLOC_", "GLIBC_TUNABLES", "LANG", "LC_", "PYTHON")
_PYTHON_OK = ("PYTHONPATH", "PYTHONUNBUFFERED")


def can_fork(env: Mapping[str, str]) -> bool:
    """Whether a node with environment ``env`` (all of it) can be forked from this process."""
    if not sys.platform.startswith("linux") or not _pidfd_works() or not _unbuffered():
        return False
    if "0" in (os.environ.get(SWITCH), env.get(SWITCH)) or threading.active_count() != 1:
        return False
    for name, value in env.items():
        if os.environ.get(name) == value or name in _PYTHON_OK:
            continue
        if name.startswith(_AT_START):
            return False
    return True


def _pidfd_works() -> bool:
    """Whether this kernel has ``pidfd_open`` (Linux 5.3), asked before anything is forked."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


def _unbuffered() -> bool:
    """Whether this process's stdout and stderr are as ``-u`` makes them (the node's are these)."""
    return all(
        isinstance(s, io.TextIOWrapper) and s.write_through and isinstance(s.buffer, io.FileIO)
        for s in (sys.stdout, sys.stderr)
    )


class ForkedNode:
    """The supervisor's side of a forked node: what it uses of :class:`subprocess.Popen`."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self.pid = pid
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = stdout
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)  # readable once the node has ended; closed with this object
        weakref.finalize(self, os.close, self._pidfd)
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        """The exit code once the node has ended (reaping it), else None."""
        with self._lock:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the end (from any thread), as ``subprocess.Popen.wait`` does but that it
        raises ``TimeoutError`` (a supervisor stops its node without loading subprocess).

        Raises:
            TimeoutError: still running after ``timeout``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"the node (pid {self.pid}) still runs after {timeout} s")
            wait_readable([_Fd(self._pidfd)], left)
        return code


def _name(name: bytes) -> None:
    """This process's name in ps and top (as ``prctl(PR_SET_NAME)``, without loading ctypes)."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "wb") as comm:
        comm.write(name)


class _Fd:
    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd


def fork_node(
    argv: Sequence[str],
    env: Mapping[str, str],
    path: Sequence[str],
    main: Callable[[list[str]], int],
    keep: Sequence[int] = (),
) -> ForkedNode:
    """Fork the node: in the child ``sys.argv = argv``, ``os.environ = env``, ``path`` first on ``sys.path``.

    The child runs ``main(argv[1:])`` as ``python -m`` would run its module, then
    the exit handlers, and exits with its code; it never returns here. Of this
    process's descriptors past 2 it keeps ``keep`` alone (connections it goes on with).
    """
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child (its coverage is the node's)
        _child(in_r, out_w, argv, env, path, main, keep)  # its copies of in_w and out_r go with the rest
    os.close(in_r)
    os.close(out_w)
    return ForkedNode(pid, open(in_w, "wb"), open(out_r, "rb"))


def _child(
    in_r: int,
    out_w: int,
    argv: Sequence[str],
    env: Mapping[str, str],
    path: Sequence[str],
    main: Callable[[list[str]], int],
    keep: Sequence[int],
) -> NoReturn:
    code = 1
    try:
        os.setsid()
        _name(b"tlaunch-node")  # in ps and top; its command line stays its supervisor's
        os.dup2(in_r, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        start = 3  # as an exec'd node (close_fds): only 0-2 of ours, and ``keep``
        for fd in sorted({*keep, os.sysconf("SC_OPEN_MAX")}):
            os.closerange(start, fd)
            start = fd + 1
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(env)
        time.tzset()
        if "tempfile" in sys.modules:  # it keeps the folder it first found: find $TMPDIR anew
            import tempfile

            tempfile.tempdir = None
        # As ``python -m``: the working directory first, then PYTHONPATH's folders, then the rest.
        rest = sys.path[1:]
        sys.path[:] = [os.getcwd(), *[p for p in path if p not in rest], *rest]
        sys.argv[:] = list(argv)
        code = main(list(argv[1:]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        import atexit

        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()  # the user's exit handlers still run
        os._exit(code)
