"""Local multi-processing backend: one process per node on this machine.

Terminals:

* ``current_terminal``: every node's output streams to the launcher's stdout with
  a coloured ``[label/i]`` prefix (and to a log file);
* ``output_to_files``: output goes to ``<run dir>/logs/<label>_<i>.log`` only;
* ``tmux_session``: a local tmux session with one window per node (libtmux),
  its output also piped to the log file.

Every node process leads its own process group, which is what ``stop`` signals.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from typing import IO, Any

from rich.console import Console

from tlaunch.backends.output import Printer
from tlaunch.errors import LaunchError
from tlaunch.plan import LaunchPlan, ProcessSpec, node_process
from tlaunch.procs import pid_exists
from tlaunch.rpc import shm
from tlaunch.runtime.coordinator import Coordinator

__all__ = ["LocalProcessBackend", "log_name"]


def log_name(key: str) -> str:
    """The log file name of node ``key`` (``label/i`` -> ``label_i.log``)."""
    label, _, index = key.rpartition("/")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
    return f"{safe}_{index}.log"


class _Proc:
    """One started node process: a Popen, or a pid reported from a tmux window."""

    def __init__(self, key: str, popen: subprocess.Popen[bytes] | None = None) -> None:
        self.key = key
        self.popen = popen
        self.pid: int | None = popen.pid if popen else None
        self.pgid: int | None = self.pid
        self.reader: threading.Thread | None = None
        self.exit_code: int | None = None
        self.ended = False

    def poll(self) -> bool:
        """Update ``ended``/``exit_code``; True once the process is gone."""
        if self.ended:
            return True
        if self.popen is not None:
            rc = self.popen.poll()
            if rc is not None:
                self.ended, self.exit_code = True, rc
        elif self.pid is not None and not pid_exists(self.pid):
            self.ended = True
        return self.ended


class LocalProcessBackend:
    """Starts each node of a plan as a local process (see module docstring)."""

    def __init__(
        self,
        coordinator: Coordinator,
        bundle_path: str,
        log_dir: str,
        terminal: str,
        env: dict[str, str] | None = None,
        console: Console | None = None,
    ) -> None:
        self._coord = coordinator
        self._bundle = bundle_path
        self._log_dir = log_dir
        self._terminal = terminal
        self._env = env or {}
        self._printer = Printer(console)
        self._procs: dict[str, _Proc] = {}
        self._tmux_session: Any = None
        self._stopped = threading.Event()
        self._monitor: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- launch ---------------------------------------------------------
    def launch(self, plan: LaunchPlan) -> None:
        specs = [node_process(self._bundle, n.key, env=self._env) for n in plan.nodes]
        try:
            if self._terminal == "tmux_session":
                self._start_tmux(plan, specs)
            else:
                for spec in specs:
                    self._procs[spec.node] = self._start_popen(spec)
        except Exception:
            self.stop(0.0)
            raise
        self._monitor = threading.Thread(target=self._watch, name="tlaunch-local-monitor", daemon=True)
        self._monitor.start()

    def _start_popen(self, spec: ProcessSpec) -> _Proc:
        log_path = os.path.join(self._log_dir, log_name(spec.node))
        env = {**os.environ, **spec.env}
        if self._terminal == "output_to_files":
            with open(log_path, "ab") as log:
                popen = subprocess.Popen(
                    spec.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=spec.cwd,
                    start_new_session=True,
                )
            return _Proc(spec.node, popen)
        popen = subprocess.Popen(
            spec.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=spec.cwd,
            start_new_session=True,
        )
        proc = _Proc(spec.node, popen)
        assert popen.stdout is not None
        proc.reader = threading.Thread(
            target=self._pump,
            args=(popen.stdout, log_path, spec.node),
            name=f"tlaunch-out-{spec.node}",
            daemon=True,
        )
        proc.reader.start()
        return proc

    def _pump(self, stream: IO[bytes], log_path: str, prefix: str) -> None:
        with open(log_path, "ab", buffering=0) as log:
            for raw in iter(stream.readline, b""):
                log.write(raw)
                self._printer.line(prefix, raw.decode("utf-8", "replace").rstrip("\n"))
        stream.close()

    def _start_tmux(self, plan: LaunchPlan, specs: list[ProcessSpec]) -> None:
        try:
            import libtmux
        except ImportError as exc:  # pragma: no cover - declared dependency
            raise LaunchError("terminal='tmux_session' needs libtmux: pip install libtmux") from exc
        server = libtmux.Server()
        name = f"tlaunch-{plan.run_id}"
        session = None
        for spec in specs:
            env_args = [f"{k}={v}" for k, v in spec.env.items()]
            log_path = os.path.join(self._log_dir, log_name(spec.node))
            command = (
                f"cd {shlex.quote(spec.cwd or os.getcwd())} && "
                f"{shlex.join(['env', *env_args, *spec.argv])} 2>&1 | tee -a {shlex.quote(log_path)}"
            )
            if session is None:
                session = server.new_session(
                    session_name=name,
                    window_name=spec.node,
                    window_command=command,
                    attach=False,
                    x=200,
                    y=50,
                )
                self._tmux_session = session
            else:
                session.new_window(window_name=spec.node, window_shell=command, attach=False)
            self._procs[spec.node] = _Proc(spec.node)
        # The processes report their pids to the coordinator; adopt them.
        deadline = time.monotonic() + 30
        while any(p.pid is None for p in self._procs.values()):
            status = self._coord.status()
            for key, proc in self._procs.items():
                if proc.pid is None and status[key]["pid"]:
                    proc.pid, proc.pgid = status[key]["pid"], status[key]["pgid"]
            if time.monotonic() > deadline:
                missing = [k for k, p in self._procs.items() if p.pid is None]
                raise LaunchError(f"nodes {missing} did not start in their tmux windows within 30 s")
            time.sleep(0.02)

    # -- monitoring -----------------------------------------------------
    def _watch(self) -> None:
        while not self._stopped.is_set():
            self._reap(report=True)
            if all(p.ended for p in self._procs.values()):
                return
            self._stopped.wait(0.05)

    def _reap(self, report: bool) -> None:
        with self._lock:
            for proc in self._procs.values():
                was = proc.ended
                if proc.poll() and not was and report:
                    self._report_end(proc)

    def _report_end(self, proc: _Proc) -> None:
        rc = proc.exit_code
        if rc is not None and rc < 0:
            reason = f"was killed by signal {signal.Signals(-rc).name}"
        elif rc is not None:
            reason = f"exited with code {rc}"
        else:
            reason = "exited (code unknown)"
        # Ignored by the coordinator if the node already reported its own end.
        self._coord.node_finished(proc.key, rc == 0, None, rc, reason)

    # -- stop -----------------------------------------------------------
    def stop(self, grace: float) -> None:
        self._signal_after(grace, signal.SIGTERM)
        self._signal_after(2.0, signal.SIGKILL)
        self._stopped.set()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join()
        self._reap(report=True)
        shm.sweep(min_age=0.0)  # buffers sent through shared memory by nodes that are now gone
        for proc in self._procs.values():
            if proc.reader is not None:
                proc.reader.join(5)
        if self._tmux_session is not None:
            with contextlib.suppress(Exception):  # already gone: the last window closed it
                self._tmux_session.kill()
            self._tmux_session = None

    def _signal_after(self, wait: float, sig: signal.Signals) -> None:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            self._reap(report=False)
            if all(p.ended for p in self._procs.values()):
                return
            time.sleep(0.02)
        for proc in self._procs.values():
            if not proc.poll() and proc.pgid is not None:
                _killpg(proc.pgid, sig)
        for proc in self._procs.values():
            if proc.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(2.0 if sig == signal.SIGKILL else 0.5)


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
