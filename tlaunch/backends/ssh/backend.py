"""SSH backend: every node in a tmux window on the host its ``to_host()`` names.

One paramiko connection per host (opened in parallel, reused for everything):

1. ``prepare``: connect, then **preflight** every host in parallel: host key,
   auth, the ``setup`` commands, Python minor version equal to the launcher's,
   tlaunch importable at the same version, tmux, a writable run directory.
   Every problem of every host is reported in one error; nothing starts. A host
   that passed gets its files at once, while slower hosts are still checked
   (:mod:`tlaunch.backends.ssh.starting`), over its preflight shell's stdin into
   ``~/.tlaunch/runs/<run-id>/`` (0700): the working directory (if any: its
   ignore files honoured), the launcher's own modules, and one file per node
   (mode 0600; the node, the run's keys, its environment), which its supervisor
   deletes as it reads it. That shell removes them unless the launch goes on.
2. ``start``: each large value the host's nodes share goes once (over SFTP,
   :mod:`tlaunch.backends.ssh.shipping`; nothing with ``working_dir=False``).
   The **head** (the run's coordinator) starts in window
   ``coordinator`` of the tmux session ``tlaunch-<run-id>`` on the head host,
   in the same tmux command as that host's supervisors, and the launcher waits
   for its address before it starts the other hosts' supervisors, which get it
   on their command line and connect once up. Node output streams back live with
   a ``[host label/i]`` prefix; the launcher renews its lease with the head,
   which stops the run if the lease lapses (no orphans).
3. ``stop``: the supervisors end their nodes (grace, SIGTERM, SIGKILL); then
   every host is checked, anything left is killed, the tmux sessions go. Logs
   stay. ``detach`` leaves the run to its head.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, ClassVar

from tlaunch.backends.base import BackendOptions, Placement, RunSpec
from tlaunch.backends.handle import RunHandle
from tlaunch.backends.ssh.attached import SSHRun
from tlaunch.backends.ssh.hostside import (
    clean_host,
    head_address,
    run_dir_of,
)
from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.backends.ssh.preflight import HostFacts, connect_and_check
from tlaunch.backends.ssh.shipping import Shipment
from tlaunch.backends.ssh.starting import HostStarts
from tlaunch.backends.ssh.streams import LogStreams
from tlaunch.backends.tmux import session_of
from tlaunch.backends.traits import BackendTraits
from tlaunch.errors import LaunchError, StopError
from tlaunch.plan import LaunchPlan
from tlaunch.procs import MARKER, want_descriptors
from tlaunch.rpc.security import RunKeys
from tlaunch.runtime.records import RunRecord
from tlaunch.runtime.remote import RemoteCoordinator
from tlaunch.runtime.states import TERMINAL_STATES
from tlaunch.ssh import Connection, Held, config_path, connect_all, let_go_all, pmap, raise_for_hosts
from tlaunch.ssh.tail import RemoteTail

__all__ = ["SSHBackend", "attach_ssh"]

log = logging.getLogger(__name__)


class SSHBackend(BackendTraits):
    """The hosts of one SSH run: start, stream, stop (see the module docstring)."""

    name: ClassVar[str] = "ssh"
    terminals: ClassVar[tuple[str, ...]] = ("ssh_tmux_session", "current_terminal", "output_to_files")
    placement: ClassVar[Placement] = "hosts"
    can_detach: ClassVar[bool] = True
    shares_values: ClassVar[bool] = True
    Options: ClassVar[type[BackendOptions]] = SSHOptions

    @classmethod
    def attach(cls, run_dir: str, record: RunRecord) -> RunHandle:
        """An SSH run found again from its record: its head's coordinator, its hosts' logs."""
        return SSHRun(run_dir, record, reattach=attach_ssh)

    def __init__(self, plan: LaunchPlan, terminal: str, options: SSHOptions | None = None) -> None:
        if terminal not in self.terminals:
            raise LaunchError(
                f"terminal {terminal!r} is not available over SSH; use one of {list(self.terminals)}"
            )
        local = [n.key for n in plan.nodes if n.host is None]
        if local:
            raise LaunchError(f"node {local[0]!r} has no host; over SSH every node needs .to_host(...)")
        self.opts = options or SSHOptions()
        self.run_id = plan.run_id
        node_hosts = list(dict.fromkeys(str(n.host) for n in plan.nodes))
        self.head = self.opts.head_host or (node_hosts[0] if node_hosts else "")
        self.hosts = list(dict.fromkeys([self.head, *node_hosts]))
        self.conns: dict[str, Connection] = {}
        self._held: dict[str, Held] = {}  # each host's preflight shell, waiting to become its log tail
        self.coord: RemoteCoordinator | None = None
        self.head_pid: int | None = None
        self.keep_bundles = self.opts.keep_bundles
        self.streams = LogStreams(self.run_id)
        self.exceptions: dict[str, BaseException] = {}
        self._where: dict[str, HostFacts] = {}
        self._starts: HostStarts | None = None  # each host's files and start, once prepared
        self._cmd_env: dict[str, str] = {}
        self._stopping = False  # a stop is under way
        self._started = False  # shipping began: something may run on the hosts
        self._launched = False  # start() returned: the run is the launcher's to stop
        self._closed = False
        self._lock = threading.Lock()

    @property
    def record(self) -> dict[str, Any]:
        """Where ``tlaunch ps/logs/stop`` find this run again."""
        return {
            "hosts": self.hosts,
            "ssh_config": config_path(self.opts.ssh_config),  # the file used, whatever named it
            "log_dir": f"~/{run_dir_of(self.run_id)}/logs",
            "head": self.head,
            "head_pid": self.head_pid,
            "keep_bundles": self.keep_bundles,
        }

    # -- prepare --------------------------------------------------------
    def prepare(self, run: RunSpec) -> None:
        """Pack the working dir, connect to every host, preflight them all."""
        opts = self.opts
        # Only PYTHONPATH goes on a command line (it is no secret); the rest travels in 0600 files.
        self._cmd_env = {"PYTHONUNBUFFERED": "1", MARKER: self.run_id}
        pythonpath = run.env.get("PYTHONPATH") or os.environ.get("PYTHONPATH")
        if pythonpath:
            self._cmd_env["PYTHONPATH"] = pythonpath
        run_dir = run_dir_of(self.run_id)
        shipment = Shipment.make(opts, run_dir)
        for note in shipment.notes:
            run.progress.note(note)
        self._starts = starts = HostStarts(run, self.head, opts, self._cmd_env, shipment, self._held)
        want_descriptors(4 * len(self.hosts) + 1024)  # an SSH socket a host, and the nodes' TLS ones
        # Each host's files are unpacked as soon as it passed its checks, while other hosts are
        # still checked; its shell removes them unless the launch goes on (tlaunch.backends.ssh.
        # starting). Nothing runs before every host passed.
        self.conns, self._where = connect_and_check(
            self.hosts,
            opts,
            self._cmd_env,
            run.progress,
            self._held,
            shipment.check_paths,
            scratch=run_dir,
            then=lambda conn, facts: starts.unpack(conn.host, facts),
        )

    # -- start ----------------------------------------------------------
    def start(self, run: RunSpec) -> RemoteCoordinator:
        """Ship and start the head and every supervisor; stream their output; hold the lease."""
        self._started = True
        session = session_of(self.run_id)
        run_dir = run_dir_of(self.run_id)
        tails: dict[str, RemoteTail] = {}

        starts = self._starts
        assert starts is not None, "start() before prepare()"

        def ship(host: str, addr: str | None) -> int:
            sent = starts.start(self.conns[host], self._where[host], addr)
            tick()
            if host != self.head:  # the head's host waits for the head's address first
                self._follow(run, host, tails)
            return sent

        with run.progress.phase("ship", len(self.hosts)) as tick:
            first = pmap(lambda h: ship(h, None), [self.head], self.conns)
            raise_for_hosts(first, "shipping and starting")
            # The head starts before the other hosts' nodes: their supervisors get its address
            # on their command line and connect as soon as they are up (no step of the launch
            # writes it to them, nor do they look for it), and it starts on a machine that its
            # host's nodes alone share. It holds the launcher's lease from its first second,
            # however long the other hosts take (hundreds of them).
            coord, addr = self._hold_head(run, run_dir, session)
            self._follow(run, self.head, tails)
            shipped = pmap(lambda h: ship(h, addr), self.hosts[1:], self.conns)
            raise_for_hosts(shipped, "shipping and starting")
        most = max((n for n in [*first.values(), *shipped.values()] if isinstance(n, int)), default=0)
        run.progress.times["ship_mib"] = most / 2**20  # the most any host got (a measure, not seconds)
        raise_for_hosts(pmap(lambda h: tails[h].check(), list(tails), self.conns), "following the logs")
        # Leased before the launch returns (answered by now, but for a head slower than every
        # host's start): a launcher killed from then on is given up on after coordinator_timeout,
        # not after the start's allowance (minutes).
        coord.wait_first_lease(10.0)
        self._launched = True
        return coord

    def _follow(self, run: RunSpec, host: str, tails: dict[str, RemoteTail]) -> None:
        """Stream the logs of ``host``'s nodes when the launcher shows them: its preflight shell
        becomes the tail where it waits (a packet, no exec; the host's answer is awaited with the
        others', in ``tails``), else an exec; else that shell ends."""
        conn, sink, held = self.conns[host], run.sink, self._held.pop(host, None)
        tail = None
        if sink is not None:
            keys = [key for _, key in self._starts.mine.get(host, [])] if self._starts else []
            tail = self.streams.follow(conn, keys, sink, held=held, wait=held is None)
        if tail is None:
            if held is not None:
                held.close()
        elif held is not None:
            tails[host] = tail

    def _hold_head(self, run: RunSpec, run_dir: str, session: str) -> tuple[RemoteCoordinator, str]:
        """Wait for the head's address (written once it serves), connect, and begin renewing the lease.

        Returns:
            The link to the head, and its address (``host:port``, for the other hosts' supervisors).
        """
        t_head = time.perf_counter()
        addr = head_address(self.conns[self.head], run_dir, session, self._held.get(self.head))
        run.progress.times["head"] = time.perf_counter() - t_head  # its ship's end to its address
        info = json.loads(addr)
        self.head_pid = int(info["pid"])
        self.coord = coord = RemoteCoordinator.at(
            run.keys, self.head, str(info["address"]), run.settings.coordinator_timeout, 10.0, 30.0
        )
        # Leased before anything else (in the lease's thread, while the other hosts start): from
        # then on a launcher that dies is given up on after coordinator_timeout (until its first
        # lease the head gives it the start time).
        coord.start_lease()
        return coord, str(info["address"])

    # -- detach and stop ------------------------------------------------
    def detach(self) -> None:
        """Leave the run to its head: stop the lease and the streams, close the connections."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        let_go_all(self._held)
        if self.coord is not None:
            self.coord.detach()
            self.coord.close()
        self.streams.stop()
        for conn in self.conns.values():
            conn.close()

    def stop(self, grace: float) -> None:
        """Stop the run on every host and confirm that nothing of it is left.

        After a launch that did not finish, everything it made goes, run
        directories included. Called again while a stop is under way (it was
        interrupted: a second Ctrl-C), or with ``grace`` 0, it kills at once.

        Raises:
            StopError: processes of the run are still alive on some host.
        """
        with self._lock:
            if self._closed and not self._stopping:
                return
            at_once = self._stopping or grace <= 0
            self._closed = self._stopping = True
        let_go_all(self._held)  # a launch cut short between preflight and start
        if not self._started:  # connected and checked at most: nothing runs anywhere
            for conn in self.conns.values():
                conn.close()
            self._stopping = False
            return
        coord = self.coord
        pids: dict[str, list[str]] = {}
        if coord is not None:
            if not at_once:
                coord.stop("the run is being torn down" if self._launched else "the launch was aborted")
                if self._launched:
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
        left = self.clean(pids, remove_all=not self._launched, at_once=at_once)
        if coord is not None and not left:
            coord.torn_down()  # the final view: no node of it is up any more
        self._stopping = False
        if left:
            raise StopError(self.run_id, {h: said.partition(":")[2].split() for h, said in left.items()})

    def clean(
        self, pids: dict[str, list[str]] | None = None, remove_all: bool = False, at_once: bool = False
    ) -> dict[str, str]:
        """Kill whatever of the run is left on each host that answers.

        Returns:
            The hosts where processes of the run are still alive, with the
            kill script's ``left: PIDS`` answer.
        """
        pids = pids or {}

        def clean(host: str) -> str:
            head_pid = self.head_pid if host == self.head and not at_once else None  # let it write its end
            return clean_host(
                self.conns[host],
                self.run_id,
                pids.get(host, []),
                head_pid,
                remove_all,
                self.keep_bundles,
                drain=0.0 if at_once else 0.3,
                tail=self.streams.of(host),
            )

        # One command a host, its log tail's last (else an exec); a host that does not answer
        # within 3 s is skipped, not waited for. It also ended the host's log tail, so the
        # streams only close their channels here.
        results = pmap(clean, list(self.conns))
        self.streams.stop(reachable=set(), drain=0.0)
        left = {h: r for h, r in results.items() if isinstance(r, str) and r.startswith("left:")}
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


def attach_ssh(run_dir: str, record: RunRecord, keys: RunKeys) -> SSHBackend:
    """The backend of a running SSH run found through its record (``tlaunch stop``)."""
    head = record.head or record.hosts[0]
    options = SSHOptions(ssh_config=record.ssh_config, head_host=head, keep_bundles=record.keep_bundles)
    backend = SSHBackend(LaunchPlan(record.run_id, record.program, ()), "output_to_files", options)
    backend.hosts = list(record.hosts)
    backend.conns = connect_all(record.hosts, ssh_config=record.ssh_config)
    backend.coord = RemoteCoordinator.at(keys, head, record.coordinator, 10.0, 5.0, 10.0)
    backend.head_pid = record.head_pid
    backend._started = backend._launched = True
    return backend
