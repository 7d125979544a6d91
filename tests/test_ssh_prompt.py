"""SSH connections' TCP sockets: no round trip waits on Nagle's algorithm or a delayed ack."""

from __future__ import annotations

import socket
import statistics
import threading
import time

import pytest

from tlaunch.ssh import connect_all
from tlaunch.ssh.prompt import PromptSocket, prompt_socket
from tlaunch.testing.hosts import SSHTestHosts


def _round_trips(prompt: bool, rounds: int = 8) -> list[float]:
    """Seconds each of ``rounds`` requests took to be answered by a server that, as sshd does
    outside a terminal session, answers in two writes with Nagle's algorithm on."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if prompt:
            client = prompt_socket(client)

        def answer() -> None:
            while server.recv(16):
                server.send(b"a" * 10)
                server.send(b"b" * 10)  # held back until the client acknowledges the first

        answering = threading.Thread(target=answer, daemon=True)
        answering.start()
        took = []
        try:
            for _ in range(rounds):
                t0 = time.perf_counter()
                client.sendall(b"?")
                got = b""
                while len(got) < 20:
                    got += client.recv(64)
                took.append(time.perf_counter() - t0)
        finally:
            client.close()  # its end: the answering thread's recv() returns b"" and the thread ends
            answering.join(10)  # before its socket closes: a recv() on a closed socket raises (EBADF)
            server.close()
        assert not answering.is_alive(), "the answering thread did not end"
        return took


@pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux's")
def test_a_prompt_socket_acknowledges_at_once_so_a_nagled_answer_is_not_held_back() -> None:
    plain = statistics.median(_round_trips(prompt=False)[1:])
    if plain < 0.02:
        pytest.skip(f"this kernel does not delay acknowledgements here ({plain * 1000:.1f} ms a round trip)")
    prompt = statistics.median(_round_trips(prompt=True)[1:])
    assert prompt < 0.01 < plain, (prompt, plain)  # ~0.02 ms against ~44 ms here


def test_prompt_socket_sends_without_delay_and_leaves_other_sockets_alone() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        raw = socket.create_connection(listener.getsockname(), timeout=7.0)
        sock = prompt_socket(raw)
        try:
            assert isinstance(sock, PromptSocket) and raw.fileno() == -1  # the descriptor moved
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            assert sock.gettimeout() == 7.0
        finally:
            sock.close()
    a, b = socket.socketpair()
    with a, b:
        assert prompt_socket(a) is a  # a Unix socket (a ProxyCommand's) is no TCP socket


@pytest.mark.ssh
def test_an_ssh_connection_runs_over_a_prompt_socket(ssh_hosts: SSHTestHosts) -> None:
    conn = connect_all(["th1"], ssh_config=ssh_hosts.ssh_config)["th1"]
    with conn:
        sock = conn.transport.sock
        assert isinstance(sock, PromptSocket)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert conn.run(["echo", "ok"]).stdout == "ok\n"
