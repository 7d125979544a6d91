"""SSH backend: every node in a tmux window on the host its ``to_host()`` names.

One paramiko connection per host (opened in parallel, reused for everything):

1. **Preflight**, all hosts in parallel: host key, auth, the ``setup``
   commands, Python minor version equal to the launcher's, tlaunch importable
   at the same version, tmux, a writable run directory. Every problem of every
   host is reported in one error; nothing starts.
2. **Ship** per host, over SFTP into ``~/.tlaunch/runs/<run-id>/`` (0700): the
   working directory (if any), and one file per node (mode 0600; the node, the
   run's keys, its environment), which its supervisor deletes as it reads it.
3. **Head**: the run's coordinator starts in window ``coordinator`` of the
   tmux session ``tlaunch-<run-id>`` on the head host; it does not depend on
   the launcher, so ``detach`` leaves the run alive.
4. **Start** a window per node under its supervisor
   (:mod:`tlaunch.runtime.supervisor`): output to the pane and to
   ``logs/<label>_<i>.log``, heartbeats, restarts, process-group kill on stop.
5. **Watch**: node output streams back live with a ``[host label/i]`` prefix
   (``ssh_tmux_session``, ``current_terminal``); the launcher renews its lease
   with the head, which stops the run if the lease lapses (no orphans).
6. **Stop**: the supervisors end their nodes (grace, SIGTERM, SIGKILL); then
   every host is checked, anything left is killed, the tmux sessions go. Logs
   stay.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import pickle
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import cloudpickle
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

import tlaunch
from tlaunch.backends.local import log_name
from tlaunch.backends.output import Printer
from tlaunch.errors import HostsError, LaunchError, SSHError
from tlaunch.plan import LaunchPlan
from tlaunch.rpc.client import RPCClient, fixed_resolver
from tlaunch.rpc.security import RunKeys
from tlaunch.runtime.bundle import pickle_node
from tlaunch.runtime.coordinator import FAILURE_POLICIES, TERMINAL_STATES
from tlaunch.runtime.head import HeadFile
from tlaunch.runtime.node_runtime import NodeRuntime, RuntimeConfig
from tlaunch.runtime.records import RunRecord, write_record
from tlaunch.runtime.remote import RemoteCoordinator
from tlaunch.runtime.supervisor import NodeFile
from tlaunch.ssh import Connection, connect_all
from tlaunch.ssh.sync import pack_dir
from tlaunch.ssh.tail import RemoteTail

if TYPE_CHECKING:
    from tlaunch.launcher import Run
    from tlaunch.program import Program

__all__ = ["SSHBackend", "SSHOptions", "attach_ssh", "launch_ssh", "run_dir_of", "session_of"]

log = logging.getLogger(__name__)

_RUNS = ".tlaunch/runs"
SSH_TERMINALS = ("ssh_tmux_session", "current_terminal", "output_to_files")


def run_dir_of(run_id: str) -> str:
    """The run's directory on each host, relative to the home directory."""
    return f"{_RUNS}/{run_id}"


def session_of(run_id: str) -> str:
    """The run's tmux session name on each host."""
    return f"tlaunch-{run_id}"


@dataclass(frozen=True)
class SSHOptions:
    """Options of SSH launches (keyword arguments of :func:`tlaunch.launch`).

    Attributes:
        ssh_config: ssh config file (default ``$TLAUNCH_SSH_CONFIG`` or ``~/.ssh/config``).
        accept_unknown_hosts: trust hosts missing from known_hosts (never a changed key).
        python: the interpreter on the hosts (default: the launcher's path), or a
            dict host -> interpreter.
        working_dir: a local folder shipped to every host; nodes start in it and
            import from it. ``.git`` and caches are left out.
        working_dir_limit_mib: refuse a ``working_dir`` larger than this.
        setup: shell commands run once per host before its nodes (a list, or a
            dict host -> list), e.g. ``["bash setup.sh"]``.
        env_patterns: names or patterns (``"WANDB_*"``) of the launcher's
            environment variables to copy to every node.
        detach: leave the run running when the launcher exits.
        head_host: the host of the run's coordinator (default: the first host).
        max_restarts: restarts of a failing node: an int for all, or a dict
            label or ``label/i`` -> int.
        restart_backoff: seconds before the first restart, doubling after.
        on_failure: ``"stop"`` (default) ends the run when a node fails for good;
            ``"continue"`` lets the others go on.
        heartbeat_timeout: a node whose supervisor is silent this long has failed.
        connect_timeout: seconds to reach and log in to each host.
        keep_bundles: leave each node's bundle file (``N.node``, ``head.pkl``; they
            hold the run's keys, mode 0600) and the shipped working dir on the
            hosts after the run, to inspect. Off by default:
            they are deleted as soon as read, and at teardown.
    """

    ssh_config: str | None = None
    accept_unknown_hosts: bool = False
    python: str | dict[str, str] | None = None
    working_dir: str | None = None
    working_dir_limit_mib: float = 64.0
    setup: list[str] | dict[str, list[str]] | None = None
    env_patterns: list[str] = field(default_factory=list)
    detach: bool = False
    head_host: str | None = None
    max_restarts: int | dict[str, int] = 0
    restart_backoff: float = 1.0
    on_failure: str = "stop"
    heartbeat_timeout: float = 10.0
    connect_timeout: float = 10.0
    keep_bundles: bool = False

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> SSHOptions:
        """Options from ``launch()``'s keyword arguments, checked.

        Raises:
            LaunchError: an unknown option or a bad value; nothing has started.
        """
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise LaunchError(f"unknown launch options {unknown}; SSH launches take {names}")
        opts = cls(**kwargs)
        if opts.on_failure not in FAILURE_POLICIES:
            raise LaunchError(f"on_failure={opts.on_failure!r} is not one of {list(FAILURE_POLICIES)}")
        if opts.heartbeat_timeout <= 0 or opts.restart_backoff < 0:
            raise LaunchError(
                f"heartbeat_timeout={opts.heartbeat_timeout!r} must be > 0 and "
                f"restart_backoff={opts.restart_backoff!r} >= 0"
            )
        if isinstance(opts.setup, str) or (
            isinstance(opts.setup, dict) and any(isinstance(v, str) for v in opts.setup.values())
        ):
            raise LaunchError(
                f"setup={opts.setup!r} must be a list of shell commands (or a dict host -> list)"
            )
        return opts

    def python_for(self, host: str) -> str:
        """The interpreter on ``host``."""
        if isinstance(self.python, dict):
            return self.python.get(host, sys.executable)
        return self.python or sys.executable

    def setup_for(self, host: str) -> list[str]:
        """The setup commands of ``host``."""
        if isinstance(self.setup, dict):
            return list(self.setup.get(host, []))
        return list(self.setup or [])


def _pmap(
    fn: Callable[[str], Any], items: list[str], conns: dict[str, Connection] | None = None
) -> dict[str, Any]:
    """``fn`` on every item in parallel; exceptions are returned, not raised.

    If the caller is interrupted (Ctrl-C), the commands running on ``conns`` are
    cut short and every worker has returned before the interrupt propagates, so
    that cleanup does not race a worker still shipping.
    """
    pool = ThreadPoolExecutor(max(1, min(32, len(items))))
    try:
        futures = {item: pool.submit(fn, item) for item in items}
        wait(list(futures.values()))
    except BaseException:
        for conn in (conns or {}).values():
            conn.interrupted.set()
        pool.shutdown(wait=True, cancel_futures=True)
        for conn in (conns or {}).values():
            conn.interrupted.clear()
        raise
    pool.shutdown()
    return {item: (f.exception() or f.result()) for item, f in futures.items()}


def _raise_for_hosts(results: dict[str, Any], what: str) -> None:
    errors = {h: r for h, r in results.items() if isinstance(r, BaseException)}
    for r in errors.values():
        if isinstance(r, KeyboardInterrupt):
            raise r
    if errors:
        raise LaunchError(f"{what} failed: {HostsError(errors)}")


class _Phases:
    """A rich progress display of connect, preflight, ship and start per host (on a TTY)."""

    def __init__(self, hosts: int) -> None:
        self.console = Console(stderr=True)
        self.hosts = hosts
        self.progress = Progress(
            TextColumn("{task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("hosts"),
            console=self.console,
            transient=True,
            disable=not self.console.is_terminal,
        )
        self.times: dict[str, float] = {}  # seconds per finished phase

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[Callable[[], None]]:
        task = self.progress.add_task(name, total=self.hosts)
        t0 = time.perf_counter()
        yield lambda: self.progress.advance(task)
        self.times[name] = time.perf_counter() - t0
        log.debug("launch phase %s: %.3f s on %d hosts", name, self.times[name], self.hosts)
        self.progress.update(task, completed=self.hosts)


def _preflight(
    conns: dict[str, Connection], opts: SSHOptions, cmd_env: dict[str, str], tick: Callable[[], None]
) -> dict[str, tuple[str, str]]:
    """Check every host; returns each host's address pair as the launcher reaches it."""
    want = f"{sys.version_info[0]}.{sys.version_info[1]} {tlaunch.__version__}"
    probe = "import sys, tlaunch; print('%d.%d' % sys.version_info[:2], tlaunch.__version__)"

    def check(host: str) -> tuple[str, str]:
        conn = conns[host]
        problems = []
        for command in opts.setup_for(host):
            done = conn.run(["sh", "-c", command], check=False, pty=True)
            if done.exit_status != 0:
                tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
                problems.append(f"setup command {command!r} exited with {done.exit_status}: {tail}")
                break
        # One exec for the checks (each exec is a fork in sshd and a round trip).
        script = (
            'printf "where %s\\n" "$SSH_CONNECTION"; '
            'out=$("$@" 2>&1); rc=$?; printf "python %s %s\\n" "$rc" "$(printf %s "$out" | tail -n 1)"; '
            'tmux -V >/dev/null 2>&1; printf "tmux %s\\n" "$?"; '
            f"err=$(mkdir -p -m 700 .tlaunch {_RUNS} 2>&1 && test -w {_RUNS} 2>&1); "
            'printf "runs %s %s\\n" "$?" "$err"'
        )
        python = opts.python_for(host)
        argv = ["env", *(f"{k}={v}" for k, v in cmd_env.items()), python, "-c", probe]
        said = conn.run(["sh", "-c", script, "sh", *argv], check=False).stdout
        lines = {line.split(" ", 1)[0]: line.partition(" ")[2] for line in said.splitlines() if line}
        where = lines.get("where", "").split()
        if len(where) < 3:
            raise SSHError(host, f"the preflight checks did not run (they printed {said!r})")
        code, _, got = lines.get("python", "1 ?").partition(" ")
        if code != "0":
            problems.append(
                f"{python} cannot import tlaunch ({got or '?'}); install tlaunch {tlaunch.__version__} there"
            )
        elif got.strip() != want:
            problems.append(
                f"has Python/tlaunch {got.strip()!r}, the launcher {want!r}; cloudpickle needs the "
                "same Python minor version and tlaunch version on every host"
            )
        if lines.get("tmux", "1") != "0":
            problems.append("tmux is missing (apt-get install tmux)")
        code, _, err = lines.get("runs", "1 ?").partition(" ")
        if code != "0":
            problems.append(f"~/{_RUNS} is not writable ({err.strip()})")
        tick()
        if problems:
            raise SSHError(host, "; ".join(problems))
        return where[0], where[2]

    results = _pmap(check, list(conns), conns)
    errors = {h: r for h, r in results.items() if isinstance(r, BaseException)}
    if errors:
        raise HostsError(errors)
    return {h: r for h, r in results.items() if isinstance(r, tuple)}


def _by_value_modules(nodes: list[Any]) -> list[Any]:
    """Modules of the nodes' code that hosts cannot import: ship them by value."""
    mods = []
    for node in nodes:
        for inner in [node, *getattr(node, "nodes", [])]:
            fn = getattr(inner, "function", None)  # PyNode and its subclasses
            mod = sys.modules.get(getattr(fn, "__module__", "") or "")
            path = getattr(mod, "__file__", None) or ""
            if mod is None or mod.__name__ in ("__main__", "builtins") or mod.__name__.startswith("tlaunch"):
                continue
            if "site-packages" in path or "dist-packages" in path or path.startswith(sys.base_prefix):
                continue
            if mod not in mods:
                mods.append(mod)
    return mods


def _restarts(plan: LaunchPlan, value: int | dict[str, int]) -> dict[str, int]:
    """Restarts per node key from ``max_restarts`` (an int, or by label or key)."""
    if isinstance(value, int):
        if value < 0:
            raise LaunchError(f"max_restarts={value} must be >= 0")
        return {n.key: value for n in plan.nodes}
    labels = {n.label for n in plan.nodes}
    keys = {n.key for n in plan.nodes}
    bad = sorted(k for k in value if k not in labels and k not in keys)
    if bad:
        raise LaunchError(
            f"max_restarts names {bad}, which are neither labels nor nodes of the program; "
            f"labels: {sorted(labels)}"
        )
    out = {}
    for n in plan.nodes:
        out[n.key] = int(value.get(n.key, value.get(n.label, 0)))
    return out


def _kill_script() -> str:
    """Shell: kill the run's tmux panes and the given pids/groups, then confirm none is left."""
    return (
        'S="$1"; shift; '
        'P=$(tmux list-panes -s -t "=$S" -F "#{pane_pid}" 2>/dev/null); '
        'for p in $P "$@"; do kill -KILL -- "$p" 2>/dev/null; done; '
        'tmux kill-session -t "=$S" 2>/dev/null; '
        "i=0; while [ $i -lt 50 ]; do left=''; "
        'for p in $P "$@"; do q=${p#-}; kill -0 "$q" 2>/dev/null && left="$left $q"; done; '
        '[ -z "$left" ] && exit 0; i=$((i+1)); sleep 0.1; done; echo "left:$left"; exit 1'
    )


class SSHBackend:
    """The hosts of one SSH run: start, stream, stop (see the module docstring)."""

    def __init__(
        self,
        run_id: str,
        conns: dict[str, Connection],
        head: str,
        coordinator: RemoteCoordinator | None = None,
    ) -> None:
        self.run_id = run_id
        self.conns = conns
        self.head = head
        self.coord = coordinator
        self.launch_times: dict[str, float] = {}  # seconds per launch phase (connect, preflight, ...)
        self.keep_bundles = False  # leave bundles and the working dir on the hosts at teardown
        self.head_pid: int | None = None
        self.tails: list[RemoteTail] = []
        self._closed = False
        self._lock = threading.Lock()

    # -- output ---------------------------------------------------------
    def stream(self, plan: LaunchPlan, printer: Printer) -> None:
        """Stream every node's log to ``printer``, prefixed ``host label/i``."""
        by_file: dict[tuple[str, str], str] = {}
        for n in plan.nodes:
            by_file[(str(n.host), f"{run_dir_of(self.run_id)}/logs/{log_name(n.key)}")] = n.key
        for host, conn in self.conns.items():
            paths = [p for (h, p) in by_file if h == host]
            if not paths:
                continue

            def on_line(path: str, line: str, host: str = host) -> None:
                printer.line(f"{host} {by_file.get((host, path), path)}", line)

            tail = RemoteTail(conn, paths, on_line, session=session_of(self.run_id))
            tail.start()
            self.tails.append(tail)

    def stop_streams(self, reachable: set[str] | None = None) -> None:
        """Stop following the logs (after the last lines arrived); unreachable hosts are not asked."""
        tails, self.tails = self.tails, []

        def stop(i: str) -> None:
            tail = tails[int(i)]
            tail.stop(kill=reachable is None or tail.host in reachable)

        if tails:
            _pmap(stop, [str(i) for i in range(len(tails))])

    def detach(self) -> None:
        """Leave the run to its head: stop the lease and the streams, close the connections."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.coord is not None:
            self.coord.detach()
            self.coord.close()
        self.stop_streams()
        for conn in self.conns.values():
            conn.close()

    # -- stop -----------------------------------------------------------
    def stop(self, grace: float) -> None:
        """Stop the run on every host and confirm that nothing of it is left."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        coord = self.coord
        pids: dict[str, list[str]] = {}
        if coord is not None:
            coord.stop("the run is being torn down")
            coord.wait_ended(grace + 4.0)
            for rec in coord.status().values():
                if rec["state"] not in TERMINAL_STATES and rec["host"] in self.conns:
                    for pid in (rec.get("supervisor_pid"), rec.get("pgid") and -rec["pgid"]):
                        if pid:
                            pids.setdefault(rec["host"], []).append(str(pid))
            coord.release()
            coord.close()
        if self.head_pid and self.head in self.conns:
            pids.setdefault(self.head, []).append(str(self.head_pid))
        self.clean(pids)

    def abort(self) -> None:
        """Undo a launch that did not finish: kill what started, remove the run's directories."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.coord is not None:
            self.coord.stop("the launch was aborted")
            self.coord.release()
            self.coord.close()
        pids = {self.head: [str(self.head_pid)]} if self.head_pid else {}
        self.clean(pids, remove_all=True)

    def clean(self, pids: dict[str, list[str]] | None = None, remove_all: bool = False) -> dict[str, str]:
        """Kill whatever of the run is left on each host; returns hosts with leftovers."""
        session = session_of(self.run_id)
        run_dir = run_dir_of(self.run_id)
        pids = pids or {}
        # A host that does not answer at once (link down) is skipped, not waited for.
        probe = _pmap(lambda h: self.conns[h].run(["true"], timeout=3.0), list(self.conns))
        reachable = [h for h, r in probe.items() if not isinstance(r, BaseException)]
        self.stop_streams(set(reachable))

        def clean(host: str) -> str:
            conn = self.conns[host]
            # The head lingers until released; give it a moment to write and exit.
            if host == self.head and self.head_pid:
                conn.run(
                    [
                        "sh",
                        "-c",
                        'i=0; while kill -0 "$1" 2>/dev/null && [ $i -lt 30 ]; do '
                        "i=$((i+1)); sleep 0.1; done",
                        "sh",
                        str(self.head_pid),
                    ],
                    check=False,
                    timeout=10.0,
                )
            out = conn.run(
                ["sh", "-c", _kill_script(), "sh", session, *pids.get(host, [])], check=False, timeout=15.0
            )
            remove = run_dir if remove_all else f"{run_dir}/*.node {run_dir}/head.pkl {run_dir}/work*"
            if remove_all or not self.keep_bundles:
                conn.run(["sh", "-c", f"rm -rf {remove}"], check=False, timeout=10.0)
            return out.stdout.strip()

        results = {**{h: r for h, r in probe.items() if h not in reachable}, **_pmap(clean, reachable)}
        left = {h: str(r) for h, r in results.items() if r}
        for host, result in results.items():
            if isinstance(result, BaseException):
                log.warning(
                    "could not clean up run %s on %s (%s); its processes stop themselves once they "
                    "lose the coordinator",
                    self.run_id,
                    host,
                    result,
                )
        for conn in self.conns.values():
            conn.close()
        return left

    def final_state(self) -> dict[str, Any] | None:
        """The head's ``final.json`` (read over SSH), if it wrote one."""
        conn = self.conns.get(self.head)
        if conn is None:
            return None
        try:
            data: dict[str, Any] = json.loads(conn.read_file(f"{run_dir_of(self.run_id)}/final.json"))
            return data
        except (SSHError, ValueError):
            return None


def _window_command(
    python: str, cmd_env: dict[str, str], module: str, *args: str, log: str | None = None
) -> str:
    argv = shlex.join(["env", *(f"{k}={v}" for k, v in cmd_env.items()), python, "-m", module, *args])
    if log is None:
        return f'cd "$HOME" && exec {argv}'
    return f'cd "$HOME" && {argv} 2>&1 | tee -a {shlex.quote(log)}'


def _tmux_windows(session: str, windows: list[tuple[str, str]], new_session: bool) -> list[str]:
    """One tmux command line that opens all ``(name, command)`` windows."""
    argv: list[str] = ["tmux"]
    for i, (name, command) in enumerate(windows):
        if i:
            argv.append(";")
        if i == 0 and new_session:
            argv += ["new-session", "-d", "-s", session, "-n", name, "-x", "200", "-y", "50", command]
        else:
            argv += ["new-window", "-d", "-t", f"={session}:", "-n", name, command]
    return argv


def launch_ssh(
    program: Program,
    plan: LaunchPlan,
    *,
    terminal: str | None,
    wait: bool,
    stop_grace: float,
    resolve_timeout: float,
    coordinator_timeout: float,
    env: dict[str, str] | None,
    **options: Any,
) -> Run:
    """Launch ``plan`` on its hosts over SSH; see :func:`tlaunch.launch` and :class:`SSHOptions`."""
    from tlaunch import context
    from tlaunch.launcher import Run, runs_dir

    opts = SSHOptions.from_kwargs(options)
    terminal = terminal or "ssh_tmux_session"
    if terminal not in SSH_TERMINALS:
        raise LaunchError(
            f"terminal {terminal!r} is not available over SSH; use one of {list(SSH_TERMINALS)}"
        )
    local = [n.key for n in plan.nodes if n.host is None]
    if local:
        raise LaunchError(f"node {local[0]!r} has no host; over SSH every node needs .to_host(...)")
    restarts = _restarts(plan, opts.max_restarts)
    node_env = {
        k: v for k, v in os.environ.items() if any(fnmatch.fnmatchcase(k, p) for p in opts.env_patterns)
    }
    node_env.update(env or {})
    # Only PYTHONPATH goes on a command line (it is no secret); the rest travels in 0600 files.
    cmd_env = {"PYTHONUNBUFFERED": "1"}
    if node_env.get("PYTHONPATH") or os.environ.get("PYTHONPATH"):
        cmd_env["PYTHONPATH"] = node_env.get("PYTHONPATH") or os.environ["PYTHONPATH"]
    work = pack_dir(opts.working_dir, int(opts.working_dir_limit_mib * 2**20)) if opts.working_dir else None
    nodes = {n.key or "": n for n in program.get_all_nodes()}
    mods = _by_value_modules(list(nodes.values()))
    for mod in mods:
        cloudpickle.register_pickle_by_value(mod)
    try:
        pickled = {key: pickle_node(node) for key, node in nodes.items()}
    finally:
        for mod in mods:
            cloudpickle.unregister_pickle_by_value(mod)
    node_hosts = list(dict.fromkeys(str(n.host) for n in plan.nodes))
    head = opts.head_host or node_hosts[0]
    hosts = list(dict.fromkeys([head, *node_hosts]))
    phases = _Phases(len(hosts))
    run_dir = run_dir_of(plan.run_id)
    session = session_of(plan.run_id)
    with phases.progress:
        with phases.phase("connect"):
            conns = connect_all(
                hosts,
                ssh_config=opts.ssh_config,
                accept_unknown_hosts=opts.accept_unknown_hosts,
                timeout=opts.connect_timeout,
            )
        backend = SSHBackend(plan.run_id, conns, head)
        backend.launch_times = phases.times
        backend.keep_bundles = opts.keep_bundles
        try:
            with phases.phase("preflight") as tick:
                where = _preflight(conns, opts, cmd_env, tick)
            keys = RunKeys.generate()
            workdir = f"{run_dir}/work" if work is not None else None

            def config_for(host: str) -> RuntimeConfig:
                return RuntimeConfig(
                    run_id=plan.run_id,
                    program_name=plan.program_name,
                    keys=keys,
                    bind_host="0.0.0.0",
                    advertise_host=where[host][1],
                    host_name=host,
                    resolve_timeout=resolve_timeout,
                    coordinator_lost_after=coordinator_timeout,
                    stop_grace=stop_grace,
                )

            index = {n.key: i for i, n in enumerate(plan.nodes)}

            def ship(host: str) -> None:
                conn = conns[host]
                windows: list[tuple[str, str]] = []
                conn.run(["sh", "-c", f"mkdir -p -m 700 {run_dir} {run_dir}/logs && chmod 700 {run_dir}"])
                if work is not None:
                    conn.write_file(f"{run_dir}/work.tgz", work, mode=0o600)
                    conn.run(
                        [
                            "sh",
                            "-c",
                            f"mkdir -p {run_dir}/work && tar -xzf {run_dir}/work.tgz -C {run_dir}/work "
                            f"&& rm {run_dir}/work.tgz",
                        ]
                    )
                for n in plan.nodes:
                    if str(n.host) != host:
                        continue
                    spec = NodeFile(
                        config_for(host),
                        n.key,
                        pickled[n.key],
                        f"{run_dir}/logs/{log_name(n.key)}",
                        env=node_env,
                        max_restarts=restarts[n.key],
                        backoff=opts.restart_backoff,
                        workdir=workdir,
                        keep=opts.keep_bundles,
                    )
                    conn.write_file(f"{run_dir}/{index[n.key]}.node", pickle.dumps(spec), mode=0o600)
                    supervisor = _window_command(
                        opts.python_for(host),
                        cmd_env,
                        "tlaunch.runtime.supervisor",
                        f"{run_dir}/{index[n.key]}.node",
                        f"{run_dir}/coordinator.addr",
                    )
                    windows.append((n.key, supervisor))
                if host == head:
                    head_file = HeadFile(
                        plan,
                        keys,
                        where[head][1],
                        opts.heartbeat_timeout,
                        coordinator_timeout,
                        stop_grace,
                        opts.on_failure,
                        attached=True,
                        keep=opts.keep_bundles,
                    )
                    conn.write_file(f"{run_dir}/head.pkl", pickle.dumps(head_file), mode=0o600)
                    command = _window_command(
                        opts.python_for(head),
                        cmd_env,
                        "tlaunch.runtime.head",
                        f"{run_dir}/head.pkl",
                        log=f"{run_dir}/logs/coordinator.log",
                    )
                    windows.insert(0, ("coordinator", command))
                # The supervisors start now, with the head: they (and their nodes' interpreters)
                # start up while the head does, and wait for coordinator.addr.
                if windows:
                    conn.run(_tmux_windows(session, windows, new_session=True))
                tick()

            with phases.phase("ship") as tick:
                _raise_for_hosts(_pmap(ship, hosts, conns), "shipping and starting")
            t_head = time.perf_counter()
            addr = conns[head].run(
                [
                    "sh",
                    "-c",
                    'i=0; while [ ! -s "$1" ]; do tmux has-session -t "=$2" 2>/dev/null || exit 2; '
                    'i=$((i+1)); [ $i -gt 1500 ] && exit 1; sleep 0.02; done; cat "$1"',
                    "sh",
                    f"{run_dir}/coordinator.addr",
                    session,
                ],
                check=False,
                timeout=60.0,
            )
            if addr.exit_status != 0:
                log = conns[head].run(["tail", "-n", "20", f"{run_dir}/logs/coordinator.log"], check=False)
                raise LaunchError(f"the coordinator did not start on {head}:\n{log.stdout}")
            phases.times["head"] = time.perf_counter() - t_head  # ship's end to the head's address
            info = json.loads(addr.stdout)
            backend.head_pid = int(info["pid"])
            address = str(info["address"])
            client = RPCClient(
                "coordinator",
                keys,
                fixed_resolver(address),
                resolve_timeout=10.0,
                default_timeout=30.0,
                retry_refused=False,
            )
            coord = RemoteCoordinator(client, head, coordinator_timeout, address)
            backend.coord = coord
            coord.start_lease()

            def start(host: str) -> None:
                if host != head:  # the head wrote its own
                    conns[host].write_file(f"{run_dir}/coordinator.addr", addr.stdout.encode(), mode=0o600)
                tick()

            with phases.phase("start") as tick:
                _raise_for_hosts(_pmap(start, hosts, conns), "starting the nodes")
            if terminal != "output_to_files":
                backend.stream(plan, Printer())
            launcher_config = RuntimeConfig(
                plan.run_id, plan.program_name, keys, resolve_timeout=resolve_timeout
            )
            launcher_runtime = NodeRuntime(launcher_config, coord, None)
            launcher_runtime.start_watcher()
        except BaseException:
            backend.abort()
            raise
    local_dir = os.path.join(runs_dir(), plan.run_id)
    os.makedirs(local_dir, mode=0o700, exist_ok=True)
    os.chmod(local_dir, 0o700)
    record = RunRecord(
        plan.run_id,
        plan.program_name,
        "ssh",
        address,
        os.getpid(),
        hosts=hosts,
        ssh_config=opts.ssh_config,
        log_dir=f"~/{run_dir}/logs",
        head=head,
        head_pid=backend.head_pid,
        keep_bundles=opts.keep_bundles,
    )
    write_record(local_dir, record, keys)
    context.install(launcher_runtime)
    run = Run(plan, coord, backend, local_dir, launcher_runtime, None, stop_grace, record=record)  # type: ignore[arg-type]
    if opts.detach:
        run.detach()
        return run
    if wait:
        with _detach_on_sigquit(run):
            try:
                run.wait()
            except BaseException:
                run.stop()
                raise
    return run


@contextlib.contextmanager
def _detach_on_sigquit(run: Run) -> Iterator[None]:
    """While waiting, Ctrl-\\ (SIGQUIT) detaches: the run goes on, the launcher returns."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def detach(signum: int, frame: object) -> None:
        run.detach()

    previous = signal.signal(signal.SIGQUIT, detach)
    try:
        yield
    finally:
        signal.signal(signal.SIGQUIT, previous)


def attach_ssh(run_dir: str, record: RunRecord, keys: RunKeys) -> SSHBackend:
    """The backend of a running SSH run found through its record (``tlaunch stop``)."""
    conns = connect_all(record.hosts, ssh_config=record.ssh_config)
    client = RPCClient(
        "coordinator",
        keys,
        fixed_resolver(record.coordinator),
        resolve_timeout=5.0,
        default_timeout=10.0,
        retry_refused=False,
    )
    head = record.head or record.hosts[0]
    coord = RemoteCoordinator(client, head, 10.0, record.coordinator)
    backend = SSHBackend(record.run_id, conns, head, coord)
    backend.head_pid = record.head_pid
    backend.keep_bundles = record.keep_bundles
    return backend
