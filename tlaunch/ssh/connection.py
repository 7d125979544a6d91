"""One SSH connection per host (paramiko), reused for commands and files.

* ``~/.ssh/config`` (or a given file, or ``$TLAUNCH_SSH_CONFIG``) is read as
  OpenSSH reads it (:mod:`tlaunch.ssh.config`: ``Include``, ``Match``,
  ProxyJump hops each verified like any host, ProxyCommand, HostKeyAlias...);
  the ssh-agent is used when no key is named (or IdentitiesOnly is off).
* Host keys are checked against known_hosts. An unknown key is refused, with the
  way to accept it, unless the caller opts in with ``accept_unknown_hosts``; a
  key that differs from known_hosts is always refused.
* Commands are argv lists, quoted once with :func:`shlex.join`.
* :func:`~tlaunch.ssh.fanout.connect_all` opens every host's connection in
  parallel and reports every failing host in one :class:`~tlaunch.errors.HostsError`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import paramiko

from tlaunch.errors import CommandError, SSHError
from tlaunch.ssh.config import SSHTarget, resolve_target
from tlaunch.ssh.failures import connect_error
from tlaunch.ssh.identities import identities_for
from tlaunch.ssh.interrupt import Interrupt, end_fed, feed, wait_channel
from tlaunch.ssh.known_hosts import KnownHosts
from tlaunch.ssh.prompt import prompt_socket

__all__ = ["Connection", "Result", "SSHTarget", "resolve_target"]

# paramiko logs every connect and SFTP session at INFO, which absl's INFO default would print.
logging.getLogger("paramiko").setLevel(logging.WARNING)


@dataclass(frozen=True)
class Result:
    """A finished remote command."""

    host: str
    argv: tuple[str, ...]
    exit_status: int
    stdout: str
    stderr: str


class Connection:
    """An open SSH connection to one host (through its ProxyJump hosts, if any)."""

    def __init__(
        self,
        target: SSHTarget,
        accept_unknown_hosts: bool = False,
        timeout: float = 10.0,
        known_hosts: KnownHosts | None = None,
    ) -> None:
        self.target = target
        self.host = target.name
        self._jump: Connection | None = None
        timeout = target.connect_timeout or timeout
        sock: Any = None
        self._proxy: paramiko.ProxyCommand | None = None
        if target.proxy_command is not None:
            try:
                sock = self._proxy = paramiko.ProxyCommand(target.proxy_command)
            except (paramiko.SSHException, OSError) as exc:
                raise SSHError(self.host, f"its ProxyCommand {target.proxy_command!r} failed: {exc}") from exc
        elif target.jump is not None:
            self._jump = Connection(target.jump, accept_unknown_hosts, timeout, known_hosts)
            try:
                sock = self._jump.transport.open_channel(
                    "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0), timeout=timeout
                )
            except (paramiko.SSHException, OSError) as exc:
                self._jump.close()
                raise SSHError(
                    self.host,
                    f"the jump host {target.jump.name} cannot reach {target.hostname}:{target.port}: {exc}",
                ) from exc
        client = paramiko.SSHClient()
        # With HostKeyAlias, the key is looked up under the alias (and no port), as OpenSSH does.
        key_name, key_port = (
            (target.host_key_alias, 22) if target.host_key_alias else (target.hostname, target.port)
        )
        accept = accept_unknown_hosts or target.accept_new_hosts
        if accept:  # a new key is added to the last file, saved whole as paramiko read it
            for path in target.known_hosts:
                if os.path.exists(path):
                    client.load_host_keys(path)
        else:  # only this host's keys, the files read once for all connections (known_hosts.py)
            name = key_name if key_port == 22 else f"[{key_name}]:{key_port}"
            (known_hosts or KnownHosts()).add_to(client, target.known_hosts, name)
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy() if accept else paramiko.RejectPolicy())
        if target.host_key_alias and sock is None:
            try:
                sock = socket.create_connection((target.hostname, target.port), timeout=timeout)
            except OSError as exc:
                raise connect_error(self.host, target, exc) from exc
        allow_agent = not (target.identities_only and target.key_filenames)
        first, files, look_for_keys = identities_for(target, allow_agent)
        try:
            client.connect(
                key_name,
                port=key_port,
                username=target.user,
                pkey=first,
                key_filename=files or None,
                look_for_keys=look_for_keys,
                allow_agent=allow_agent,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                sock=sock,
                transport_factory=_transport,
            )
        except BaseException as exc:
            transport_left = client.get_transport()
            client.close()
            if self._jump is not None:
                self._jump.close()
            self._close_proxy(transport_left)
            error = connect_error(self.host, target, exc)
            if error is exc:
                raise
            raise error from exc
        transport = client.get_transport()
        assert transport is not None
        alive = target.keepalive or KEEPALIVE
        transport.set_keepalive(alive)
        if alive < IDLE_WAKE and isinstance(transport.sock, socket.socket):
            transport.sock.settimeout(alive)  # paramiko sends a keepalive only when its thread wakes
        self._client = client
        self._transport = transport
        self._sftp: paramiko.SFTPClient | None = None
        self.interrupted = Interrupt()  # set: running commands stop at once (Ctrl-C)

    @property
    def transport(self) -> paramiko.Transport:
        """The open paramiko transport (for channels: port forwards, jumps)."""
        return self._transport

    def run(
        self,
        argv: list[str],
        check: bool = True,
        stdin: bytes | memoryview | None = None,
        timeout: float | None = None,
        pty: bool = False,
        interruptible: bool = True,
        start_timeout: float | None = None,
    ) -> Result:
        """Run ``argv`` on the host and wait for it.

        Args:
            argv: the command, quoted once here.
            check: raise :class:`CommandError` on a non-zero exit.
            stdin: bytes to feed it.
            timeout: seconds the whole command may take.
            pty: run it on a pseudo-terminal, so that it gets SIGHUP when the
                channel closes (long commands a Ctrl-C must not leave running);
                if it is cut short, its process group is also killed by pid.
            interruptible: stop when :attr:`interrupted` is set.
            start_timeout: seconds the host may take to open the command's channel
                (default: ``timeout``, or 30): a host whose link is down is
                given up on sooner than the command's own time.

        Raises:
            CommandError: ``check`` is true and the command exited non-zero.
            SSHError: the connection broke, ``timeout`` passed, or :attr:`interrupted` was set.
        """
        # On a pty the command leads its own session: its pid, printed first, names
        # the process group to kill should it be cut short.
        command = shlex.join(["sh", "-c", 'echo "$$"; exec "$@"', "sh", *argv] if pty else argv)
        sends_eof = stdin is not None or pty
        if not sends_eof:
            # Its input is the host's /dev/null, not the channel: no EOF to send after the exec.
            # A quick command's channel may be closing by then, and paramiko sends outside the
            # channel's lock: an EOF that reaches sshd after it freed the channel makes OpenSSH
            # drop the whole connection (paramiko#1705, #1115). `exec`: the login shell runs no
            # command with a redirection in its own place (bash forks for it): no process more.
            command = f"exec {command} </dev/null"
        if interruptible and self.interrupted.is_set():  # cut short before it starts: nothing runs
            raise SSHError(self.host, f"{argv!r} was interrupted")
        deadline = None if timeout is None else time.monotonic() + timeout
        out = bytearray()
        try:
            chan = self._transport.open_session(timeout=start_timeout or timeout or 30.0)
            if pty:
                chan.get_pty(width=200)
            chan.exec_command(command)
            if not feed(chan, stdin or b"", self.interrupted if interruptible else None):
                self._cut_short(chan, out, pty, stdin is not None)
                raise SSHError(self.host, f"{argv!r} was interrupted")
            if sends_eof:
                chan.shutdown_write()
            out, err = bytearray(), bytearray()
            while True:
                if chan.recv_ready():
                    out += chan.recv(1 << 16)
                elif chan.recv_stderr_ready():
                    err += chan.recv_stderr(1 << 16)
                elif (
                    chan.exit_status_ready()
                    and (chan.eof_received or chan.closed)
                    and not chan.recv_ready()
                    and not chan.recv_stderr_ready()
                ):
                    # The exit status may come before the last output (sshd sends it as its
                    # child exits): the output is whole only at the channel's EOF.
                    break
                elif why := wait_channel(chan, self.interrupted if interruptible else None, deadline):
                    self._cut_short(chan, out, pty, stdin is not None)
                    said = "was interrupted" if why == "interrupted" else f"did not finish within {timeout} s"
                    raise SSHError(self.host, f"{argv!r} {said}")
            status = chan.recv_exit_status()
            chan.close()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise SSHError(self.host, f"running {argv!r} failed: {exc or type(exc).__name__}") from exc
        stdout = out.decode("utf-8", "replace")
        if pty:
            stdout = stdout.partition("\n")[2]  # the pid line
        result = Result(self.host, tuple(argv), status, stdout, err.decode("utf-8", "replace"))
        if check and status != 0:
            raise CommandError(self.host, list(argv), status, result.stdout, result.stderr)
        return result

    def _cut_short(self, chan: paramiko.Channel, out: bytearray, pty: bool, fed: bool = False) -> None:
        """End a command cut short: close its channel (one ``fed`` on stdin gets its EOF and is
        waited for, :func:`~tlaunch.ssh.interrupt.end_fed`) and, on a pty, kill its process group.

        Its pid, its first line, names the group; where it has not come yet (a Ctrl-C right
        after the start), it is waited for (5 s at most): the channel's close hangs up the
        pty, and a command that ignores SIGHUP would live on.
        """
        if fed and not pty:
            end_fed(chan)  # what it writes ends before the cleanup that follows begins
        elif pty:
            until = time.monotonic() + 5.0
            with contextlib.suppress(paramiko.SSHException, OSError, EOFError):
                while b"\n" not in out and not chan.closed and time.monotonic() < until:
                    if chan.recv_ready():
                        out.extend(chan.recv(1 << 16))
                    elif chan.eof_received:
                        break
                    else:
                        wait_channel(chan, None, until)
        chan.close()
        self._kill_group(out, pty)

    def _kill_group(self, out: bytearray, pty: bool) -> None:
        """Kill the process group of a pty command cut short (its pid is its first line)."""
        first = bytes(out).partition(b"\n")[0].strip()
        if not pty or not first.isdigit():
            return
        with contextlib.suppress(SSHError):
            self.run(
                ["sh", "-c", f"kill -s TERM -- -{int(first)} 2>/dev/null; true"],  # dash: not `-TERM --`
                check=False,
                timeout=5.0,
                interruptible=False,
            )

    def stream(self, argv: list[str]) -> paramiko.Channel:
        """Start ``argv`` and return its channel, to read its output as it comes."""
        try:
            chan = self._transport.open_session(timeout=30.0)  # as run(): a busy host may take a while
            chan.set_combine_stderr(True)
            chan.exec_command(shlex.join(argv))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise SSHError(self.host, f"running {argv!r} failed: {exc or type(exc).__name__}") from exc
        return chan

    def write_file(self, path: str, data: bytes | memoryview, mode: int = 0o600) -> None:
        """Write ``data`` to ``path`` on the host atomically, with ``mode`` set before the rename.

        A relative ``path`` is relative to the remote home directory.
        """
        sftp = self._sftp_client()
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.part"
        try:
            with sftp.open(tmp, "wb") as f:
                f.set_pipelined(True)
                sftp.chmod(tmp, mode)
                f.write(data)
            sftp.posix_rename(tmp, path)
        except (OSError, paramiko.SSHException) as exc:
            with contextlib.suppress(OSError, paramiko.SSHException):
                sftp.remove(tmp)
            raise SSHError(self.host, f"writing {path} failed: {exc}") from exc

    def read_file(self, path: str) -> bytes:
        """The content of ``path`` on the host."""
        try:
            with self._sftp_client().open(path, "rb") as f:
                return bytes(f.read())
        except (OSError, paramiko.SSHException) as exc:
            raise SSHError(self.host, f"reading {path} failed: {exc}") from exc

    def _sftp_client(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            try:
                self._sftp = self._client.open_sftp()
            except (paramiko.SSHException, OSError) as exc:
                raise SSHError(
                    self.host, f"cannot open SFTP (is the sftp subsystem enabled?): {exc}"
                ) from exc
        return self._sftp

    def close(self) -> None:
        """Close the connection; idempotent."""
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        sock = self._transport.sock
        if isinstance(sock, socket.socket):  # wakes the transport's thread: it ends now, not at its timeout
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        elif self._proxy is not None:  # its reads spin on the pipe's end until their timeout: end them
            self._proxy.settimeout(0.05)
        self._client.close()
        if self._jump is not None:
            self._jump.close()
        self._close_proxy(self._transport)
        self.interrupted.close()

    def _close_proxy(self, transport: paramiko.Transport | None = None) -> None:
        """End the ProxyCommand, if any (paramiko's close only signals it): reap it, close its pipes.

        The pipes close only once the transport's thread, which reads them, has ended.
        """
        if self._proxy is None:
            return
        proxy, self._proxy = self._proxy, None
        with contextlib.suppress(OSError):
            proxy.close()
        if transport is not None and transport is not threading.current_thread():
            transport.join(5)
        process = proxy.process
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Connection({self.host!r})"


IDLE_WAKE = 30.0
"""Seconds a connection's paramiko thread sleeps when nothing comes (see :func:`_transport`)."""

KEEPALIVE = 30
"""Seconds of silence after which a connection sends a keepalive (without ``ServerAliveInterval``)."""


def _transport(sock: Any, **kwargs: Any) -> paramiko.Transport:
    """paramiko's transport over a prompt socket (:mod:`tlaunch.ssh.prompt`), proposing AES-GCM
    first, and waking every 30 s when idle.

    With AES-CTR, its default, each packet's HMAC is made by Python's ``hmac`` and
    compared by a Python loop; GCM's tag is checked in OpenSSL (an exec ~15 % less
    CPU, 1 MiB ~30 % less, here; OpenSSH has it since 6.2). Its thread reads with a
    0.1 s timeout only to notice a close and send keepalives: 0.36 ms of CPU a second
    per idle host, 0.05 ms with 1 s; an idle 64-host run's launcher took 3.0 ms a
    second in all with 5 s and keepalives every 15 s, 1.4 ms with both at 30 s. It
    wakes no later than a keepalive is due (``ServerAliveInterval``), and
    :meth:`Connection.close` wakes it at once.
    """
    if isinstance(sock, socket.socket):  # a channel of a jump host's, a ProxyCommand: not TCP here
        sock = prompt_socket(sock)
    transport = paramiko.Transport(sock, **kwargs)
    transport.sock.settimeout(IDLE_WAKE)
    options = transport.get_security_options()
    gcm = tuple(c for c in options.ciphers if c.endswith("-gcm@openssh.com"))
    options.ciphers = (*gcm, *(c for c in options.ciphers if c not in gcm))
    return transport
