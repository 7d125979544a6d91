"""A supervising thread per node process, for backends whose nodes are child processes of the launcher.

``local_mp`` starts each node as ``python -m tlaunch.runtime.node_main``;
``slurm`` starts each as an ``srun`` step that runs the same command on a node
of the allocation. Either way a thread of the launcher starts the process
(the node's bundle on its stdin), copies its output to the node's log and the
launcher's terminal, restarts it under its restart policy
(:func:`~tlaunch.runtime.restarts.supervise`) and reports its end to the
coordinator. :class:`NodeProcesses` holds those threads and ends their
processes (grace, SIGTERM, SIGKILL) on stop.

This is shared machinery of the backend layer, not a backend: backends never
import each other.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

from tlaunch.backends.base import OutputSink
from tlaunch.procs import MARKER
from tlaunch.runtime.nodelog import NodeLog, wait_with_output
from tlaunch.runtime.nodetmp import NodeTmp, sweep
from tlaunch.runtime.restarts import RestartPolicy, supervise

__all__ = ["NodeCommand", "NodeProcesses", "killpg", "launcher_python_path", "main_path_entry", "pump"]


@dataclass(frozen=True)
class NodeCommand:
    """How one node's process starts.

    Attributes:
        key: the node's key (``label/i``).
        argv: the command (it reads the node's bundle on stdin).
        payload: the pickled bundle written to its stdin; or a function that
            returns it, called once the process has started (a backend may start
            its processes while it still makes their bundles: their interpreters
            start meanwhile).
        env: its whole environment.
        log_path: its log file in the launcher's run directory.
        policy: its restart policy.
        own_tmp: a folder in which each of its processes gets a ``$TMPDIR`` of its
            own, removed as the process ends (with what a SIGKILL left there);
            None: the ``TMPDIR`` of ``env`` (a process on another machine).
    """

    key: str
    argv: Sequence[str]
    payload: bytes | Callable[[], bytes]
    env: dict[str, str]
    log_path: str
    policy: RestartPolicy
    own_tmp: str | None = None


class _Proc:
    """The current process of one node (it changes at each restart)."""

    __slots__ = ("popen", "signalled", "thread", "tmp")

    def __init__(self) -> None:
        self.popen: subprocess.Popen[bytes] | None = None
        self.thread: threading.Thread | None = None
        self.tmp: NodeTmp | None = None  # its own $TMPDIR, if any
        self.signalled = False  # a stop sent it a signal: its exit is not a failure of its own

    def drop_tmp(self) -> None:
        """Remove the ended process's own ``$TMPDIR``."""
        tmp, self.tmp = self.tmp, None
        if tmp is not None:
            tmp.remove()


class NodeProcesses:
    """The node processes of one run and their supervising threads.

    Args:
        run_id: the run's id (set as the marker variable of every node process).
        coordinator: where ends and restarts are reported (``node_finished``...).
        sink: where output lines go, with the node's key as prefix (None: logs only).
        ended: called with ``(key, exit code)`` when a node's process ends, before
            the end is reported (a backend may stop the run first, e.g. when its
            scheduler cancelled the job).
        kill: how to signal one process (default: its process group).
        sample: sample each node's processes once a second for the coordinator
            (:mod:`tlaunch.runtime.sampling`), where they are this machine's own (not
            an ``srun``'s: the node is on another machine).
    """

    def __init__(
        self,
        run_id: str,
        coordinator: Any,
        sink: OutputSink | None,
        ended: Callable[[str, int], None] | None = None,
        kill: Callable[[subprocess.Popen[bytes], signal.Signals], None] | None = None,
        sample: bool = False,
    ) -> None:
        self.run_id = run_id
        self.coordinator = coordinator
        self.sink = sink
        self.stopping = threading.Event()
        self._ended = ended
        self._kill = kill or (lambda popen, sig: killpg(popen.pid, sig))
        self._procs: dict[str, _Proc] = {}
        self._tmp_parents: set[str] = set()
        self._sampler: threading.Thread | None = None
        if sample:
            self._sampler = threading.Thread(target=self._sample, name="tlaunch-sampler", daemon=True)
            self._sampler.start()

    def spawn(self, command: NodeCommand) -> subprocess.Popen[bytes]:
        """Start ``command``'s first process now, in the calling thread; :meth:`start` takes it over.

        For a command that is not the node's own process (``srun``: the node is a child
        of SLURM's step daemon): a launch starts all of its steps first, one after the
        other, before any thread. A node's own process starts from its supervising thread,
        which lives as long as it: where the node asks for ``PR_SET_PDEATHSIG``, that
        signal comes when the thread that started it ends.
        """
        proc = self._procs.setdefault(command.key, _Proc())
        proc.popen = self._popen(command, proc)
        return proc.popen

    def start(self, command: NodeCommand, first: subprocess.Popen[bytes] | None = None) -> None:
        """Start a supervising thread that runs ``command`` (and restarts it under its policy).

        ``first``: its first process, already started (:meth:`spawn`).
        """
        proc = self._procs.setdefault(command.key, _Proc())
        proc.thread = threading.Thread(
            target=self._supervise,
            args=(command, proc, first),
            name=f"tlaunch-supervise-{command.key}",
            daemon=True,
        )
        proc.thread.start()

    def _sample(self) -> None:
        """Once a second until the stop: a sample of each node's processes, to the coordinator."""
        from tlaunch.runtime.sampling import GpuSampler, TreeSampler

        gpu = GpuSampler()
        samplers: dict[str, TreeSampler] = {}
        while not self.stopping.wait(1.0):
            samples = {}
            for key, proc in list(self._procs.items()):
                sample = samplers.setdefault(key, TreeSampler(gpu)).sample_of(proc.popen)
                if sample is not None:
                    samples[key] = sample
            if samples:
                self.coordinator.add_samples(samples)  # in this process: it cannot be unreachable

    def popens(self) -> list[subprocess.Popen[bytes]]:
        """The current process of every node started so far."""
        return [p.popen for p in self._procs.values() if p.popen is not None]

    def _popen(self, command: NodeCommand, proc: _Proc) -> subprocess.Popen[bytes]:
        env = {**command.env, "PYTHONUNBUFFERED": "1", MARKER: self.run_id}
        if command.own_tmp is not None:
            self._tmp_parents.add(command.own_tmp)
            proc.tmp = NodeTmp.make(command.own_tmp, self.run_id)
            if proc.tmp is not None:
                env["TMPDIR"] = proc.tmp.path
        try:
            return subprocess.Popen(
                list(command.argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except BaseException:
            proc.drop_tmp()
            raise

    def _supervise(self, command: NodeCommand, proc: _Proc, first: subprocess.Popen[bytes] | None) -> None:
        key = command.key
        tail = [""]  # the last lines of its last process

        def attempt(n: int) -> int:
            # Started from this thread, which lives as long as the node: PR_SET_PDEATHSIG
            # fires when the thread that forked the node ends, not only its process.
            with NodeLog(command.log_path) as log:
                popen = first if n == 0 and first is not None else self._popen(command, proc)
                proc.popen = popen
                try:
                    assert popen.stdin is not None
                    payload = command.payload if isinstance(command.payload, bytes) else command.payload()
                    with contextlib.suppress(BrokenPipeError):
                        popen.stdin.write(payload)
                        popen.stdin.close()
                    stdout = popen.stdout
                    assert stdout is not None
                    code = wait_with_output(popen, lambda: pump(stdout, log, key, self.sink))
                    tail[0] = log.tail()
                finally:
                    proc.drop_tmp()  # before its end is reported: the run may end with it
            if self._ended is not None and not self.stopping.is_set():
                self._ended(key, code)
            return code

        def note(line: str) -> None:
            with NodeLog(command.log_path) as log:
                log.write(line.encode() + b"\n")

        supervise(
            key,
            command.policy,
            attempt,
            self.stopping,
            self.coordinator,
            note,
            lambda: tail[0],
            lambda: proc.signalled,
        )

    def stop_from_outside(self) -> None:
        """The run stops for a reason outside its nodes (its scheduler ended the job): from now on,
        every node's end is a stop, whatever its exit code, not a failure of its own."""
        for proc in self._procs.values():
            proc.signalled = True
        self.stopping.set()

    def signal_after(self, wait: float, sig: signal.Signals) -> None:
        """Wait up to ``wait`` s for every process to end, then send ``sig`` to those left."""
        procs = [p for p in self._procs.values() if p.popen is not None]
        popens = [p.popen for p in procs if p.popen is not None]
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(p.poll() is None for p in popens):
            time.sleep(0.02)
        for proc in procs:
            if proc.popen is not None and proc.popen.poll() is None:
                proc.signalled = True
                self._kill(proc.popen, sig)
        for popen in popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(2.0 if sig == signal.SIGKILL else 0.5)

    def stop(self, grace: float) -> None:
        """Grace, SIGTERM, SIGKILL; with ``grace`` 0, SIGKILL at once; then wait for the threads."""
        self.stopping.set()
        if grace > 0:
            self.signal_after(grace, signal.SIGTERM)
            self.signal_after(2.0, signal.SIGKILL)
        else:
            self.signal_after(0.0, signal.SIGKILL)
        self.join(10 if grace > 0 else 2)
        for proc in self._procs.values():  # a thread still busy with its node's output
            proc.drop_tmp()
        for parent in self._tmp_parents:
            sweep(parent)  # what the nodes of launchers killed before left

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for each supervising thread (never the calling one)."""
        for proc in self._procs.values():
            if proc.thread is not None and proc.thread is not threading.current_thread():
                proc.thread.join(timeout)


def pump(stream: IO[bytes], log: NodeLog, key: str, sink: OutputSink | None) -> None:
    """Copy a node's output to its log and, line by line, to the launcher's terminal.

    It drains the pipe whatever happens to the log or the terminal: a node never
    blocks on its output.
    """
    for raw in iter(stream.readline, b""):
        log.write(raw)
        if sink is not None:
            try:
                sink.line(key, raw.decode("utf-8", "replace").rstrip("\n"))
            except OSError:  # the terminal is gone (a closed notebook, a broken pipe)
                sink = None
    stream.close()


def killpg(pgid: int, sig: signal.Signals) -> None:
    """Signal process group ``pgid``; a group already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def launcher_python_path() -> str:
    """PYTHONPATH for node processes: the launcher's first path entry, as Python chose it, and its path.

    Python's own rule picks the first entry (``sys.path[0]``): the script's
    folder for ``python script.py``; the working directory for ``python -m
    pkg.mod``, ``-c`` and an interactive session; nothing under ``-P``. A folder
    inside a package is never it: ``python -m tlaunch.cli.main`` must not put
    ``tlaunch/cli`` (whose modules would shadow ``torch``...) before the nodes' own path.
    """
    parts = [p for p in sys.path if p and os.path.isdir(p)]
    first = main_path_entry()
    if first is not None:
        parts.insert(0, first)
    seen: dict[str, None] = {}
    for p in parts:
        seen.setdefault(os.path.abspath(p), None)
    return os.pathsep.join(seen)


def main_path_entry() -> str | None:
    """The folder Python puts first on ``sys.path`` for the launcher's ``__main__`` (None: none)."""
    if getattr(sys.flags, "safe_path", False):  # python -P (3.11+)
        return None
    main = sys.modules.get("__main__")
    if getattr(main, "__spec__", None) is not None:  # python -m pkg.mod (runpy): the working directory
        return os.getcwd()
    main_file = getattr(main, "__file__", None)
    if main_file:  # python script.py
        return os.path.dirname(os.path.abspath(str(main_file)))
    return os.getcwd()  # python -c, an interactive session, a notebook kernel
