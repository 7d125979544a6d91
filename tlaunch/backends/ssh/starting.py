"""Each host's files and start, for :class:`tlaunch.backends.ssh.backend.SSHBackend`.

A host's files (its nodes' files, the head's on the head's host, what every host
gets: :mod:`tlaunch.backends.ssh.shipping`) are unpacked by its preflight shell as
soon as it passed its checks (:meth:`HostStarts.unpack`), while slower hosts are
still connected and checked: the launcher and the hosts wait on handshakes then,
with CPU to spare. The shell removes them unless the launch goes on (its scratch
path, :func:`tlaunch.ssh.held.run_held`): another host failed, the launch was
interrupted, or the launcher's connection dropped. Nothing runs before every host
passed. Then :meth:`HostStarts.start` opens the host's tmux windows in that shell
(a host whose shell could not unpack gets its files and its start in one exec).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping

from tlaunch.backends.base import RunSpec
from tlaunch.backends.ssh.hostside import run_dir_of
from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.backends.ssh.preflight import HostFacts
from tlaunch.backends.ssh.shipping import Shipment
from tlaunch.backends.tmux import home_window, open_windows, session_of, window_command
from tlaunch.errors import CommandError
from tlaunch.plan import log_name
from tlaunch.runtime.head import WAKE
from tlaunch.ssh import Connection, Held

__all__ = ["HostStarts"]


class HostStarts:
    """What each host of one run gets and how it starts (see the module docstring).

    Args:
        run: the run.
        head: the head's host.
        opts: the launch's SSH options.
        cmd_env: the environment on the windows' command lines.
        shipment: what every host gets.
        held: each host's preflight shell, by host (it unpacks and starts).
    """

    def __init__(
        self,
        run: RunSpec,
        head: str,
        opts: SSHOptions,
        cmd_env: Mapping[str, str],
        shipment: Shipment,
        held: dict[str, Held],
    ) -> None:
        self.run, self.head, self.opts, self.cmd_env = run, head, opts, cmd_env
        self.shipment, self.held = shipment, held
        self.run_dir = run_dir_of(run.plan.run_id)
        self.mine: dict[str, list[tuple[int, str]]] = {}
        """Each host's nodes (index, key)."""
        for i, node in enumerate(run.plan.nodes):
            self.mine.setdefault(str(node.host), []).append((i, node.key))
        self.unpacked: dict[str, int] = {}
        """The hosts whose files are unpacked, with the bytes sent."""

    def files(self, host: str, facts: HostFacts) -> list[tuple[str, bytes]]:
        """``host``'s own files: one a node (its supervisor reads it), the head's on its host, and
        each node's log, empty (made with the rest as the host passed preflight, not by its log
        tail as the launch goes on)."""
        run, shipment, mine, keep = self.run, self.shipment, self.mine.get(host, []), self.opts.keep_bundles
        buffers = shipment.buffer_files(run, mine)
        config = run.config(host, bind_host="0.0.0.0", advertise_host=facts.address)
        files: list[tuple[str, bytes]] = []
        for i, key in mine:
            spec = run.node_file(key, config, f"{self.run_dir}/logs/{log_name(key)}", keep=keep)
            node_file = shipment.node_file(spec, i, buffers[key], alone=len(mine) == 1)
            files.append((f"{i}.node", pickle.dumps(node_file)))
            files.append((f"logs/{log_name(key)}", b""))
        if host == self.head:
            head = run.head_file(facts.address, self.opts.heartbeat_timeout, keep=keep)
            files.append(("head.pkl", pickle.dumps(head)))
        return files

    def archive(self, host: str, facts: HostFacts) -> bytes:
        """What ``host`` unpacks: what every host gets and its own files (:meth:`Shipment.archive`)."""
        markers = [i for i, _ in self.mine.get(host, [])]
        return self.shipment.archive(self.files(host, facts), markers, [WAKE] if host == self.head else [])

    def tmux(self, host: str, facts: HostFacts, addr: str | None) -> list[str]:
        """The command that opens ``host``'s windows: each node's supervisor, and on the head's host
        the head first. A supervisor is given the head's address, ``addr``, or (on the head's host,
        started with the head) the file the head writes it to."""
        python, direct = self.opts.python_for(host), facts.tmux >= (3, 2)
        coordinator = addr if addr is not None else f"{self.run_dir}/coordinator.addr"
        windows: list[tuple[str, str | list[str]]] = []
        for i, key in self.mine.get(host, []):
            argv = [python, "-m", "tlaunch.runtime.supervisor", f"{self.run_dir}/{i}.node", coordinator]
            windows.append((key, home_window(argv, self.cmd_env, direct)))
        if host == self.head:
            argv = [python, "-m", "tlaunch.runtime.head", f"{self.run_dir}/head.pkl"]
            log = f"{self.run_dir}/logs/coordinator.log"
            windows.insert(0, ("coordinator", window_command(argv, env=self.cmd_env, log=log)))
        if not windows:
            return ["true"]
        return open_windows(session_of(self.run.plan.run_id), windows, new_session=True)

    def unpack(self, host: str, facts: HostFacts) -> None:
        """Send ``host``'s files to its preflight shell to unpack, as soon as it passed its checks
        (not waited for: :meth:`start` is, so that the last host checked does not hold the
        others' start back); where the shell cannot (a ``head`` that does not count),
        :meth:`start` sends them."""
        held = self.held.get(host)
        argv = ["sh", "-c", self.shipment.unpack(), "sh"]
        if held is None or not held.can_run(argv):
            return
        archive = self.archive(host, facts)
        held.send(argv, archive)
        self.unpacked[host] = len(archive)

    def start(self, conn: Connection, facts: HostFacts, addr: str | None) -> int:
        """Open the windows of ``conn``'s host, its shared values sent first (and its files, where
        :meth:`unpack` could not); from now on its shell keeps its files.

        Returns:
            The bytes sent.
        """
        host = conn.host
        held = self.held.get(host)
        if host in self.unpacked:  # sent as it passed preflight: unpacked by now, or soon
            assert held is not None
            status, said = held.finish()
            if status != 0:
                raise CommandError(host, ["sh", "-c", self.shipment.unpack(), "sh"], status, "", said)
        sent, steps = self.shipment.ship(conn, self.run, self.mine.get(host, []))
        tmux = self.tmux(host, facts, addr)
        if host not in self.unpacked:  # one exec (or the shell's run): unpack, then start
            archive = self.archive(host, facts)
            script = " && ".join([self.shipment.unpack(), *steps, 'exec "$@"'])
            argv = ["sh", "-c", script, "sh", *tmux]
            if held is not None and held.can_run(argv):
                self._run(held, argv, archive)
            else:
                conn.run(argv, stdin=archive)
            return sent + len(archive)
        assert held is not None
        argv = ["sh", "-c", " && ".join([*steps, 'exec "$@"']), "sh", *tmux] if steps else tmux
        if held.can_run(argv, stdin=False):
            self._run(held, argv)
        else:  # an argument with a newline: an exec of its own
            held.run(["true"], keep_scratch=True)
            conn.run(argv)
        return sent + self.unpacked[host]

    @staticmethod
    def _run(held: Held, argv: list[str], stdin: bytes = b"") -> None:
        """Run the start ``argv`` in ``held``, which keeps its files from now on."""
        status, said = held.run(argv, stdin, keep_scratch=True)
        if status != 0:
            raise CommandError(held.host, argv, status, "", said)
