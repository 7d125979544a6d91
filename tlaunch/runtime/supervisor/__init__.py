"""A node's supervisor: ``python -m tlaunch.runtime.supervisor FILE COORDINATOR``.

It runs in the node's tmux window on the node's host and:

* reads its file (the node, the run's keys, environment and restart policy) and
  deletes it at once, so no secret rests on the host's disk while the run goes on;
* starts the node process (``node_main -``, the bundle on its stdin; the first
  one forked from the supervisor where that changes nothing,
  :mod:`tlaunch.runtime.forked`) as the leader of a new process group, and
  copies its output to the pane and to the node's log file;
* heartbeats to the coordinator (a long poll that also carries the stop signal),
  each beat with a resource sample of the node's processes (:mod:`tlaunch.runtime.sampling`);
* on stop: waits the grace period, then SIGTERM, then SIGKILL to the node's
  whole process group;
* when the node fails: restarts it after a backoff while restarts are left,
  else reports the failure (exit code or signal, the node's traceback);
* when the coordinator cannot be reached for ``coordinator_lost_after`` seconds
  (the run's head host is gone), stops the node: nothing outlives its run;
* gives each node process a ``$TMPDIR`` of its own (:mod:`tlaunch.runtime.nodetmp`)
  and removes it as the process ends, before its end is reported: what a node
  left there, killed with SIGKILL or not, goes with it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from tlaunch.errors import RPCError
from tlaunch.rpc import shm
from tlaunch.runtime import node_main
from tlaunch.runtime.bundle import Bundle
from tlaunch.runtime.forked import ForkedNode, can_fork, fork_node
from tlaunch.runtime.node_main import coordinator_client
from tlaunch.runtime.node_runtime import RuntimeConfig
from tlaunch.runtime.nodelog import NodeLog, wait_with_output
from tlaunch.runtime.nodetmp import NodeTmp, sweep
from tlaunch.runtime.private import take_file
from tlaunch.runtime.restarts import RestartPolicy, supervise
from tlaunch.runtime.slots import slot_of

if TYPE_CHECKING:
    import subprocess

__all__ = ["NodeFile", "address_in", "main"]

log = logging.getLogger("tlaunch.supervisor")

FIRST_BEAT = 1.0
"""Seconds from a forked node's start to its supervisor's first heartbeat (see ``Supervisor.run``)."""


class NodeFile(NamedTuple):
    """What a supervisor needs: shipped to its host as one file (mode 0600)."""

    config: RuntimeConfig
    key: str
    node: bytes
    log_path: str
    env: Mapping[str, str] = {}  # shared by every file without: read only
    max_restarts: int = 0
    backoff: float = 1.0
    workdir: str | None = None
    keep: bool = False  # leave this file in place once read (keep_bundles)
    pythonpath: tuple[str, ...] = ()  # folders put on the node's PYTHONPATH (shipped modules)
    buffers: tuple[str, ...] = ()  # files of the node's out-of-band buffers: links it removes at its end
    # Its marker among those of its host's nodes: the last supervisor to remove its own (the
    # folder then empties) removes ``shipped`` too (the working dir, modules: shared by them).
    # None: no marker (the host's only node removes ``shipped`` as it leaves).
    alive: str | None = None
    shipped: tuple[str, ...] = ()


class Supervisor:
    """Runs one node process at a time (see the module docstring)."""

    def __init__(self, spec: NodeFile, coordinator: str) -> None:
        self.spec = spec
        self.address = ""  # the coordinator's, once found
        # host:port, or the file the launcher writes it to (absolute: we may chdir to a working dir)
        self.coordinator = coordinator if ":" in coordinator else os.path.abspath(coordinator)
        self.coord: Any = None
        self.payload = b""
        self.log_path = os.path.abspath(spec.log_path)  # relative to the home directory we start in
        self.pythonpath = [os.path.abspath(os.path.expanduser(p)) for p in spec.pythonpath]
        self.buffers = tuple(os.path.abspath(p) for p in spec.buffers)
        self.alive = os.path.abspath(spec.alive) if spec.alive else None
        self.shipped = tuple(os.path.abspath(p) for p in spec.shipped)
        self.stopping = threading.Event()
        self.proc: subprocess.Popen[bytes] | ForkedNode | None = None
        self.lost = False
        self.tmp: NodeTmp | None = None  # the node process's own $TMPDIR: made as it starts, gone as it ends
        self.tmp_parent = ""
        self.handed_off = False  # its connection to the coordinator went to its forked node
        self.signalled = False  # a stop sent its node a signal (its exit is not its own failure)

    # -- heartbeat and stop ---------------------------------------------
    def _heartbeat(self, after: float = 0.0) -> None:
        """Heartbeat (``after`` s from now) until the run stops or the coordinator is lost."""
        self.stopping.wait(after)
        from tlaunch.runtime.sampling import GpuSampler, TreeSampler  # here: it runs after the start

        sampler = TreeSampler(GpuSampler())
        last_ok = time.monotonic()
        while not self.stopping.is_set():
            try:
                if self.coord.report(self.spec.key, sampler.sample_of(self.proc), 1.0):
                    break
                last_ok = time.monotonic()
            except RPCError as exc:
                if time.monotonic() - last_ok > self.spec.config.coordinator_lost_after:
                    log.error("lost the coordinator (%s): stopping the node", exc)
                    self.lost = True
                    break
                time.sleep(0.2)
        self.stopping.set()
        self._stop_node()

    def _stop_node(self) -> None:
        proc = self.proc
        if proc is None:
            return
        expired: type[Exception] = TimeoutError  # a forked node's wait's
        if not isinstance(proc, ForkedNode):
            import subprocess  # loaded already: it started this node (a restart)

            expired = subprocess.TimeoutExpired
        for sig, wait in ((None, self._grace()), (signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            if sig is not None:
                self.signalled = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
            with contextlib.suppress(expired):
                proc.wait(wait)
                if sig is not None:
                    # The leader is gone; its group may not be: finish it.
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                return

    def _grace(self) -> float:
        """The grace of the current stop: shorter when a node's failure stopped the run."""
        if self.lost or self.coord is None:
            return self.spec.config.stop_grace
        try:
            return float(self.coord.call("stop_grace", timeout=2.0))
        except RPCError:
            return self.spec.config.stop_grace

    # -- the coordinator ------------------------------------------------
    def _connect(self, timeout: float = 120.0) -> None:
        """Find the coordinator (waiting for its address file if need be) and make the node's bundle.

        On the head's host, supervisors start while the head does, which writes
        ``coordinator.addr`` next to them once it serves; elsewhere the address comes on
        their command line.
        """
        address = self.coordinator
        if ":" not in address:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    with open(address) as f:
                        address = address_in(f.read())
                    break
                except (OSError, ValueError, KeyError):
                    if self.stopping.is_set() or time.monotonic() > deadline:
                        raise TimeoutError(
                            f"no coordinator address in {address} after {timeout:.0f} s"
                        ) from None
                    time.sleep(0.01)
        self.coord = coordinator_client(address, self.spec.config)
        self.address = address
        buffers = {self.spec.key: self.buffers} if self.buffers else {}
        self.payload = pickle.dumps(
            Bundle(self.spec.config, address, {self.spec.key: self.spec.node}, buffers),
            protocol=pickle.HIGHEST_PROTOCOL,
        )

    # -- the node -------------------------------------------------------
    def _spawn(self, first: bool = False) -> subprocess.Popen[bytes] | ForkedNode:
        """Start the node's process; it reads its bundle on stdin.

        The first one is forked from this process where that is the same as an
        exec (:mod:`tlaunch.runtime.forked`: tlaunch is imported already); else,
        and for every restart, a new interpreter imports while we wait.
        """
        env = {**os.environ, **self.spec.env, "PYTHONUNBUFFERED": "1"}
        placed, cpus = slot_of(env, self.spec.config.host_name)  # a job the server's pool placed
        env.update(placed)
        if cpus:
            os.sched_setaffinity(0, cpus)  # the node, and all it starts, inherit it
        self.tmp_parent = env.get("TMPDIR") or "/tmp"
        self.tmp = NodeTmp.make(self.tmp_parent, self.spec.config.run_id)
        if self.tmp is not None:
            env["TMPDIR"] = self.tmp.path
        front = [os.getcwd()] if self.spec.workdir else []
        if front or self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (*front, *self.pythonpath, env.get("PYTHONPATH")) if p
            )
        args = ["-", self.spec.key, self.spec.config.run_id]
        if first and can_fork(env):
            # The TLS context (and OpenSSL's start, ~1.5 ms a process) and this host's key are
            # made once, here: the forked node finds them made. One context does for both:
            # the node's server and every call to the coordinator, this process's too, take
            # the TLS server's part (RPCServer's tls_client); a node that calls others makes
            # a client's context when it first does. The node goes on with this process's
            # connection to the coordinator (a TLS handshake less on its way to serving, two
            # processes' CPU on a busy host): this process gives it up, and opens another
            # when it next calls.
            self.spec.config.keys.context(server=True)
            shm.host_key()
            keep: list[int] = []
            if self.coord is not None:
                keep = self.coord.idle_descriptors()
                node_main.inherit(self.address, self.coord)
            try:
                path = [*front, *self.pythonpath]
                node = fork_node([node_main.__file__, *args], env, path, node_main.main, keep)
            finally:
                node_main.inherit(None)
            if self.coord is not None:
                self.coord.hand_off()
                self.handed_off = bool(keep)
            return node
        import subprocess  # here: only a restart execs (~1.5 ms of every host's start, with locale)

        proc = subprocess.Popen(
            [sys.executable, "-m", "tlaunch.runtime.node_main", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        return proc

    def drop_tmp(self) -> None:
        """Remove the ended node process's own ``$TMPDIR``."""
        if self.tmp is not None:
            self.tmp.remove()
            self.tmp = None

    def _feed(self, proc: subprocess.Popen[bytes] | ForkedNode) -> None:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(self.payload)
            proc.stdin.close()

    def _pump(self, proc: subprocess.Popen[bytes] | ForkedNode, log_file: NodeLog) -> None:
        stream = proc.stdout
        assert isinstance(stream, io.BufferedReader)
        out = sys.stdout.buffer
        for chunk in iter(lambda: stream.read1(1 << 16), b""):
            log_file.write(chunk)
            with contextlib.suppress(OSError):  # the pane may be gone (tmux killed)
                out.write(chunk)
                out.flush()

    def run(self) -> int:
        """Supervise until the node is done, failed for good, or the run stops."""
        key = self.spec.key
        self._connect()
        self.coord.supervisor_started(key, os.getpid())
        self.proc = first = self._spawn(first=True)  # with this process's connection, where forked
        self._feed(first)
        # A supervisor that handed its connection to its node beats first a second later: its
        # new connection's handshake comes after the launch's busiest part. A stop meanwhile
        # reaches the node by its own watch (a node outlives a stop it saw by its grace at
        # most), and the supervisor with its first beat.
        after = FIRST_BEAT if self.handed_off else 0.0
        threading.Thread(target=self._heartbeat, args=(after,), name="tlaunch-heartbeat", daemon=True).start()
        policy = RestartPolicy(self.spec.max_restarts, self.spec.backoff)
        with NodeLog(self.log_path) as log_file:

            def attempt(n: int) -> int:
                proc = first if n == 0 else self._spawn()
                self.proc = proc
                if n > 0:  # the first was fed as it started
                    self._feed(proc)
                if self.stopping.is_set():
                    self._stop_node()
                log_file.mark()
                try:
                    return wait_with_output(proc, lambda: self._pump(proc, log_file))
                finally:
                    self.drop_tmp()  # before its end is reported: the run may end with it

            def note(line: str) -> None:
                log_file.write(f"{line}\n".encode())

            return supervise(
                key, policy, attempt, self.stopping, self.coord, note, log_file.tail, lambda: self.signalled
            )


def _leave(buffers: tuple[str, ...], alive: str | None, shipped: tuple[str, ...]) -> None:
    """Remove what was shipped for this node as it leaves (not with ``keep_bundles``).

    Its links to shared values go (the last link frees a value); the last node
    of its host to leave (the markers' folder empties, and ``rmdir`` succeeds
    for one only; a host's only node has no marker) removes what they shared:
    a run whose launcher is gone leaves nothing behind either.
    """
    for path in buffers:  # the last link removed frees the value
        with contextlib.suppress(OSError):
            os.unlink(path)
    if alive is not None:
        with contextlib.suppress(OSError):
            os.unlink(alive)
        try:
            os.rmdir(os.path.dirname(alive))
        except OSError:
            return  # another node of this host still runs
    if not shipped:
        return
    import shutil  # here: its import (with bz2's and lzma's) is a node's start's cost

    for path in shipped:
        shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str]) -> int:
    """Supervise the node of file ``argv[0]``; ``argv[1]``: the coordinator's address, or its address file."""
    if len(argv) != 2:
        print(
            "usage: python -m tlaunch.runtime.supervisor NODE_FILE COORDINATOR_ADDRESS|ADDRESS_FILE",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    path, address = argv
    try:
        spec = take_file(path, NodeFile)
    except (OSError, TypeError) as exc:
        print(f"tlaunch supervisor: {exc}", file=sys.stderr)
        return 2
    supervisor = Supervisor(spec, address)
    # SIGTERM, or SIGHUP (its tmux window was killed): stop the node cleanly; the heartbeat thread does it.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: supervisor.stopping.set())
    if spec.workdir:
        os.chdir(os.path.expanduser(os.path.join("~", spec.workdir)))
    try:
        return supervisor.run()
    except Exception:
        import traceback

        tb = traceback.format_exc()
        sys.stderr.write(tb)
        if supervisor.coord is not None:
            with contextlib.suppress(RPCError):
                supervisor.coord.node_finished(spec.key, False, tb, None, "its supervisor failed")
        supervisor.stopping.set()
        supervisor._stop_node()
        return 1
    finally:
        if supervisor.coord is not None:
            supervisor.coord.close()
        if not spec.keep:
            _leave(supervisor.buffers, supervisor.alive, supervisor.shipped)
        supervisor.drop_tmp()  # a node that never got its bundle
        if supervisor.tmp_parent:
            sweep(supervisor.tmp_parent)  # what nodes whose supervisor was killed left
        shm.sweep(min_age=5.0)  # shared-memory buffers of senders that died (this node among them)


def address_in(text: str) -> str:
    """The address in a ``coordinator.addr`` (``{"address": "HOST:PORT", "pid": N}``, as
    :mod:`tlaunch.runtime.head` writes it), read without loading json (~1.5 ms of every
    supervisor's start) unless it is written otherwise.

    Raises:
        ValueError: ``text`` is not such a file (yet: it is being written).
        KeyError: it has no address.
    """
    key = '{"address": "'
    end = text.find('"', len(key))
    whole = text.startswith(key) and text.rstrip().endswith("}")
    if whole and end > 0 and "\\" not in text[len(key) : end]:
        return text[len(key) : end]
    import json

    address = json.loads(text)["address"]
    if not isinstance(address, str):
        raise ValueError(f"the address in a coordinator.addr is {address!r}, not a string")
    return address
