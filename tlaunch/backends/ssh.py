"""SSH backend: every node in a tmux window on the host its ``to_host()`` names.

One paramiko connection per host (opened in parallel, reused for everything):

1. **Preflight**, all hosts in parallel: host key, auth, Python minor version
   equal to the launcher's, tlaunch importable at the same version, tmux.
   Every problem of every host is reported in one error; nothing starts.
2. **Ship** one bundle per host (only its nodes, the run's keys) over SFTP to
   ``~/.tlaunch/runs/<run-id>/bundle.pkl`` (mode 0600 in a 0700 directory).
3. **Start** a tmux session ``tlaunch-<run-id>`` per host, a window per node,
   its output tee'd to ``~/.tlaunch/runs/<run-id>/logs/<label>_<i>.log``.
4. **Stop**: after the grace period SIGTERM, then SIGKILL, to each node's
   process group on its host; kill the tmux sessions; remove the bundles.

The coordinator runs in the launcher and listens on the address the hosts
reach it by (the client side of their ``SSH_CONNECTION``); nodes bind every
interface and advertise the address the launcher reached their host by.
Not yet: the coordinator in its own tmux window on a head host (so that
``detach`` can leave a run alive), live output streaming to the launcher,
``tlaunch ps/logs/attach/stop``.
"""

from __future__ import annotations

import os
import pickle
import shlex
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import cloudpickle

import tlaunch
from tlaunch.backends.local import log_name
from tlaunch.errors import HostsError, LaunchError, SSHError
from tlaunch.plan import LaunchPlan
from tlaunch.rpc.security import RunKeys
from tlaunch.rpc.server import RPCServer
from tlaunch.runtime.bundle import Bundle, pickle_node
from tlaunch.runtime.coordinator import TERMINAL_STATES, Coordinator
from tlaunch.runtime.node_runtime import NodeRuntime, RuntimeConfig
from tlaunch.runtime.records import RunRecord, write_record
from tlaunch.ssh import Connection, connect_all

if TYPE_CHECKING:
    from tlaunch.launcher import Run
    from tlaunch.program import Program

__all__ = ["SSHBackend", "launch_ssh"]

_RUNS = ".tlaunch/runs"


def _pmap(fn: Any, items: list[Any]) -> dict[Any, BaseException | Any]:
    with ThreadPoolExecutor(max(1, min(32, len(items)))) as pool:
        futures = {item: pool.submit(fn, item) for item in items}
    return {item: (f.exception() or f.result()) for item, f in futures.items()}


class SSHBackend:
    """Starts a plan's nodes on their hosts over SSH (see the module docstring)."""

    def __init__(
        self,
        coordinator: Coordinator,
        conns: dict[str, Connection],
        bundles: dict[str, bytes],
        python: str,
        env: dict[str, str],
    ) -> None:
        self._coord = coordinator
        self._conns = conns
        self._bundles = bundles
        self._python = python
        self._env = env
        self._run_id = ""
        self._stopped = threading.Event()
        self._lock = threading.Lock()

    def launch(self, plan: LaunchPlan) -> None:
        self._run_id = plan.run_id
        run_dir = f"{_RUNS}/{plan.run_id}"
        session = f"tlaunch-{plan.run_id}"
        by_host: dict[str, list[str]] = {}
        for n in plan.nodes:
            by_host.setdefault(str(n.host), []).append(n.key)

        def start(host: str) -> None:
            conn = self._conns[host]
            conn.run(["mkdir", "-p", "-m", "700", ".tlaunch", _RUNS, run_dir, f"{run_dir}/logs"])
            conn.run(["chmod", "700", ".tlaunch", _RUNS, run_dir])
            conn.write_file(f"{run_dir}/bundle.pkl", self._bundles[host], mode=0o600)
            for i, key in enumerate(by_host[host]):
                env = [f"{k}={v}" for k, v in self._env.items()]
                node = shlex.join(
                    [
                        "env",
                        *env,
                        self._python,
                        "-m",
                        "tlaunch.runtime.node_main",
                        f"{run_dir}/bundle.pkl",
                        key,
                    ]
                )
                log = shlex.quote(f"{run_dir}/logs/{log_name(key)}")
                window = f"cd ~ && {node} 2>&1 | tee -a {log}"
                if i == 0:
                    argv = [
                        "tmux",
                        "new-session",
                        "-d",
                        "-s",
                        session,
                        "-n",
                        key,
                        "-x",
                        "200",
                        "-y",
                        "50",
                        window,
                    ]
                else:
                    argv = ["tmux", "new-window", "-d", "-t", f"={session}:", "-n", key, window]
                conn.run(argv)

        errors = {h: r for h, r in _pmap(start, list(by_host)).items() if isinstance(r, BaseException)}
        if errors:
            self.stop(0.0)
            raise LaunchError(f"starting the nodes failed: {HostsError(errors)}")
        threading.Thread(target=self._watch, name="tlaunch-ssh-monitor", daemon=True).start()

    def _watch(self) -> None:
        """Nodes that vanish without a word (kill -9) fail once their heartbeat stops."""
        while not self._stopped.wait(1.0):
            now = time.time()
            for key, rec in self._coord.status().items():
                seen = rec["last_seen"]
                if rec["state"] in TERMINAL_STATES or seen is None or "." in key.rsplit("/", 1)[-1]:
                    continue
                if now - seen > 10.0:
                    self._coord.node_finished(
                        key, False, None, None, f"stopped answering for {now - seen:.0f} s"
                    )

    def stop(self, grace: float) -> None:
        self._stopped.set()
        self._coord.wait_ended(grace)
        for sig in ("TERM", "KILL"):
            self._signal_all(sig)
            if sig == "TERM":
                self._coord.wait_ended(1.0)
        session = f"tlaunch-{self._run_id}"
        run_dir = f"{_RUNS}/{self._run_id}"

        def clean(host: str) -> None:
            conn = self._conns[host]
            conn.run(["tmux", "kill-session", "-t", f"={session}"], check=False)
            conn.run(["rm", "-f", f"{run_dir}/bundle.pkl"], check=False)

        _pmap(clean, list(self._conns))
        for conn in self._conns.values():
            conn.close()

    def _signal_all(self, sig: str) -> None:
        groups: dict[str, list[str]] = {}
        for rec in self._coord.status().values():
            if rec["pgid"] and rec["host"] in self._conns:
                groups.setdefault(rec["host"], []).append(f"-{rec['pgid']}")

        def kill(host: str) -> None:
            self._conns[host].run(["kill", f"-{sig}", "--", *groups[host]], check=False)

        _pmap(kill, list(groups))


def _preflight(conns: dict[str, Connection], python: str, env: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Check every host; returns each host's address as the launcher reaches it."""
    want = f"{sys.version_info[0]}.{sys.version_info[1]} {tlaunch.__version__}"
    probe = "import sys, tlaunch; print('%d.%d' % sys.version_info[:2], tlaunch.__version__)"

    def check(host: str) -> tuple[str, str]:
        conn = conns[host]
        where = conn.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.split()
        got = conn.run(["env", *(f"{k}={v}" for k, v in env.items()), python, "-c", probe], check=False)
        problems = []
        if got.exit_status != 0:
            tail = (got.stderr.strip().splitlines() or ["?"])[-1]
            problems.append(
                f"{python} cannot import tlaunch ({tail}); install tlaunch {tlaunch.__version__} there"
            )
        elif got.stdout.strip() != want:
            problems.append(
                f"has Python/tlaunch {got.stdout.strip()!r}, the launcher {want!r}; cloudpickle needs the "
                "same Python minor version and tlaunch version on every host"
            )
        if conn.run(["tmux", "-V"], check=False).exit_status != 0:
            problems.append("tmux is missing (apt-get install tmux)")
        if problems:
            raise SSHError(host, "; ".join(problems))
        return where[0], where[2]

    results = _pmap(check, list(conns))
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
    ssh_config: str | None = None,
    accept_unknown_hosts: bool = False,
    python: str | None = None,
) -> Run:
    """Launch ``plan`` on its hosts over SSH; see :func:`tlaunch.launch`."""
    from tlaunch import context
    from tlaunch.launcher import Run, runs_dir

    if terminal not in (None, "ssh_tmux_session"):
        raise LaunchError(f"terminal {terminal!r} is not available over SSH; use 'ssh_tmux_session'")
    local = [n.key for n in plan.nodes if n.host is None]
    if local:
        raise LaunchError(f"node {local[0]!r} has no host; over SSH every node needs .to_host(...)")
    python = python or sys.executable
    nodes = {n.key or "": n for n in program.get_all_nodes()}
    mods = _by_value_modules(list(nodes.values()))
    for mod in mods:
        cloudpickle.register_pickle_by_value(mod)
    try:
        pickled = {key: pickle_node(node) for key, node in nodes.items()}
    finally:
        for mod in mods:
            cloudpickle.unregister_pickle_by_value(mod)
    hosts = list(dict.fromkeys(str(n.host) for n in plan.nodes))
    conns = connect_all(hosts, ssh_config=ssh_config, accept_unknown_hosts=accept_unknown_hosts)
    server: RPCServer | None = None
    node_env = {"PYTHONUNBUFFERED": "1", **(env or {})}
    if "PYTHONPATH" in os.environ:
        node_env.setdefault("PYTHONPATH", os.environ["PYTHONPATH"])
    try:
        where = _preflight(conns, python, node_env)
        keys = RunKeys.generate()
        coordinator = Coordinator(plan)
        launcher_ip = next(iter(where.values()))[0]
        server = RPCServer(coordinator, keys, bind_host="0.0.0.0", advertise_host=launcher_ip)
        bundles = {}
        for host in hosts:
            config = RuntimeConfig(
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
            mine = {k: v for k, v in pickled.items() if str(plan.node(k).host) == host}
            bundles[host] = pickle.dumps(
                Bundle(config, server.address, mine), protocol=pickle.HIGHEST_PROTOCOL
            )
        backend = SSHBackend(coordinator, conns, bundles, python, node_env)
        launcher_config = RuntimeConfig(plan.run_id, plan.program_name, keys, resolve_timeout=resolve_timeout)
        launcher_runtime = NodeRuntime(launcher_config, coordinator, None)
        launcher_runtime.start_watcher()
        backend.launch(plan)
    except BaseException:
        if server is not None:
            server.close()
        for conn in conns.values():
            conn.close()
        raise
    run_dir = os.path.join(runs_dir(), plan.run_id)
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    os.chmod(run_dir, 0o700)
    record = RunRecord(
        plan.run_id,
        plan.program_name,
        "ssh",
        server.address,
        os.getpid(),
        hosts=hosts,
        ssh_config=ssh_config,
        log_dir=f"~/{_RUNS}/{plan.run_id}/logs",
    )
    write_record(run_dir, record, keys)
    context.install(launcher_runtime)
    run = Run(plan, coordinator, backend, run_dir, launcher_runtime, server, stop_grace, record=record)
    if wait:
        try:
            run.wait()
        except BaseException:
            run.stop()
            raise
    return run
